"""Who may act on a copy, and who may receive one: the ownership rule and the consent rule.

Pure. `claim` is the one ownership rule (a grant-uid annotation, never a label alone; an
orphan of an earlier grant of the same name is adopted or left to the policy recorded on it),
`policy` the one revoke rule, `consent` the one rule of who may receive a copy (admin and
producer both). The planner, the writer and `explain` all ask these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

from projector.core.exports import Consented, Export, consented
from projector.core.model import (
    GRANT_LABEL,
    ON_REVOKE_ANNOTATION,
    SOURCE_ANNOTATION,
    Copy,
    Grant,
    Namespace,
    OnRevoke,
    OnSourceDeleted,
    Source,
)
from projector.core.plans import Reason, Snapshot, SourceState


class Claim(StrEnum):
    """Whose a copy is, as far as one grant name may act on it (see `claim`)."""

    OWN = "Own"
    """It carries this grant's uid."""
    ADOPT = "Adopt"
    """An earlier, deleted grant of this name left it, and it is the very copy this grant wants
    here (same source, same name, a namespace both consents grant): the grant takes it over."""
    ORPHAN = "Orphan"
    """An earlier, deleted grant of this name left it, and this grant would not write it here:
    it follows the policy recorded on it (`policy`), never this grant's."""
    JUNIOR = "Junior"
    """A younger grant that also wants this copy here holds it; the older grant wins."""
    FOREIGN = "Foreign"
    """Anything else, an unmarked Secret or ConfigMap included: never written, never deleted."""


def claim(snap: Snapshot, copy: Copy, ns: Namespace | None = None) -> Claim:
    """The one ownership rule: may the snapshot's grant name write or delete this copy?

    Ownership is the grant-uid annotation written by projector's field manager, never a label
    alone. `ns` (where the copy is) is needed to tell an orphan the grant adopts from one it
    leaves to its recorded policy, and to recognise a junior rival's copy; without it, an
    orphan is always `ORPHAN`.
    """
    uid = copy.grant_uid
    if not uid:
        return Claim.FOREIGN
    grant = snap.grant
    if grant is not None and uid == grant.uid:
        return Claim.OWN
    if uid not in snap.live_grant_uids and copy.labels.get(GRANT_LABEL) == snap.grant_name:
        adopt = (
            ns is not None
            and grant is not None
            and not grant.deleting
            and copy.key.name == grant.target_name
            and copy.key.kind is grant.kind
            and copy.annotations.get(SOURCE_ANNOTATION) == str(grant.source)
            and snap.source_state is SourceState.AVAILABLE
            and wants(grant, snap.source, ns, snap.exports_of(grant.source))
        )
        return Claim.ADOPT if adopt else Claim.ORPHAN
    if (
        grant is not None
        and ns is not None
        and any(
            r.uid == uid
            and r.seniority > grant.seniority
            and wants(r, snap.rival_sources.get(r.source), ns, snap.exports_of(r.source))
            for r in snap.rivals
        )
    ):
        return Claim.JUNIOR
    return Claim.FOREIGN


def may_write(snap: Snapshot, copy: Copy, ns: Namespace) -> bool:
    """May the snapshot's grant overwrite `copy`, found at a place where it wants its copy?

    Its own copy, a younger rival's, or an orphan it adopts: never an earlier grant's copy of
    something it was not asked to write here (e.g. one a deleted grant of that name retained).
    """
    return claim(snap, copy, ns) in (Claim.OWN, Claim.ADOPT, Claim.JUNIOR)


def policy(snap: Snapshot, copy: Copy, reason: Reason) -> OnRevoke | OnSourceDeleted:
    """The policy a copy this grant name holds falls under, once it is not wanted where it is.

    The live grant's own copies follow its policy: `onSourceDeleted` when the source is gone,
    `onRevoke` otherwise. Every other copy, an orphan of an earlier grant of this name or a
    copy of a grant being deleted, follows the `onRevoke` recorded on it: its grant is gone,
    and a new grant reusing the name inherits no right to delete what that one kept.
    """
    grant = snap.grant
    if grant is not None and not grant.deleting and copy.grant_uid == grant.uid:
        return grant.on_source_deleted if reason is Reason.SOURCE_MISSING else grant.on_revoke
    return _recorded_policy(copy)


class Consent(StrEnum):
    """Who refuses a copy of a grant in one namespace, if anyone (see `consent`)."""

    GRANTED = "Granted"
    """The admin's grant aims here and the producer exports here."""
    SOURCE_NAMESPACE = "SourceNamespace"
    """The source's own namespace: never a target, whatever lists, selectors or globs say."""
    NOT_TARGETED = "NotTargeted"
    """The admin's grant neither lists the namespace nor selects it."""
    NOT_EXPORTED = "NotExported"
    """Neither the export label nor any ProjectionExport: the producer has not opted in."""
    EXPORT_TO_MISMATCH = "ExportToMismatch"
    """The producer opted in, but neither export-to nor any export's `to` matches."""


def consent(
    grant: Grant,
    source: Source | None,
    namespace: str,
    labels: Mapping[str, str],
    exports: Sequence[Export] = (),
) -> Consent:
    """The one consent rule: may a copy of `grant` exist in `namespace` (with those labels)?

    Both the admin (the grant's list or selector) and the producer must agree, and the
    source's own namespace never qualifies. The producer agrees by the export label and its
    export-to, or by a ProjectionExport of the source whose `to` matches (`consented`).
    `source` is the grant's source as cached: a labelled one, or one an export names; None
    means the producer has not opted in.
    """
    return consent_scope(grant, source, namespace, labels, exports)[0]


def consent_scope(
    grant: Grant,
    source: Source | None,
    namespace: str,
    labels: Mapping[str, str],
    exports: Sequence[Export] = (),
) -> tuple[Consent, Consented | None]:
    """`consent`, and the producer's say where it is GRANTED (its keys, who said so).

    The planner reads both from one evaluation per namespace.
    """
    if namespace == grant.source.namespace:
        return Consent.SOURCE_NAMESPACE, None
    if not grant.targets(namespace, labels):
        return Consent.NOT_TARGETED, None
    if source is None or (not source.labelled and not exports):
        return Consent.NOT_EXPORTED, None
    said = consented(source, exports, namespace)
    if said is None:
        return Consent.EXPORT_TO_MISMATCH, None
    return Consent.GRANTED, said


def wants(
    grant: Grant, source: Source | None, ns: Namespace, exports: Sequence[Export] = ()
) -> bool:
    """Tell whether both the admin and the producer want a copy of `grant` in `ns`."""
    return consent(grant, source, ns.name, ns.labels, exports) is Consent.GRANTED


def _recorded_policy(copy: Copy) -> OnRevoke:
    """The revoke policy a copy was created under; Retain if unreadable (no delete on a guess)."""
    try:
        return OnRevoke(copy.annotations.get(ON_REVOKE_ANNOTATION, OnRevoke.RETAIN.value))
    except ValueError:
        return OnRevoke.RETAIN
