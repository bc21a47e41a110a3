"""The pure core: from a snapshot of the cluster to a plan of what to do in each namespace.

No I/O and no asyncio here: `plan()` is a function of immutable values, so every row of the
semantics table is decided in one place that unit tests can drive exhaustively.

Work is keyed by grant name, not by (grant, namespace): the copy's content and its hash are the
same in every namespace, so they are computed once per grant and each namespace then costs a
few dict lookups (see `benchmarks/`); the writes a plan yields run concurrently in the writer.
A grant name with no live grant behind it still gets a plan: it revokes what that name left.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from projector.model import (
    GRANT_LABEL,
    GRANT_METADATA_ANNOTATION,
    GRANT_UID_ANNOTATION,
    HASH_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ON_REVOKE_ANNOTATION,
    ON_SOURCE_DELETED_ANNOTATION,
    PREFIX,
    SOURCE_ANNOTATION,
    Copy,
    Grant,
    GrantRecord,
    Namespace,
    ObjectKey,
    OnRevoke,
    OnSourceDeleted,
    Source,
    content_hash,
)


class SourceState(StrEnum):
    """What we know of the grant's source Secret."""

    AVAILABLE = "Available"
    NOT_EXPORTED = "NotExported"
    """It exists but lacks the export label: the producer has not (or no longer) opted in."""
    MISSING = "SourceMissing"
    """The API said 404: authoritative evidence that the source is gone."""
    UNKNOWN = "Unknown"
    """A read failed: nothing may be deleted on this."""


class Action(StrEnum):
    """What the writer does in one namespace."""

    CREATE = "Create"
    UPDATE = "Update"
    REPLACE = "Replace"
    """Delete then create: the API forbids changing a Secret's type in place."""
    DELETE = "Delete"
    NOOP = "NoOp"
    """Nothing to write: in sync, retained, denied, conflicted or waiting."""


class WriteResult(StrEnum):
    """How one write ended (the `result` label of projector_writes_total)."""

    OK = "ok"
    ERROR = "error"
    CONFLICT = "conflict"
    SKIPPED = "skipped"
    """Not written and nothing to retry: the server said the namespace is gone or terminating."""


class Reason(StrEnum):
    """Why a namespace is in the state it is in; status and Events use these codes."""

    PROJECTED = "Projected"
    DENIED = "Denied"
    CONFLICT = "Conflict"
    GRANT_CONFLICT = "GrantConflict"
    SOURCE_NAMESPACE = "SourceNamespace"
    NAMESPACE_MISSING = "NamespaceMissing"
    TERMINATING = "NamespaceTerminating"
    SOURCE_MISSING = "SourceMissing"
    KEY_MISSING = "KeyMissing"
    SOURCE_UNKNOWN = "SourceUnknown"
    REVOKED = "Revoked"
    RETAINED = "Retained"
    COPY_DELETING = "CopyDeleting"
    WRITE_FAILED = "WriteFailed"


UNCOPYABLE_TYPES = frozenset(
    {"kubernetes.io/service-account-token", "bootstrap.kubernetes.io/token"}
)
"""Types the API server ties to their namespace; their copies are plain Opaque Secrets."""

CONFLICT_MESSAGE = "a Secret of that name exists and is not owned by this grant"
ORPHAN_MESSAGE = "an earlier grant of this name left a copy of another source here"
ORPHAN_DELETED = (
    "an earlier grant of this name left a copy of another source; deleted by its policy"
)

FAILURE_REASONS = frozenset(
    {
        Reason.CONFLICT,
        Reason.GRANT_CONFLICT,
        Reason.SOURCE_NAMESPACE,
        Reason.NAMESPACE_MISSING,
        Reason.KEY_MISSING,
        Reason.WRITE_FAILED,
    }
)
"""Reasons that an admin must act on; they are listed in the grant's status.failures (a listed
namespace that does not exist is most often a typo in the grant)."""


@dataclass(frozen=True, slots=True)
class Desired:
    """The copy a grant wants; identical in every namespace but for metadata.namespace."""

    name: str
    type: str
    data: Mapping[str, str] = field(repr=False)
    """The Secret's values: never in a log, an error message or a repr."""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    hash: str
    """Over everything written: the content-hash annotation."""
    core_hash: str
    """Over type, data and projector's own metadata: compared with a copy's observed hash."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    extra_annotations: Mapping[str, str] = field(default_factory=dict)

    def in_sync(self, copy: Copy) -> bool:
        """Tell whether a stored copy already holds exactly this content and our metadata."""
        if copy.observed_hash != self.core_hash:
            return False
        notes = copy.annotations
        if notes.get(HASH_ANNOTATION) != self.hash:
            return False
        if self.extra_labels:
            labels = copy.labels
            if any(labels.get(k) != v for k, v in self.extra_labels.items()):
                return False
        return not self.extra_annotations or all(
            notes.get(k) == v for k, v in self.extra_annotations.items()
        )

    def manifest(
        self,
        namespace: str,
        resource_version: str | None = None,
        keep: Copy | None = None,
        *,
        with_data: bool = True,
    ) -> dict[str, object]:
        """The Secret to send; with a resourceVersion, a PUT that fails if the copy moved on.

        Labels and annotations others added to `keep` (the stored copy) are carried over:
        a PUT must not erase what other tools wrote, only restore what is ours. Without data,
        for a writer that serializes the data once for every namespace.
        """
        labels, annotations = dict(self.labels), dict(self.annotations)
        if keep is not None:
            was = _grant_metadata(keep)
            labels = _foreign(keep.labels, was.get("labels", ())) | labels
            annotations = _foreign(keep.annotations, was.get("annotations", ())) | annotations
        meta: dict[str, object] = {
            "name": self.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        out: dict[str, object] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": self.type,
        }
        if with_data:
            out["data"] = dict(self.data)
        return out


def _foreign(metadata: Mapping[str, str], grants: Iterable[str]) -> dict[str, str]:
    """Keys other tools wrote: neither projector's own nor ones a grant wrote before."""
    skip = set(grants)
    return {k: v for k, v in metadata.items() if not k.startswith(PREFIX) and k not in skip}


def _grant_metadata(copy: Copy) -> dict[str, list[str]]:
    try:
        recorded = json.loads(copy.annotations.get(GRANT_METADATA_ANNOTATION, "{}"))
    except ValueError:
        return {}
    return recorded if isinstance(recorded, dict) else {}


@dataclass(frozen=True, slots=True)
class Step:
    """The decision for one namespace: an action, the reason behind it, and what it acts on."""

    namespace: str
    action: Action
    reason: Reason
    existing: Copy | None = None
    """The copy acted on; its uid and resourceVersion are the write's preconditions."""
    name: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything one reconcile of a grant name decided; the writer executes `writes`."""

    snapshot: Snapshot
    """What the decisions were made on; the writer asks `claim` of it for a copy it meets."""
    source_state: SourceState
    desired: Desired | None
    steps: tuple[Step, ...]
    matched: int
    """Namespaces the admin's grant aims at (the producer's opt-in not yet applied)."""

    @property
    def grant_name(self) -> str:
        """The work item: a grant name, whether or not a grant of that name exists."""
        return self.snapshot.grant_name

    @property
    def grant(self) -> Grant | None:
        """The live grant of that name, if any."""
        return self.snapshot.grant

    @property
    def writes(self) -> tuple[Step, ...]:
        """Steps that need the API."""
        return tuple(s for s in self.steps if s.action is not Action.NOOP)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one step once the writer ran it (NoOp steps pass through as they are)."""

    step: Step
    reason: Reason
    message: str = ""
    written: bool = False
    retry_after: float = 0.0
    """The server's Retry-After on a write that failed throttled: the next try waits as long."""

    @property
    def namespace(self) -> str:
        """The namespace the outcome is about."""
        return self.step.namespace


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state one reconcile reads, as values taken at one moment (`store.Store.snapshot`).

    Every mapping is the snapshot's own (the store hands out read-only proxies of fresh dicts
    or of dicts it never changes again), so a plan stays explainable after the cache moves on.
    """

    grant_name: str
    grant: Grant | None
    source: Source | None
    source_state: SourceState
    namespaces: Mapping[str, Namespace]
    """At least every existing namespace the grant targets (more is harmless)."""
    copies: Mapping[ObjectKey, Copy]
    """Every cached copy at the grant's target name, labelled with its name or owned by its uid."""
    live_grant_uids: AbstractSet[str]
    """Uids of every grant that exists: their copies are never orphans."""
    rivals: tuple[Grant, ...] = ()
    """Other live grants with the same target name; the older one wins a shared copy."""
    rival_sources: Mapping[ObjectKey, Source] = field(default_factory=dict)
    record: GrantRecord | None = None
    """The cached grant object behind `grant` (its stored status), or why it is invalid."""


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
    """Anything else, an unmarked Secret included: never written, never deleted."""


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
            and copy.annotations.get(SOURCE_ANNOTATION) == str(grant.source)
            and snap.source_state is SourceState.AVAILABLE
            and _wants(grant, snap.source, ns)
        )
        return Claim.ADOPT if adopt else Claim.ORPHAN
    if (
        grant is not None
        and ns is not None
        and any(
            r.uid == uid
            and r.seniority > grant.seniority
            and _wants(r, snap.rival_sources.get(r.source), ns)
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


def desired_copy(grant: Grant, source: Source) -> Desired | str:
    """Build the copy for a grant, or name the first key the source lacks."""
    if grant.keys is None:
        data = dict(source.data)
        type_ = source.type
    else:
        data = {}
        for k in grant.keys:
            if k.src not in source.data:
                return k.src
            data[k.dst] = source.data[k.src]
        whole = {k.src for k in grant.keys} == set(source.data) and all(
            k.src == k.dst for k in grant.keys
        )
        type_ = source.type if whole else "Opaque"
    if type_ in UNCOPYABLE_TYPES:
        type_ = "Opaque"
    ours = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, GRANT_LABEL: grant.name}
    our_notes = {
        GRANT_UID_ANNOTATION: grant.uid,
        SOURCE_ANNOTATION: str(source.key),
        ON_REVOKE_ANNOTATION: grant.on_revoke.value,
        ON_SOURCE_DELETED_ANNOTATION: grant.on_source_deleted.value,
    }
    # Reserved keys are refused by parse_grant; dropping them here keeps in_sync reachable.
    extra_labels = {k: v for k, v in grant.labels if not k.startswith(PREFIX)}
    extra_notes = {k: v for k, v in grant.annotations if not k.startswith(PREFIX)}
    if extra_labels or extra_notes:
        our_notes[GRANT_METADATA_ANNOTATION] = json.dumps(
            {"labels": sorted(extra_labels), "annotations": sorted(extra_notes)},
            separators=(",", ":"),
        )
    labels = extra_labels | ours
    annotations = extra_notes | our_notes
    digest = content_hash(type_, data, labels, annotations)
    core = content_hash(type_, data, ours, our_notes)
    annotations[HASH_ANNOTATION] = digest
    return Desired(
        grant.target_name, type_, data, labels, annotations, digest, core, extra_labels, extra_notes
    )


class Consent(StrEnum):
    """Who refuses a copy of a grant in one namespace, if anyone (see `consent`)."""

    GRANTED = "Granted"
    """The admin's grant aims here and the producer exports here."""
    SOURCE_NAMESPACE = "SourceNamespace"
    """The source's own namespace: never a target, whatever lists, selectors or globs say."""
    NOT_TARGETED = "NotTargeted"
    """The admin's grant neither lists the namespace nor selects it."""
    NOT_EXPORTED = "NotExported"
    """No source carries the export label: the producer has not opted in (or no longer)."""
    EXPORT_TO_MISMATCH = "ExportToMismatch"
    """The producer opted in, but no valid export-to entry matches (missing or empty: nobody)."""


def consent(
    grant: Grant, source: Source | None, namespace: str, labels: Mapping[str, str]
) -> Consent:
    """The one consent rule: may a copy of `grant` exist in `namespace` (with those labels)?

    Both the admin (the grant's list or selector) and the producer (the export label, then the
    export-to names and globs) must agree, and the source's own namespace never qualifies.
    `source` is the grant's source as cached, which only a Secret labelled
    `model.is_exported` ever is: None means the producer has not opted in.
    """
    if namespace == grant.source.namespace:
        return Consent.SOURCE_NAMESPACE
    if not grant.targets(namespace, labels):
        return Consent.NOT_TARGETED
    if source is None:
        return Consent.NOT_EXPORTED
    if not source.exports_to(namespace):
        return Consent.EXPORT_TO_MISMATCH
    return Consent.GRANTED


def _wants(grant: Grant, source: Source | None, ns: Namespace) -> bool:
    """Tell whether both the admin and the producer want a copy of `grant` in `ns`."""
    return consent(grant, source, ns.name, ns.labels) is Consent.GRANTED


def _senior_rival(snap: Snapshot, grant: Grant, ns: Namespace) -> Grant | None:
    """The oldest other grant that also wants this grant's copy in `ns`, if older than us."""
    best: Grant | None = None
    for rival in snap.rivals:
        if rival.seniority >= grant.seniority or rival.deleting:
            continue
        if _wants(rival, snap.rival_sources.get(rival.source), ns) and (
            best is None or rival.seniority < best.seniority
        ):
            best = rival
    return best


def _revoke(snap: Snapshot, copy: Copy, reason: Reason) -> Step:
    """Handle a copy that is no longer wanted where it is, by the policy it falls under."""
    if copy.deleting:
        return Step(copy.key.namespace, Action.NOOP, Reason.COPY_DELETING, copy, copy.key.name)
    if policy(snap, copy, reason).value == "Delete":
        return Step(copy.key.namespace, Action.DELETE, reason, copy, copy.key.name)
    return Step(copy.key.namespace, Action.NOOP, Reason.RETAINED, copy, copy.key.name)


def _withdraw(snap: Snapshot, ns: str, name: str, held: Copy | None, reason: Reason) -> Step:
    """A namespace the grant does not serve: what it holds there follows `policy`.

    Kept, the namespace still reports why it is not served (denied, source missing); an
    orphan deleted here is deleted because its own grant was revoked.
    """
    if held is not None:
        own = snap.grant is not None and held.grant_uid == snap.grant.uid
        step = _revoke(snap, held, reason if own else Reason.REVOKED)
        if step.action is Action.DELETE:
            return step
    return Step(ns, Action.NOOP, reason, held, name)


def _orphaned(snap: Snapshot, orphan: Copy, then: Step) -> Step:
    """An earlier grant's copy where this grant wants its own, by the policy recorded on it.

    Delete: it goes, replaced by this grant's copy when `then` (the step for a free place)
    creates one. Retain: it stays, a conflict the admin settles.
    """
    gone = _revoke(snap, orphan, Reason.REVOKED)
    if gone.reason is Reason.RETAINED:
        return Step(then.namespace, Action.NOOP, Reason.CONFLICT, orphan, then.name, ORPHAN_MESSAGE)
    if gone.action is Action.DELETE and then.action is Action.CREATE:
        return Step(
            then.namespace, Action.REPLACE, Reason.PROJECTED, orphan, then.name, ORPHAN_DELETED
        )
    return gone


def _recorded_policy(copy: Copy) -> OnRevoke:
    """The revoke policy a copy was created under; Retain if unreadable (no delete on a guess)."""
    try:
        return OnRevoke(copy.annotations.get(ON_REVOKE_ANNOTATION, OnRevoke.RETAIN.value))
    except ValueError:
        return OnRevoke.RETAIN


_NO_LABELS: Mapping[str, str] = MappingProxyType({})


def plan(snap: Snapshot) -> Plan:
    """Decide, for every namespace touched by a grant name, what to write and why."""
    grant = snap.grant
    # Copies this grant name may act on wherever they are: its own, and orphans of its name.
    held = {k: c for k, c in snap.copies.items() if claim(snap, c) is not Claim.FOREIGN}

    if grant is None or grant.deleting:
        gone = tuple(_revoke(snap, c, Reason.REVOKED) for c in held.values())
        return Plan(snap, snap.source_state, None, gone, 0)

    steps: list[Step] = []
    handled: set[ObjectKey] = set()
    desired: Desired | None = None
    missing_key = ""
    state = snap.source_state
    if state is SourceState.AVAILABLE and snap.source is None:
        state = SourceState.UNKNOWN  # an inconsistent snapshot is uncertainty, not absence
    source = snap.source if state is SourceState.AVAILABLE else None
    if source is not None:
        built = desired_copy(grant, source)
        if isinstance(built, Desired):
            desired = built
        else:
            missing_key = built

    lookup = snap.copies
    candidates = set(grant.namespaces)
    if grant.selector is not None:
        candidates.update(n for n, ns in snap.namespaces.items() if grant.targets(n, ns.labels))
    matched = 0
    target, all_namespaces, uid = grant.target_name, snap.namespaces, grant.uid
    for name in sorted(candidates):  # the hot loop: locals only, no work that can be hoisted
        key = ObjectKey(name, target)
        existing = lookup.get(key)
        mine = existing if existing is not None and key in held else None
        if mine is not None:
            handled.add(key)
        ns = all_namespaces.get(name)
        verdict = consent(grant, source, name, ns.labels if ns is not None else _NO_LABELS)
        if verdict is Consent.SOURCE_NAMESPACE:
            if name in grant.namespaces:
                steps.append(
                    Step(
                        name,
                        Action.NOOP,
                        Reason.SOURCE_NAMESPACE,
                        name=key.name,
                        message="the source's own namespace is never a target",
                    )
                )
            continue
        matched += 1
        if ns is None:
            steps.append(
                Step(
                    name,
                    Action.NOOP,
                    Reason.NAMESPACE_MISSING,
                    name=key.name,
                    message="the namespace does not exist; a copy follows when it is created",
                )
            )
            continue
        if ns.terminating:
            steps.append(Step(name, Action.NOOP, Reason.TERMINATING, existing, key.name))
            continue
        if state is SourceState.UNKNOWN:
            steps.append(Step(name, Action.NOOP, Reason.SOURCE_UNKNOWN, existing, key.name))
            continue
        if state is SourceState.MISSING:
            steps.append(_withdraw(snap, name, key.name, mine, Reason.SOURCE_MISSING))
            continue
        if verdict is not Consent.GRANTED:  # the producer's consent: the admin's is a candidate
            steps.append(_withdraw(snap, name, key.name, mine, Reason.DENIED))
            continue
        if mine is not None and mine.grant_uid != uid and claim(snap, mine, ns) is Claim.ORPHAN:
            steps.append(_orphaned(snap, mine, _serve(snap, desired, missing_key, ns, None)))
        else:
            steps.append(_serve(snap, desired, missing_key, ns, existing))

    # What the grant name holds where it no longer aims (untargeted namespace, renamed target).
    for key, copy in held.items():
        if key in handled:
            continue
        if state is SourceState.UNKNOWN:
            steps.append(Step(key.namespace, Action.NOOP, Reason.SOURCE_UNKNOWN, copy, key.name))
        else:
            steps.append(_revoke(snap, copy, Reason.REVOKED))
    return Plan(snap, state, desired, tuple(steps), matched)


def _serve(
    snap: Snapshot, desired: Desired | None, missing_key: str, ns: Namespace, existing: Copy | None
) -> Step:
    """A namespace both consents grant: converge, unless a key or the place is missing."""
    grant = snap.grant
    assert grant is not None, "only a live grant serves namespaces"
    if desired is None:
        return Step(
            ns.name,
            Action.NOOP,
            Reason.KEY_MISSING,
            existing,
            grant.target_name,
            message=f"source has no key {missing_key!r}; last copy kept",
        )
    rival = _senior_rival(snap, grant, ns) if snap.rivals else None
    if rival is not None:
        return Step(
            ns.name,
            Action.NOOP,
            Reason.GRANT_CONFLICT,
            existing,
            desired.name,
            message=f"older grant {rival.name} projects to the same Secret",
        )
    return _converge(snap, desired, ns, existing)


def _converge(snap: Snapshot, desired: Desired, ns: Namespace, existing: Copy | None) -> Step:
    """Bring the copy in one wanted namespace to the desired content, if `claim` says we may."""
    name = desired.name
    if existing is None:
        return Step(ns.name, Action.CREATE, Reason.PROJECTED, None, name)
    if not may_write(snap, existing, ns):
        return Step(ns.name, Action.NOOP, Reason.CONFLICT, existing, name, CONFLICT_MESSAGE)
    if existing.deleting:
        return Step(ns.name, Action.NOOP, Reason.COPY_DELETING, existing, name)
    in_sync = desired.in_sync(existing)
    if existing.type != desired.type or (existing.immutable and not in_sync):
        return Step(
            ns.name,
            Action.REPLACE,
            Reason.PROJECTED,
            existing,
            name,
            message=f"type {existing.type} -> {desired.type}"
            if existing.type != desired.type
            else "the copy was made immutable",
        )
    action = Action.NOOP if in_sync else Action.UPDATE
    return Step(ns.name, action, Reason.PROJECTED, existing, name)
