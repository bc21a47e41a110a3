"""The pure core: `desired_copy` and `plan`, one named case per situation of DESIGN §3.

Every case starts from the same world (grant `g` projects `src/hub` into `a` and `b`, the
producer exports to `*`) and changes only what it is about. Expected steps are keyed by
namespace, or by `namespace/name` for a Secret other than the grant's target name.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from projector.core.desired import Desired, desired_copy
from projector.core.exports import Export
from projector.core.model import (
    GRANT_LABEL,
    GRANT_METADATA_ANNOTATION,
    GRANT_UID_ANNOTATION,
    HASH_ANNOTATION,
    MANAGED_BY_LABEL,
    ON_REVOKE_ANNOTATION,
    ON_SOURCE_DELETED_ANNOTATION,
    SOURCE_ANNOTATION,
    Copy,
    Grant,
    LabelSelector,
    Namespace,
    ObjectKey,
    OnRevoke,
    OnSourceDeleted,
    Source,
    Uid,
    content_hash,
    own_metadata,
    parse_copy,
)
from projector.core.names import FIELD_MANAGER
from projector.core.plans import Action, Plan, Reason, Snapshot, SourceState, Step
from projector.core.reconcile import plan
from tests.unit.factories import (
    BY_HAND,
    SRC_NAME,
    SRC_NS,
    T0,
    T1,
    b64,
    copy_from,
    desired_of,
    foreign_secret,
    make_export,
    make_grant,
    make_ns,
    make_snapshot,
    make_source,
    managed_fields,
    namespaces,
    simulate,
    stored_manifest,
    summary,
)

A, R = Action, Reason
T_OLD = "2023-01-01T00:00:00Z"

CREATED = (A.CREATE, R.PROJECTED)
UPDATED = (A.UPDATE, R.PROJECTED)
IN_SYNC = (A.NOOP, R.PROJECTED)
REPLACED = (A.REPLACE, R.PROJECTED)
DENIED = (A.NOOP, R.DENIED)
DENIED_DELETED = (A.DELETE, R.DENIED)
REVOKED = (A.DELETE, R.REVOKED)
RETAINED = (A.NOOP, R.RETAINED)
CONFLICT = (A.NOOP, R.CONFLICT)
ORPHAN_CONFLICT = CONFLICT
GRANT_CONFLICT = (A.NOOP, R.GRANT_CONFLICT)
NS_MISSING = (A.NOOP, R.NAMESPACE_MISSING)
TERMINATING = (A.NOOP, R.TERMINATING)
SOURCE_NAMESPACE = (A.NOOP, R.SOURCE_NAMESPACE)
SOURCE_MISSING = (A.NOOP, R.SOURCE_MISSING)
SOURCE_MISSING_DELETED = (A.DELETE, R.SOURCE_MISSING)
SOURCE_UNKNOWN = (A.NOOP, R.SOURCE_UNKNOWN)
KEY_MISSING = (A.NOOP, R.KEY_MISSING)
KEY_NOT_EXPORTED = (A.NOOP, R.KEY_NOT_EXPORTED)
KEY_NOT_EXPORTED_DELETED = (A.DELETE, R.KEY_NOT_EXPORTED)
COPY_DELETING = (A.NOOP, R.COPY_DELETING)

G = make_grant()
G_RETAIN = make_grant(on_revoke=OnRevoke.RETAIN)
S = make_source()
S_OLD = make_source(data={"token": b64("t-old"), "url": b64("http://hub")})
DEAD_G = make_grant(uid="uid-g-deleted-last-week")
"""An earlier grant of the same name: its uid belongs to no live grant."""
DEAD_RETAINING = make_grant(uid="uid-g-deleted-retaining", on_revoke=OnRevoke.RETAIN)
S_ELSEWHERE = make_source("elsewhere")
"""Another source with the same name: its copies land at the same target name."""
OLD_RIVAL = make_grant("r", created=T_OLD)
YOUNG_RIVAL = make_grant("y", created=T1)
RETAIN, DELETE = OnRevoke.RETAIN, OnRevoke.DELETE
G_HUB = make_grant(target_name=SRC_NAME)
S_IN_A = make_source("a", "other")
UNLABELLED = make_source(export_to=(), labelled=False)
"""The source as an export's narrow watch caches it: no export label, no say of its own."""
MOVED = replace(G_HUB, source=S_IN_A.key)
"""G_HUB, its source moved to `a/other`: `a`, where it holds a copy, is the source's own now."""

CopyMaker = Callable[[Grant, Source], Copy]
"""Builds a cached copy from the grant and the source of the case (or the ones it names)."""


def ours(
    namespace: str, *, grant: Grant | None = None, source: Source | None = None, **edits: Any
) -> CopyMaker:
    """A copy written by `grant` (default: the case's) from `source`, then edited by `edits`."""

    def make(g: Grant, s: Source) -> Copy:
        return copy_from(desired_of(grant or g, source or s), namespace, **edits)

    return make


def theirs(namespace: str, name: str = SRC_NAME, **kw: Any) -> CopyMaker:
    """A Secret someone else wrote at `namespace/name`."""
    return lambda _g, _s: foreign_secret(namespace, name, **kw)


@dataclass(frozen=True)
class Case:
    expected: Mapping[str, tuple[Action, Reason]]
    grant: Grant | None = G
    was: Grant | None = None
    """The grant the copies were written by, when it is not `grant` (e.g. it was deleted)."""
    source: Source | None = S
    state: SourceState = SourceState.AVAILABLE
    ns: tuple[str | Namespace, ...] = (SRC_NS, "a", "b", "c")
    copies: tuple[CopyMaker, ...] = ()
    extra_live: tuple[str, ...] = ()
    rivals: tuple[Grant, ...] = ()
    rival_sources: tuple[Source, ...] = (S,)
    exports: tuple[Export, ...] = ()
    matched: int | None = None
    plan_state: SourceState | None = None
    """The source state the plan reports, when it is not `state`."""

    @property
    def author(self) -> Grant:
        return self.was or self.grant or G

    def snapshot(self) -> Snapshot:
        return make_snapshot(
            self.grant,
            self.source,
            state=self.state,
            namespaces=namespaces(*self.ns),
            copies=[make(self.author, self.source or S) for make in self.copies],
            extra_live=self.extra_live,
            rivals=self.rivals,
            rival_sources={s.key: s for s in self.rival_sources},
            grant_name=self.author.name,
            exports=self.exports,
        )


CASES = [
    # -- grant + opted-in source + target namespace exists -----------------------------------------
    pytest.param(Case({"a": CREATED, "b": CREATED}, matched=2), id="create-in-every-target"),
    pytest.param(
        Case(
            {"a": CREATED, "b": NS_MISSING, "zz": NS_MISSING},
            grant=make_grant(namespaces=("a", "b", "zz")),
            ns=(SRC_NS, "a"),
            matched=3,
        ),
        id="namespace-missing",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "c": CREATED},
            grant=make_grant(namespaces=(), selector={"pack": "dask"}),
            ns=(
                make_ns(SRC_NS, {"pack": "dask"}),
                make_ns("a", {"pack": "dask"}),
                make_ns("b", {"pack": "hub"}),
                make_ns("c", {"pack": "dask", "x": "1"}),
                "d",
            ),
            matched=2,
        ),
        id="selector-matched-namespaces",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED},
            grant=make_grant(namespaces=("b",), selector={"pack": "dask"}),
            ns=(SRC_NS, make_ns("a", {"pack": "dask"}), "b", "c"),
            matched=2,
        ),
        id="selector-or-list",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED},
            grant=make_grant(namespaces=("a", "b"), selector={"pack": "dask"}),
            ns=(SRC_NS, make_ns("a", {"pack": "dask"}), "b", "c"),
            matched=2,
        ),
        id="listed-and-selected-counted-once",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED, "gone": NS_MISSING},
            grant=make_grant(namespaces=("b", "gone"), selector={"pack": "dask"}),
            ns=(SRC_NS, make_ns("a", {"pack": "dask"}), "b"),
            matched=3,
        ),
        id="listed-namespace-missing-with-selector",
    ),
    pytest.param(
        Case(
            {"gone": NS_MISSING},
            grant=make_grant(namespaces=("gone",), selector={"pack": "none"}),
            ns=(SRC_NS, "a", "b"),
            matched=1,
        ),
        id="listed-namespace-missing-selector-matches-nothing",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "new": CREATED},
            grant=make_grant(namespaces=(), selector={"pack": "dask"}),
            ns=(SRC_NS, make_ns("a", {"pack": "dask"}), make_ns("new", {"pack": "dask"})),
            copies=(ours("a"),),
        ),
        id="new-namespace-matching-selector",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED},
            grant=make_grant(namespaces=(), selector=LabelSelector((), (("pack", "Exists", ()),))),
            ns=(SRC_NS, make_ns("a", {"pack": ""}), make_ns("b", {"pack": "x"}), "c"),
        ),
        id="selector-expression",
    ),
    # -- source data changes -----------------------------------------------------------------------
    pytest.param(
        Case(
            {"a": UPDATED, "b": UPDATED}, copies=(ours("a", source=S_OLD), ours("b", source=S_OLD))
        ),
        id="update-when-source-data-changes",
    ),
    pytest.param(
        Case({"a": IN_SYNC, "b": IN_SYNC}, copies=(ours("a"), ours("b"))),
        id="in-sync-noop",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": CREATED},
            grant=make_grant(labels={"team": "data"}, annotations={"note": "x"}),
            copies=(ours("a", grant=G),),
        ),
        id="update-when-grant-metadata-changes",
    ),
    pytest.param(
        Case(
            {"a": UPDATED}, grant=make_grant(namespaces=("a",)), was=G_RETAIN, copies=(ours("a"),)
        ),
        id="update-when-policy-changes",
    ),
    # -- default deny ------------------------------------------------------------------------------
    pytest.param(
        Case({"a": DENIED, "b": DENIED}, source=make_source(export_to=""), matched=2),
        id="no-export-to-denied",
    ),
    pytest.param(
        Case({"a": DENIED, "b": DENIED}, source=make_source(export_to="dask")),
        id="export-to-does-not-match",
    ),
    pytest.param(
        Case(
            {"team-a": CREATED, "team-b": CREATED, "dev": DENIED},
            grant=make_grant(namespaces=("team-a", "team-b", "dev")),
            source=make_source(export_to="team-*"),
            ns=(SRC_NS, "team-a", "team-b", "dev"),
        ),
        id="export-to-glob",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": DENIED, "team-x": CREATED},
            grant=make_grant(namespaces=("a", "b", "team-x")),
            source=make_source(export_to="a, team-*"),
            ns=(SRC_NS, "a", "b", "team-x"),
        ),
        id="export-to-list-and-glob",
    ),
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            source=make_source(export_to=""),
            copies=(theirs("a"),),
        ),
        id="denied-leaves-foreign-secret-alone",
    ),
    # -- source namespace is never a target --------------------------------------------------------
    pytest.param(
        Case(
            {SRC_NS: SOURCE_NAMESPACE, "a": CREATED},
            grant=make_grant(namespaces=(SRC_NS, "a")),
            matched=1,
        ),
        id="source-namespace-listed",
    ),
    pytest.param(
        Case(
            {"a": CREATED},
            grant=make_grant(namespaces=(), selector={}),
            ns=(SRC_NS, "a"),
            matched=1,
        ),
        id="source-namespace-selected-is-skipped-quietly",
    ),
    pytest.param(
        Case(
            {SRC_NS: SOURCE_NAMESPACE, "a": CREATED},
            grant=make_grant(namespaces=(SRC_NS,), selector={}),
            ns=(SRC_NS, "a"),
            matched=1,
        ),
        id="source-namespace-listed-and-selected",
    ),
    pytest.param(
        Case(
            {SRC_NS: SOURCE_NAMESPACE},
            grant=make_grant(namespaces=(SRC_NS,), target_name="hub-copy"),
            copies=(theirs(SRC_NS, "hub-copy"),),
        ),
        id="source-namespace-other-name-still-refused",
    ),
    # The grant's source moves into a namespace the grant holds a copy in (issue 42): that
    # namespace is the source's own now, no longer a target, so the copy follows onRevoke.
    pytest.param(
        Case(
            {"a": REVOKED, "b": CREATED},
            grant=MOVED,
            source=S_IN_A,
            copies=(ours("a", grant=G_HUB, source=S),),
            matched=1,
        ),
        id="source-moved-into-copy-namespace-revokes-it",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_NAMESPACE, "b": CREATED},
            grant=replace(MOVED, on_revoke=RETAIN),
            source=S_IN_A,
            copies=(ours("a", grant=G_HUB, source=S),),
            matched=1,
        ),
        id="source-moved-into-copy-namespace-retains-it",
    ),
    pytest.param(
        Case(
            {"a": REVOKED, "b": CREATED, SRC_NS: CREATED},
            grant=replace(MOVED, namespaces=frozenset({"b"}), selector=LabelSelector()),
            source=S_IN_A,
            ns=(SRC_NS, "a", "b"),
            copies=(ours("a", grant=G_HUB, source=S),),
            matched=2,
        ),
        id="source-moved-into-selected-copy-namespace-revokes-it",
    ),
    pytest.param(
        Case(
            {"a": RETAINED, "b": CREATED, SRC_NS: CREATED},
            grant=replace(
                MOVED, namespaces=frozenset({"b"}), selector=LabelSelector(), on_revoke=RETAIN
            ),
            source=S_IN_A,
            ns=(SRC_NS, "a", "b"),
            copies=(ours("a", grant=G_HUB, source=S),),
            matched=2,
        ),
        id="source-moved-into-selected-copy-namespace-retains-it",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_NAMESPACE, "b": SOURCE_UNKNOWN},
            grant=MOVED,
            source=None,
            state=SourceState.UNKNOWN,
            copies=(ours("a", grant=G_HUB, source=S),),
            matched=1,
        ),
        id="source-moved-but-unreadable-deletes-nothing",
    ),
    # -- terminating namespace ---------------------------------------------------------------------
    pytest.param(
        Case(
            {"a": TERMINATING, "b": CREATED},
            ns=(SRC_NS, make_ns("a", terminating=True), "b"),
            copies=(ours("a", source=S_OLD),),
        ),
        id="terminating-skipped-quietly",
    ),
    pytest.param(
        Case(
            {"a": TERMINATING, "b": DENIED_DELETED},
            source=make_source(export_to="c"),
            ns=(SRC_NS, make_ns("a", terminating=True), "b"),
            copies=(ours("a"), ours("b")),
        ),
        id="terminating-copy-goes-with-namespace",
    ),
    # -- the producer withdraws (export label lost, export-to stops matching) ----------------------
    pytest.param(
        Case(
            {"a": DENIED_DELETED, "b": DENIED_DELETED},
            source=None,
            state=SourceState.NOT_EXPORTED,
            copies=(ours("a"), ours("b")),
        ),
        id="export-label-lost-on-revoke-delete",
    ),
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            grant=G_RETAIN,
            source=None,
            state=SourceState.NOT_EXPORTED,
            copies=(ours("a"), ours("b")),
        ),
        id="export-label-lost-on-revoke-retain",
    ),
    pytest.param(
        Case(
            {"a": DENIED_DELETED, "b": DENIED},
            source=S,  # still cached, but the state says the producer withdrew
            state=SourceState.NOT_EXPORTED,
            copies=(ours("a"),),
        ),
        id="export-label-lost-cached-source-ignored",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": DENIED_DELETED},
            source=make_source(export_to="a"),
            copies=(ours("a", source=make_source(export_to="a")), ours("b")),
        ),
        id="export-to-stops-matching-on-revoke-delete",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": DENIED},
            grant=G_RETAIN,
            source=make_source(export_to="a"),
            copies=(ours("a"), ours("b")),
        ),
        id="export-to-stops-matching-on-revoke-retain",
    ),
    pytest.param(
        # No second delete; the namespace keeps its own reason (Denied) in the status.
        Case(
            {"a": DENIED, "b": DENIED_DELETED},
            source=make_source(export_to="c"),
            copies=(ours("a", deleting=True), ours("b")),
        ),
        id="denied-copy-already-deleting-not-deleted-twice",
    ),
    # -- the admin untargets a namespace -----------------------------------------------------------
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": REVOKED},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), ours("b")),
        ),
        id="untargeted-on-revoke-delete",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": RETAINED},
            grant=make_grant(namespaces=("a",), on_revoke=RETAIN),
            copies=(ours("a"), ours("b")),
        ),
        id="untargeted-on-revoke-retain",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": REVOKED},
            grant=make_grant(namespaces=(), selector={"pack": "dask"}),
            ns=(SRC_NS, make_ns("a", {"pack": "dask"}), make_ns("b", {"pack": "other"})),
            copies=(ours("a"), ours("b")),
        ),
        id="untargeted-selector-stops-matching",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_UNKNOWN, "b": SOURCE_UNKNOWN},
            grant=make_grant(namespaces=("a",)),
            source=None,
            state=SourceState.UNKNOWN,
            copies=(ours("a"), ours("b")),
        ),
        id="untargeted-while-source-unknown-kept",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED, "a/hub": REVOKED},
            grant=make_grant(target_name="contract"),
            was=G,
            copies=(ours("a"),),
        ),
        id="target-renamed-old-copy-revoked",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "c": REVOKED},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), ours("c")),
        ),
        id="our-copy-in-untargeted-namespace-never-written",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": COPY_DELETING},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), ours("b", deleting=True)),
        ),
        id="untargeted-copy-already-deleting-not-deleted-twice",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": COPY_DELETING},
            grant=make_grant(namespaces=("a",), on_revoke=RETAIN),
            copies=(ours("a"), ours("b", deleting=True)),
        ),
        id="untargeted-copy-already-deleting-retain",
    ),
    # -- the grant is deleted ----------------------------------------------------------------------
    pytest.param(
        Case({"a": REVOKED, "b": REVOKED}, grant=None, copies=(ours("a"), ours("b")), matched=0),
        id="grant-deleted-on-revoke-delete",
    ),
    pytest.param(
        Case({"a": RETAINED}, grant=None, was=G_RETAIN, copies=(ours("a"),)),
        id="grant-deleted-on-revoke-retain",
    ),
    pytest.param(
        Case(
            {"a": RETAINED},
            grant=make_grant(deleting=True, on_revoke=DELETE),
            was=G_RETAIN,
            copies=(ours("a"),),
        ),
        id="grant-deleting-uses-recorded-retain",
    ),
    pytest.param(
        Case(
            {"a": REVOKED},
            grant=make_grant(deleting=True, on_revoke=RETAIN),
            was=G,
            copies=(ours("a"),),
        ),
        id="grant-deleting-uses-recorded-delete",
    ),
    pytest.param(
        Case(
            {"a": RETAINED},
            grant=None,
            copies=(ours("a", annotations={ON_REVOKE_ANNOTATION: None}),),
        ),
        id="grant-deleted-policy-annotation-missing-kept",
    ),
    pytest.param(
        Case(
            {"a": RETAINED},
            grant=None,
            copies=(ours("a", annotations={ON_REVOKE_ANNOTATION: "delete"}),),
        ),
        id="grant-deleted-policy-annotation-garbled-kept",
    ),
    pytest.param(
        Case(
            {"a": RETAINED}, grant=None, copies=(ours("a", annotations={ON_REVOKE_ANNOTATION: ""}),)
        ),
        id="grant-deleted-policy-annotation-empty-kept",
    ),
    pytest.param(
        Case(
            {"a": REVOKED},
            grant=None,
            source=None,
            state=SourceState.UNKNOWN,
            copies=(ours("a"),),
        ),
        id="grant-deleted-is-authoritative-even-if-source-unknown",
    ),
    pytest.param(
        Case(
            {"a": REVOKED},
            grant=None,
            copies=(ours("a"), ours("b", grant=OLD_RIVAL), theirs("c")),
            extra_live=(OLD_RIVAL.uid,),
        ),
        id="grant-deleted-other-grants-and-foreign-untouched",
    ),
    pytest.param(
        Case(
            {},
            grant=None,
            copies=(ours("a", annotations={GRANT_UID_ANNOTATION: "uid-live-other"}),),
            extra_live=("uid-live-other",),
        ),
        id="grant-deleted-our-label-but-live-others-uid-untouched",
    ),
    pytest.param(
        Case({}, grant=None, copies=()),
        id="grant-deleted-nothing-left",
    ),
    pytest.param(
        Case(
            {"a": COPY_DELETING, "b": REVOKED},
            grant=None,
            copies=(ours("a", deleting=True), ours("b")),
        ),
        id="grant-deleted-copy-already-deleting-not-deleted-twice",
    ),
    pytest.param(
        Case(
            {"a": COPY_DELETING},
            grant=make_grant(deleting=True),
            copies=(ours("a", deleting=True),),
        ),
        id="grant-deleting-copy-already-deleting",
    ),
    # -- orphans of an earlier grant of the same name ----------------------------------------------
    pytest.param(
        Case(
            {"a": UPDATED, "b": CREATED},
            grant=make_grant(uid="uid-g-recreated"),
            was=DEAD_G,
            copies=(ours("a"),),
        ),
        id="orphan-adopted-when-wanted",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "c": REVOKED},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), ours("c", grant=DEAD_G)),
        ),
        id="orphan-untargeted-on-revoke-delete",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "c": REVOKED},
            grant=make_grant(namespaces=("a",), on_revoke=RETAIN),
            copies=(ours("a"), ours("c", grant=DEAD_G)),
        ),
        id="orphan-untargeted-follows-its-recorded-delete-not-the-grants-retain",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "c": RETAINED},
            grant=make_grant(namespaces=("a",), on_revoke=DELETE),
            copies=(ours("c", grant=DEAD_RETAINING, source=S_ELSEWHERE),),
        ),
        id="grant-name-reused-retained-orphan-of-another-source-kept",
    ),
    pytest.param(
        Case(
            {"a": REPLACED, "b": CREATED},
            copies=(ours("a", grant=DEAD_G, source=S_ELSEWHERE),),
        ),
        id="orphan-of-another-source-at-a-wanted-place-replaced-by-its-recorded-delete",
    ),
    pytest.param(
        Case(
            {"a": ORPHAN_CONFLICT, "b": CREATED},
            copies=(ours("a", grant=DEAD_RETAINING, source=S_ELSEWHERE),),
        ),
        id="orphan-of-another-source-at-a-wanted-place-retained-not-adopted",
    ),
    # The reported data loss: grant g (Retain) is deleted and its copy stays; a new grant g
    # aims at the same place for a source that may not go there, or that does not exist.
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            grant=make_grant(on_revoke=DELETE),
            source=make_source(export_to=("c",)),
            copies=(ours("a", grant=DEAD_RETAINING, source=S_ELSEWHERE),),
        ),
        id="grant-name-reused-retained-orphan-at-a-denied-place-kept",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_MISSING, "b": SOURCE_MISSING},
            grant=make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.MISSING,
            copies=(ours("a", grant=DEAD_RETAINING, source=S_ELSEWHERE),),
        ),
        id="grant-name-reused-retained-orphan-source-missing-kept",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_MISSING, "b": SOURCE_MISSING},
            grant=make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.MISSING,
            copies=(ours("a", grant=DEAD_RETAINING),),
        ),
        id="retained-orphan-of-the-same-source-kept-when-the-source-is-missing",
    ),
    pytest.param(
        Case(
            {"a": REVOKED, "b": DENIED},
            grant=make_grant(on_revoke=RETAIN),
            source=make_source(export_to=("c",)),
            copies=(ours("a", grant=DEAD_G),),
        ),
        id="orphan-at-a-denied-place-goes-by-its-recorded-delete-not-the-grants-retain",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            grant=make_grant(on_revoke=DELETE),
            copies=(ours("a", grant=DEAD_RETAINING, source=S_ELSEWHERE),),
            extra_live=(DEAD_RETAINING.uid,),
        ),
        id="a-live-grants-copy-at-the-place-is-no-orphan",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            copies=(
                ours("a", grant=make_grant("other", uid="uid-dead-other")),
                ours("c", grant=make_grant("other", uid="uid-dead-other")),
            ),
        ),
        id="orphan-of-another-grant-name-is-not-ours",
    ),
    # -- source deleted ----------------------------------------------------------------------------
    pytest.param(
        Case(
            {"a": SOURCE_MISSING, "b": SOURCE_MISSING},
            source=None,
            state=SourceState.MISSING,
            copies=(ours("a"),),
        ),
        id="source-missing-on-source-deleted-retain",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_MISSING_DELETED, "b": SOURCE_MISSING},
            grant=make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.MISSING,
            copies=(ours("a"),),
        ),
        id="source-missing-on-source-deleted-delete",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_MISSING, "b": SOURCE_MISSING_DELETED},
            grant=make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.MISSING,
            copies=(ours("a", deleting=True), ours("b")),
        ),
        id="source-missing-copy-already-deleting-not-deleted-twice",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_MISSING},
            grant=make_grant(namespaces=("a",), on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.MISSING,
            copies=(theirs("a"),),
        ),
        id="source-missing-foreign-secret-untouched",
    ),
    # -- source unknown: never delete on uncertainty -----------------------------------------------
    pytest.param(
        Case(
            {"a": SOURCE_UNKNOWN, "b": SOURCE_UNKNOWN},
            grant=make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.UNKNOWN,
            copies=(ours("a", source=S_OLD), ours("b")),
        ),
        id="source-unknown-nothing-written-nothing-deleted",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_UNKNOWN, "b": SOURCE_UNKNOWN},
            source=S,  # a stale cached source is not trusted either
            state=SourceState.UNKNOWN,
            copies=(ours("a", source=S_OLD),),
        ),
        id="source-unknown-stale-source-not-used",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_UNKNOWN, "b": SOURCE_UNKNOWN, "c": SOURCE_UNKNOWN},
            grant=make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            source=None,  # inconsistent: the state says Available but no source was read
            state=SourceState.AVAILABLE,
            copies=(ours("a", source=S_OLD), ours("c")),
            plan_state=SourceState.UNKNOWN,
            matched=2,
        ),
        id="available-without-source-is-unknown",
    ),
    # -- keys --------------------------------------------------------------------------------------
    pytest.param(
        Case({"a": CREATED, "b": CREATED}, grant=make_grant(keys=[("token", "api-token")])),
        id="key-filter-and-rename",
    ),
    pytest.param(
        Case(
            {"a": KEY_MISSING, "b": KEY_MISSING},
            grant=make_grant(keys=[("token", "token"), ("nope", "nope")]),
            copies=(ours("a", grant=G),),
        ),
        id="key-missing-no-write-last-copy-kept",
    ),
    pytest.param(
        Case(
            {"a": KEY_MISSING},
            grant=make_grant(namespaces=("a",), keys=[("nope", "x")]),
            copies=(theirs("a"),),
        ),
        id="key-missing-before-conflict",
    ),
    # -- the producer's key scope (export-keys) is a hard boundary ---------------------------------
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED},
            source=make_source(export_keys=frozenset({"token"})),
        ),
        id="export-keys-a-grant-without-keys-copies-the-exported-ones",
    ),
    pytest.param(
        Case(
            {"a": KEY_NOT_EXPORTED, "b": KEY_NOT_EXPORTED},
            grant=make_grant(keys=[("token", "token"), ("url", "url")]),
            source=make_source(export_keys=frozenset({"token"})),
        ),
        id="export-keys-a-grant-naming-another-key-writes-nothing",
    ),
    pytest.param(
        Case(
            {"a": KEY_NOT_EXPORTED_DELETED, "b": KEY_NOT_EXPORTED},
            grant=make_grant(keys=[("url", "url")]),
            source=make_source(export_keys=frozenset({"token"})),
            copies=(ours("a", source=S),),
        ),
        id="export-keys-narrowed-below-a-grants-key-revokes-its-copies",
    ),
    pytest.param(
        Case(
            {"a": KEY_NOT_EXPORTED, "b": KEY_NOT_EXPORTED},  # kept, as a Denied namespace's
            grant=make_grant(keys=[("url", "url")], on_revoke=OnRevoke.RETAIN),
            source=make_source(export_keys=frozenset()),
            copies=(ours("a", source=S),),
        ),
        id="export-keys-blank-lets-no-key-leave-retain-keeps-the-copy",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": CREATED},
            source=make_source(export_keys=frozenset({"token"})),
            copies=(ours("a", source=S),),
        ),
        id="export-keys-narrowed-rewrites-a-whole-copy",
    ),
    # -- a ProjectionExport: the producer's consent without touching its Secret -------------------
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED},
            source=UNLABELLED,
            exports=(make_export(),),
        ),
        id="export-an-unlabelled-source-is-projected-as-a-labelled-one",
    ),
    pytest.param(
        Case({"a": DENIED, "b": DENIED}, source=UNLABELLED),
        id="export-none-an-unlabelled-source-is-not-exported",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": DENIED_DELETED},
            source=UNLABELLED,
            exports=(make_export(("a",)),),
            copies=(ours("b"),),
        ),
        id="export-to-narrowed-revokes-by-onrevoke",
    ),
    pytest.param(
        Case(
            {"a": DENIED_DELETED, "b": DENIED_DELETED},
            source=UNLABELLED,
            copies=(ours("a"), ours("b")),
        ),
        id="export-deleted-revokes-by-onrevoke",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED},
            source=make_source(export_to="a"),
            exports=(make_export(("b",)),),
        ),
        id="export-and-label-each-consent-where-they-match",
    ),
    pytest.param(
        Case(
            {"a": KEY_NOT_EXPORTED, "b": CREATED},
            grant=make_grant(keys=[("url", "url")]),
            source=UNLABELLED,
            exports=(make_export(("a",), frozenset({"token"})), make_export(("b",), name="all")),
        ),
        id="export-keys-scope-per-namespace",
    ),
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            source=UNLABELLED,
            exports=(make_export(refused="spec.to has more than 256 entries"),),
        ),
        id="export-past-its-bounds-consents-to-nothing",
    ),
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            source=UNLABELLED,
            exports=(make_export(source="other"),),
        ),
        id="export-of-another-source-says-nothing-of-this-one",
    ),
    # -- credentials of the cluster are never sources: refused, what was projected is revoked -----
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED_DELETED},
            source=make_source(type_="kubernetes.io/service-account-token"),
            copies=(ours("b"),),
            plan_state=SourceState.REFUSED,
        ),
        id="service-account-token-refused-earlier-copy-revoked",
    ),
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            grant=G_RETAIN,
            source=make_source(type_="bootstrap.kubernetes.io/token"),
            copies=(ours("a", type_="bootstrap.kubernetes.io/token"),),
            plan_state=SourceState.REFUSED,
        ),
        id="bootstrap-token-refused-earlier-copy-retained",
    ),
    pytest.param(
        Case(
            {"a": DENIED, "b": DENIED},
            source=replace(S, refused="the source is a copy projector wrote"),
            plan_state=SourceState.REFUSED,
        ),
        id="a-copy-is-never-a-source",
    ),
    # -- drift: someone edits or deletes a copy ----------------------------------------------------
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            copies=(ours("a", data={"token": b64("edited")}), ours("b")),
        ),
        id="drift-data-edited",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            copies=(ours("a", data={**S.data, "extra": b64("x")}), ours("b")),
        ),
        id="drift-key-added",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            copies=(ours("a", annotations={HASH_ANNOTATION: "sha256:" + "0" * 64}), ours("b")),
        ),
        id="drift-hash-annotation-tampered",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            copies=(ours("a", annotations={HASH_ANNOTATION: None}), ours("b")),
        ),
        id="drift-hash-annotation-removed",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": UPDATED},
            copies=(
                ours("a", labels={GRANT_LABEL: None}),
                ours("b", labels={MANAGED_BY_LABEL: "x"}),
            ),
        ),
        id="drift-labels-edited-still-ours-by-uid",
    ),
    pytest.param(
        # Metadata others add (tools, mutating webhooks) is not ours to police: no fight.
        Case(
            {"a": IN_SYNC},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a", annotations={"someone": "else"}),),
        ),
        id="drift-foreign-annotation-added",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": IN_SYNC},
            grant=make_grant(labels={"team": "data"}, annotations={"note": "x"}),
            copies=(
                ours("a", labels={"app.kubernetes.io/part-of": "x"}),
                ours("b", labels={"sub.projector.nebari.dev/x": "1"}, annotations={"w": "1"}),
            ),
        ),
        id="drift-foreign-labels-added-with-grant-metadata",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            grant=make_grant(labels={"team": "data", "tier": "1"}),
            copies=(ours("a", labels={"team": None}), ours("b")),
        ),
        id="drift-grant-extra-label-removed-from-copy",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            grant=make_grant(labels={"team": "data"}),
            copies=(ours("a", labels={"team": "other"}), ours("b")),
        ),
        id="drift-grant-extra-label-changed-on-copy",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": UPDATED},
            grant=make_grant(annotations={"note": "x"}),
            copies=(ours("a", annotations={"note": None}), ours("b", annotations={"note": "y"})),
        ),
        id="drift-grant-extra-annotation-removed-or-changed",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": UPDATED, "c": IN_SYNC},
            grant=make_grant(namespaces=("a", "b", "c")),
            copies=(
                ours("a", annotations={SOURCE_ANNOTATION: "elsewhere/hub"}),
                ours("b", annotations={ON_REVOKE_ANNOTATION: "Retain"}),
                ours("c"),
            ),
        ),
        id="drift-our-annotation-tampered",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": UPDATED},
            copies=(
                ours("a", annotations={ON_SOURCE_DELETED_ANNOTATION: None}),
                ours("b", labels={"projector.nebari.dev/export": "true"}),
            ),
        ),
        id="drift-our-annotation-removed-or-our-prefix-label-added",
    ),
    pytest.param(
        Case({"a": IN_SYNC, "b": CREATED}, copies=(ours("a"),)),
        id="drift-copy-deleted-recreated",
    ),
    pytest.param(
        Case(
            {"a": REPLACED, "b": IN_SYNC},
            copies=(ours("a", type_="kubernetes.io/basic-auth"), ours("b")),
        ),
        id="drift-type-changed-replaced",
    ),
    pytest.param(
        Case(
            {"a": REPLACED, "b": REPLACED},
            source=make_source(type_="example.com/contract"),
            copies=(ours("a", source=make_source()), ours("b", source=make_source())),
        ),
        id="source-type-changed-replaced",
    ),
    pytest.param(
        Case({"a": COPY_DELETING, "b": CREATED}, copies=(ours("a", source=S_OLD, deleting=True),)),
        id="copy-being-deleted-waits",
    ),
    # -- someone made a copy immutable: left alone while in sync (a replace leaves consumers
    # without it for a moment); once it must change, the API refuses updates: delete and create
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": REPLACED},
            copies=(ours("a", immutable=True), ours("b", source=S_OLD, immutable=True)),
        ),
        id="immutable-copy-in-sync-kept-stale-replaced",
    ),
    pytest.param(
        Case(
            {"a": COPY_DELETING},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a", immutable=True, deleting=True),),
        ),
        id="immutable-copy-being-deleted-waits",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            copies=(theirs("a", immutable=True),),
        ),
        id="immutable-foreign-secret-not-replaced",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": REVOKED},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), ours("b", immutable=True)),
        ),
        id="immutable-copy-untargeted-deleted",
    ),
    # -- a Secret that is not ours -----------------------------------------------------------------
    pytest.param(
        Case({"a": CONFLICT, "b": CREATED}, copies=(theirs("a"),)),
        id="foreign-secret-conflict",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            copies=(theirs("a", labels={GRANT_LABEL: "g", MANAGED_BY_LABEL: "projector"}),),
        ),
        id="our-labels-without-grant-uid-conflict",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            copies=(theirs("a", deleting=True),),
            grant=make_grant(namespaces=("a",)),
        ),
        id="foreign-secret-being-deleted-still-conflict",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            copies=(theirs("a", annotations={GRANT_UID_ANNOTATION: "uid-dead"}),),
        ),
        id="dead-grant-uid-without-our-label-conflict",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            copies=(
                theirs(
                    "a",
                    labels={GRANT_LABEL: "someone-else"},
                    annotations={GRANT_UID_ANNOTATION: "uid-dead"},
                ),
            ),
        ),
        id="dead-grant-uid-other-label-conflict",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            copies=(theirs("a", type_="kubernetes.io/tls"),),
        ),
        id="foreign-secret-of-other-type-not-replaced",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            copies=(
                theirs("a", labels={GRANT_LABEL: "g"}, annotations={GRANT_UID_ANNOTATION: ""}),
            ),
        ),
        id="label-and-empty-grant-uid-not-overwritten",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), theirs("c", labels={GRANT_LABEL: "g"})),
        ),
        id="label-only-secret-untargeted-not-deleted",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC},
            grant=make_grant(namespaces=("a",)),
            copies=(
                ours("a"),
                theirs("c", labels={GRANT_LABEL: "g"}, annotations={GRANT_UID_ANNOTATION: ""}),
            ),
        ),
        id="label-and-empty-grant-uid-untargeted-not-deleted",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC, "b": DENIED},
            source=make_source(export_to="a"),
            copies=(
                ours("a", source=make_source(export_to="a")),
                theirs("b", labels={GRANT_LABEL: "g"}),
            ),
        ),
        id="label-only-secret-denied-not-deleted",
    ),
    pytest.param(
        Case(
            {"a": SOURCE_MISSING},
            grant=make_grant(namespaces=("a",), on_source_deleted=OnSourceDeleted.DELETE),
            source=None,
            state=SourceState.MISSING,
            copies=(theirs("a", labels={GRANT_LABEL: "g"}),),
        ),
        id="label-only-secret-source-missing-not-deleted",
    ),
    pytest.param(
        Case(
            {},
            grant=None,
            copies=(
                theirs(
                    "a", labels={GRANT_LABEL: "g"}, annotations={ON_REVOKE_ANNOTATION: "Delete"}
                ),
                theirs(
                    "b",
                    labels={GRANT_LABEL: "g"},
                    annotations={GRANT_UID_ANNOTATION: "", ON_REVOKE_ANNOTATION: "Delete"},
                ),
            ),
        ),
        id="label-only-secret-grant-deleted-not-deleted",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            copies=(ours("a", annotations={GRANT_UID_ANNOTATION: "uid-live-other"}),),
            extra_live=("uid-live-other",),
        ),
        id="live-owner-that-is-no-rival-not-overwritten",
    ),
    # -- the grant-uid mark counts only if projector wrote it (managedFields) ------------------
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            copies=(ours("a", uid_written_by=BY_HAND),),
        ),
        id="our-uid-copied-by-hand-not-overwritten",
    ),
    pytest.param(
        Case(
            {"a": IN_SYNC},
            grant=make_grant(namespaces=("a",)),
            copies=(ours("a"), ours("c", uid_written_by=BY_HAND)),
        ),
        id="our-uid-copied-by-hand-untargeted-not-deleted",
    ),
    pytest.param(
        Case({}, grant=None, copies=(ours("a", uid_written_by=BY_HAND),)),
        id="our-uid-copied-by-hand-grant-deleted-not-deleted",
    ),
    pytest.param(
        Case(
            {"a": DENIED},
            grant=make_grant(namespaces=("a",)),
            source=make_source(export_to="b"),
            copies=(ours("a", uid_written_by=BY_HAND),),
        ),
        id="our-uid-copied-by-hand-denied-not-deleted",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            grant=make_grant(uid="uid-g-recreated"),
            was=DEAD_G,
            copies=(ours("a", uid_written_by=BY_HAND),),
        ),
        id="orphan-mark-written-by-hand-not-adopted",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            rivals=(YOUNG_RIVAL,),
            copies=(ours("a", grant=YOUNG_RIVAL, uid_written_by=BY_HAND),),
        ),
        id="younger-rival-mark-written-by-hand-not-taken-over",
    ),
    # -- two grants aiming at one copy -------------------------------------------------------------
    pytest.param(
        Case({"a": GRANT_CONFLICT, "b": GRANT_CONFLICT}, rivals=(OLD_RIVAL,)),
        id="older-grant-wins",
    ),
    pytest.param(
        Case(
            {"a": GRANT_CONFLICT, "b": GRANT_CONFLICT}, rivals=(make_grant("a-first", created=T0),)
        ),
        id="same-age-earlier-name-wins",
    ),
    pytest.param(
        Case({"a": CREATED, "b": CREATED}, rivals=(make_grant("z-last", created=T0),)),
        id="same-age-later-name-loses",
    ),
    pytest.param(
        Case({"a": CREATED, "b": CREATED}, rivals=(YOUNG_RIVAL,)),
        id="younger-rival-ignored",
    ),
    pytest.param(
        Case({"a": CREATED, "b": CREATED}, rivals=(make_grant("r", created=T_OLD, deleting=True),)),
        id="older-rival-being-deleted-gives-way",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": GRANT_CONFLICT},
            rivals=(make_grant("r", created=T_OLD, namespaces=("b",)),),
        ),
        id="older-rival-not-targeting-namespace",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": GRANT_CONFLICT},
            rivals=(make_grant("r", created=T_OLD, source=("other", "s")),),
            rival_sources=(make_source("other", "s", export_to="b"),),
        ),
        id="older-rival-not-exported-there",
    ),
    pytest.param(
        Case({"a": CREATED, "b": CREATED}, rivals=(OLD_RIVAL,), rival_sources=()),
        id="older-rival-without-source-gives-way",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": GRANT_CONFLICT},
            rivals=(make_grant("r", created=T_OLD, source=("a", "s")),),
            rival_sources=(make_source("a", "s"),),
        ),
        id="older-rival-never-targets-its-own-source-namespace",
    ),
    pytest.param(
        Case(
            {"a": GRANT_CONFLICT},
            grant=make_grant(namespaces=("a",)),
            rivals=(OLD_RIVAL,),
            copies=(ours("a", grant=OLD_RIVAL),),
        ),
        id="older-rivals-copy-untouched",
    ),
    pytest.param(
        Case(
            {"a": GRANT_CONFLICT},
            grant=make_grant(namespaces=("a",)),
            rivals=(OLD_RIVAL,),
            copies=(ours("a"),),
        ),
        id="younger-grants-own-copy-kept-when-older-arrives",
    ),
    pytest.param(
        Case(
            {"a": UPDATED},
            grant=make_grant(namespaces=("a",)),
            rivals=(YOUNG_RIVAL,),
            copies=(ours("a", grant=YOUNG_RIVAL),),
        ),
        id="older-grant-takes-over-younger-grants-copy",
    ),
    pytest.param(
        Case(
            {"a": UPDATED, "b": IN_SYNC},
            rivals=(make_grant("y", created=T1, namespaces=("a",)),),
            copies=(ours("a", grant=YOUNG_RIVAL, source=S_OLD), ours("b")),
        ),
        id="younger-rival-that-still-wants-it-is-taken-over",
    ),
    pytest.param(
        Case(
            {"a": UPDATED},
            grant=make_grant(namespaces=("a",)),
            rivals=(make_grant("z-last", created=T0),),
            copies=(ours("a", grant=make_grant("z-last", created=T0)),),
        ),
        id="same-age-later-name-rival-is-taken-over",
    ),
    pytest.param(
        # A live owner keeps its copy unless it is younger and still wants it here.
        Case(
            {"a": CONFLICT},
            grant=make_grant(namespaces=("a",)),
            rivals=(make_grant("r", created=T_OLD, namespaces=("b",)),),
            copies=(ours("a", grant=OLD_RIVAL),),
        ),
        id="older-rival-that-no-longer-wants-it-keeps-its-copy",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            rivals=(make_grant("y", created=T1, namespaces=("b",), on_revoke=RETAIN),),
            copies=(ours("a", grant=YOUNG_RIVAL),),
        ),
        id="younger-rival-that-retained-it-after-untargeting-keeps-its-copy",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            rivals=(make_grant("y", created=T1, source=("other", "s")),),
            rival_sources=(make_source("other", "s", export_to="b"),),
            copies=(ours("a", grant=YOUNG_RIVAL),),
        ),
        id="younger-rival-no-longer-exported-there-keeps-its-copy",
    ),
    pytest.param(
        Case(
            {"a": CONFLICT, "b": CREATED},
            rivals=(YOUNG_RIVAL,),
            rival_sources=(),
            copies=(ours("a", grant=YOUNG_RIVAL),),
        ),
        id="younger-rival-without-source-keeps-its-copy",
    ),
    # -- copies at the target name that carry no label of this grant ------------------------
    pytest.param(
        Case({"a": CONFLICT, "b": CREATED}, copies=(theirs("a"),)),
        id="foreign-secret-at-wanted-place-conflict",
    ),
    pytest.param(
        Case(
            {"a": CREATED, "b": CREATED}, copies=(theirs("c"), ours("c", grant=OLD_RIVAL, name="x"))
        ),
        id="secrets-elsewhere-untouched",
    ),
]


def check_steps(snap: Snapshot, p: Plan) -> None:
    """Invariants of every plan: writes name what they act on; nothing is written twice."""
    copies = snap.copies
    seen: set[tuple[str, str]] = set()
    for s in p.steps:
        assert (s.namespace, s.name) not in seen
        seen.add((s.namespace, s.name))
        key = ObjectKey(s.namespace, s.name)
        if s.action is A.CREATE:
            assert s.existing is None
            assert key not in copies
        elif s.action in (A.UPDATE, A.REPLACE, A.DELETE):
            assert s.existing is copies[key]  # its uid/resourceVersion are the preconditions
        if s.action in (A.CREATE, A.UPDATE, A.REPLACE):
            assert p.desired is not None and s.name == p.desired.name
            assert s.reason is R.PROJECTED
    assert p.writes == tuple(s for s in p.steps if s.action is not A.NOOP)


@pytest.mark.parametrize("case", CASES)
def test_plan(case: Case) -> None:
    snap = case.snapshot()
    p = plan(snap)
    assert summary(p, (case.grant or case.author).target_name) == case.expected
    if case.matched is not None:
        assert p.matched == case.matched
    assert p.grant_name == case.author.name
    assert p.source_state is (case.plan_state or case.state)
    check_steps(snap, p)


@pytest.mark.parametrize("case", [pytest.param(p.values[0], id=p.id) for p in CASES])
def test_plan_converges_in_one_round(case: Case) -> None:
    """Once the writer has done a plan's writes, planning again writes nothing."""
    snap = case.snapshot()
    first = plan(snap)
    again = plan(simulate(snap, first))
    assert again.writes == ()


def test_restart_with_everything_up_to_date_writes_nothing() -> None:
    names = [f"team-{i:03}" for i in range(200)]
    grant = make_grant(namespaces=(), selector={"pack": "x"})
    source = make_source(export_to="team-*")
    d = desired_of(grant, source)
    snap = make_snapshot(
        grant,
        source,
        namespaces=namespaces(SRC_NS, *(make_ns(n, {"pack": "x"}) for n in names)),
        copies=[copy_from(d, n, resource_version=str(i)) for i, n in enumerate(names)],
    )
    p = plan(snap)
    assert p.writes == ()
    assert p.matched == 200
    assert {s.reason for s in p.steps} == {R.PROJECTED}


def test_export_keys_copy_only_the_exported_keys_as_opaque() -> None:
    """A grant without a keys filter copies exactly what the producer's scope lets leave; a
    filtered copy of a typed source is Opaque (not every key is projected)."""
    typed = make_source(type_="example.com/contract", export_keys=frozenset({"token", "gone"}))
    d = desired_copy(G, typed, None, typed.export_keys)
    assert isinstance(d, Desired)
    assert set(d.data) == {"token"} and d.type == "Opaque"
    whole = make_source(type_="example.com/contract", export_keys=frozenset({"token", "url"}))
    w = desired_copy(G, whole, None, whole.export_keys)
    assert isinstance(w, Desired) and w.type == "example.com/contract"


def test_exports_with_other_key_scopes_give_their_namespaces_other_copies() -> None:
    """Two exports of one source, one key in `a`, every key in `b`: each namespace's copy holds
    what its consent lets leave (one body each), and the plan's copy is the more common one."""
    exports = (make_export(("a",), frozenset({"token"})), make_export(("b", "c"), name="all"))
    grant = make_grant(namespaces=("a", "b", "c"))
    snap = make_snapshot(grant, UNLABELLED, namespaces=namespaces("a", "b", "c"), exports=exports)
    planned = plan(snap)
    steps = {s.namespace: s for s in planned.steps}
    assert {k: sorted(v.desired.data) for k, v in steps.items() if v.desired} == {
        "a": ["token"],
        "b": ["token", "url"],
        "c": ["token", "url"],
    }
    assert steps["b"].desired is steps["c"].desired is planned.desired


def test_plan_carries_desired_copy() -> None:
    p = plan(make_snapshot(G, S, namespaces=namespaces("a")))
    assert p.desired == desired_copy(G, S)
    assert p.grant is G


@pytest.mark.parametrize(
    ("grant", "source", "state"),
    [
        pytest.param(G, None, SourceState.MISSING, id="missing"),
        pytest.param(G, None, SourceState.UNKNOWN, id="unknown"),
        pytest.param(G, S, SourceState.NOT_EXPORTED, id="not-exported"),
        pytest.param(make_grant(keys=[("nope", "x")]), S, SourceState.AVAILABLE, id="key-missing"),
        pytest.param(None, S, SourceState.AVAILABLE, id="grant-deleted"),
        pytest.param(G, None, SourceState.AVAILABLE, id="available-without-source"),
    ],
)
def test_plan_has_no_desired_copy_when_nothing_may_be_written(
    grant: Grant | None, source: Source | None, state: SourceState
) -> None:
    snap = make_snapshot(
        grant, source, state=state, namespaces=namespaces("a", "b"), grant_name="g"
    )
    p = plan(snap)
    assert p.desired is None
    assert not [s for s in p.writes if s.action is not A.DELETE]


def step_in(p: Plan, namespace: str) -> Step:
    (step,) = [s for s in p.steps if s.namespace == namespace]
    return step


def test_key_missing_names_the_key() -> None:
    grant = make_grant(keys=[("token", "token"), ("api-token", "x")])
    p = plan(make_snapshot(grant, S, namespaces=namespaces("a")))
    assert "'api-token'" in step_in(p, "a").message


def test_replace_names_both_types() -> None:
    d = desired_of(G, S)
    old = copy_from(d, "a", type_="kubernetes.io/basic-auth")
    p = plan(make_snapshot(G, S, namespaces=namespaces("a"), copies=[old]))
    assert step_in(p, "a").message == "type kubernetes.io/basic-auth -> Opaque"


def test_replace_of_an_immutable_copy_says_so() -> None:
    d = desired_of(G, S)
    frozen = copy_from(desired_of(G, S_OLD), "a", immutable=True)
    assert frozen.immutable
    p = plan(make_snapshot(G, S, namespaces=namespaces("a"), copies=[frozen]))
    step = step_in(p, "a")
    assert (step.action, step.reason) == REPLACED
    assert step.existing is frozen  # its uid and resourceVersion guard the delete
    assert step.message == "the copy was made immutable"
    both = copy_from(d, "a", immutable=True, type_="kubernetes.io/basic-auth")
    p = plan(make_snapshot(G, S, namespaces=namespaces("a"), copies=[both]))
    assert step_in(p, "a").message == "type kubernetes.io/basic-auth -> Opaque"


def test_grant_conflict_names_the_older_grant() -> None:
    p = plan(
        make_snapshot(
            G, S, namespaces=namespaces("a"), rivals=[OLD_RIVAL], rival_sources={S.key: S}
        )
    )
    assert "older grant r " in step_in(p, "a").message


def test_the_oldest_of_several_rivals_is_named() -> None:
    rivals = [
        make_grant("r2", created="2023-06-01T00:00:00Z"),
        make_grant("r1", created=T_OLD),
        YOUNG_RIVAL,
    ]
    p = plan(
        make_snapshot(G, S, namespaces=namespaces("a"), rivals=rivals, rival_sources={S.key: S})
    )
    assert "older grant r1 " in step_in(p, "a").message


def test_conflict_and_source_namespace_explain_themselves() -> None:
    grant = make_grant(namespaces=(SRC_NS, "a"))
    p = plan(
        make_snapshot(grant, S, namespaces=namespaces(SRC_NS, "a"), copies=[foreign_secret("a")])
    )
    assert step_in(p, "a").message == "a Secret of that name exists and is not owned by this grant"
    assert step_in(p, SRC_NS).message == "the source's own namespace is never a target"


def test_written_manifest_round_trips_to_in_sync() -> None:
    """What the writer sends for a Create is, once stored, exactly in sync."""
    grant = make_grant(namespaces=("a",), labels={"team": "data"}, annotations={"note": "x"})
    p = plan(make_snapshot(grant, S, namespaces=namespaces("a")))
    assert p.desired is not None
    (create,) = p.writes
    stored = p.desired.manifest(create.namespace)
    meta = stored["metadata"]
    assert isinstance(meta, dict)
    # what the API server adds to what it stores: identity, version, who wrote which field
    meta.update(
        uid="u",
        resourceVersion="1",
        managedFields=[managed_fields(FIELD_MANAGER, meta["annotations"], labels=meta["labels"])],
    )
    copy = parse_copy(stored)
    assert copy.grant_uid == grant.uid
    again = plan(make_snapshot(grant, S, namespaces=namespaces("a"), copies=[copy]))
    assert summary(again, grant.target_name) == {"a": IN_SYNC}


# -- desired_copy ---------------------------------------------------------------------------------


def test_desired_copy_metadata() -> None:
    grant = make_grant(
        target_name="contract",
        labels={"team": "data"},
        annotations={"note": "hello"},
        on_revoke=RETAIN,
        on_source_deleted=OnSourceDeleted.DELETE,
    )
    d = desired_of(grant, S)
    assert d.name == "contract"
    assert d.type == "Opaque"
    assert d.data == S.data
    assert d.labels == {"team": "data", MANAGED_BY_LABEL: "projector", GRANT_LABEL: "g"}
    assert d.annotations == {
        "note": "hello",
        GRANT_UID_ANNOTATION: "uid-g",
        SOURCE_ANNOTATION: "src/hub",
        ON_REVOKE_ANNOTATION: "Retain",
        ON_SOURCE_DELETED_ANNOTATION: "Delete",
        GRANT_METADATA_ANNOTATION: '{"labels":["team"],"annotations":["note"]}',
        HASH_ANNOTATION: d.hash,
    }
    meta_without_hash = {k: v for k, v in d.annotations.items() if k != HASH_ANNOTATION}
    assert d.hash == content_hash(d.type, d.data, d.labels, meta_without_hash)
    # the grant's extra metadata, kept apart: values checked key by key; only which keys are
    # the grant's is recorded (GRANT_METADATA_ANNOTATION), and so part of core_hash
    assert d.extra_labels == {"team": "data"}
    assert d.extra_annotations == {"note": "hello"}
    assert d.core_hash == content_hash(
        d.type, d.data, own_metadata(d.labels), own_metadata(meta_without_hash)
    )
    assert d.core_hash != d.hash


def test_desired_copy_reserved_keys_cannot_be_overridden() -> None:
    """Even a grant built around parse_grant's check cannot claim another owner."""
    grant = replace(
        G,
        labels=((GRANT_LABEL, "other"), (MANAGED_BY_LABEL, "me")),
        annotations=((GRANT_UID_ANNOTATION, "uid-other"), (HASH_ANNOTATION, "sha256:x")),
    )
    d = desired_of(grant, S)
    assert d.labels[GRANT_LABEL] == "g"
    assert d.labels[MANAGED_BY_LABEL] == "projector"
    assert d.annotations[GRANT_UID_ANNOTATION] == "uid-g"
    assert d.annotations[HASH_ANNOTATION] == d.hash


def test_desired_copy_does_not_alias_source_data() -> None:
    source = make_source()
    d = desired_of(G, source)
    assert d.data == source.data
    assert d.data is not source.data


def test_desired_hash_is_the_same_in_every_namespace() -> None:
    d = desired_of(make_grant(labels={"team": "data"}, annotations={"note": "x"}), S)
    copies = [copy_from(d, ns) for ns in ("a", "b", "team-zzz")]
    assert {c.observed_hash for c in copies} == {d.core_hash}
    assert {c.annotations[HASH_ANNOTATION] for c in copies} == {d.hash}
    assert all(d.in_sync(c) for c in copies)
    assert d.manifest("a")["data"] == d.manifest("b")["data"]


def test_desired_hash_without_extra_metadata_is_the_core_hash() -> None:
    d = desired_of(G, S)
    assert d.hash == d.core_hash
    assert d.extra_labels == {}
    assert d.extra_annotations == {}


D_EXTRA = desired_of(make_grant(labels={"team": "data"}, annotations={"note": "x"}), S)


@pytest.mark.parametrize(
    ("copy", "in_sync"),
    [
        pytest.param(copy_from(D_EXTRA, "a"), True, id="as-written"),
        pytest.param(copy_from(D_EXTRA, "a", labels={"x": "1"}), True, id="foreign-label"),
        pytest.param(copy_from(D_EXTRA, "a", annotations={"y": "2"}), True, id="foreign-note"),
        pytest.param(copy_from(D_EXTRA, "a", labels={"team": None}), False, id="extra-removed"),
        pytest.param(copy_from(D_EXTRA, "a", labels={"team": "x"}), False, id="extra-changed"),
        pytest.param(copy_from(D_EXTRA, "a", annotations={"note": None}), False, id="note-removed"),
        pytest.param(copy_from(D_EXTRA, "a", labels={GRANT_LABEL: "x"}), False, id="our-label"),
        pytest.param(
            copy_from(D_EXTRA, "a", annotations={SOURCE_ANNOTATION: "x/y"}), False, id="our-note"
        ),
        pytest.param(
            copy_from(D_EXTRA, "a", annotations={HASH_ANNOTATION: None}), False, id="hash-removed"
        ),
        pytest.param(
            copy_from(D_EXTRA, "a", annotations={HASH_ANNOTATION: D_EXTRA.core_hash}),
            False,
            id="hash-annotation-is-the-core-hash",
        ),
        pytest.param(copy_from(D_EXTRA, "a", data={"token": b64("x")}), False, id="data"),
        pytest.param(copy_from(D_EXTRA, "a", type_="example.com/x"), False, id="type"),
        pytest.param(copy_from(D_EXTRA, "a", immutable=True), True, id="immutable-same-content"),
        pytest.param(
            copy_from(desired_of(G, S), "a", labels={"team": "data"}, annotations={"note": "x"}),
            False,
            id="written-by-the-grant-before-it-had-extras",
        ),
    ],
)
def test_desired_in_sync(copy: Copy, in_sync: bool) -> None:
    assert D_EXTRA.in_sync(copy) is in_sync
    assert D_EXTRA.echo().in_sync(copy) is in_sync  # what the controller keeps tells the same


def test_update_manifest_keeps_what_others_added_and_restores_ours() -> None:
    grant = make_grant(namespaces=("a",), labels={"team": "data"}, annotations={"note": "x"})
    d = desired_of(grant, S)
    stored = copy_from(
        d,
        "a",
        labels={"app": "x", "team": "tampered", GRANT_LABEL: None},
        annotations={"webhook.example.com/injected": "1", SOURCE_ANNOTATION: "x/y", "note": None},
        data={"token": b64("edited")},
    )
    p = plan(make_snapshot(grant, S, namespaces=namespaces("a"), copies=[stored]))
    (update,) = p.writes
    assert (update.action, update.reason) == UPDATED
    m = d.manifest("a", stored.resource_version, keep=stored)
    meta = m["metadata"]
    assert isinstance(meta, dict)
    assert meta["resourceVersion"] == "7"
    assert meta["labels"] == {**d.labels, "app": "x"}
    assert meta["annotations"] == {**d.annotations, "webhook.example.com/injected": "1"}
    assert m["data"] == dict(S.data)
    written = parse_copy(stored_manifest(m))
    assert written.grant_uid == grant.uid
    assert d.in_sync(written)
    again = plan(make_snapshot(grant, S, namespaces=namespaces("a"), copies=[written]))
    assert summary(again, grant.target_name) == {"a": IN_SYNC}


def test_grant_metadata_removed_from_the_spec_leaves_the_copies() -> None:
    before = make_grant(namespaces=("a",), labels={"team": "data"}, annotations={"note": "x"})
    after = make_grant(namespaces=("a",))
    snap = make_snapshot(
        after, S, namespaces=namespaces("a"), copies=[copy_from(desired_of(before, S), "a")]
    )
    p = plan(snap)
    assert summary(p, after.target_name) == {"a": UPDATED}
    (copy,) = simulate(snap, p).copies.values()
    assert "team" not in copy.labels
    assert "note" not in copy.annotations


def test_reserved_keys_in_grant_metadata_still_converge() -> None:
    grant = replace(
        G,
        labels=((GRANT_LABEL, "other"),),
        annotations=((GRANT_UID_ANNOTATION, "uid-other"),),
    )
    snap = make_snapshot(grant, S, namespaces=namespaces("a"))
    first = plan(snap)
    assert summary(first, grant.target_name) == {"a": CREATED, "b": NS_MISSING}
    assert plan(simulate(snap, first)).writes == ()


TLS = make_source(type_="kubernetes.io/tls", data={"tls.crt": b64("crt"), "tls.key": b64("key")})


@pytest.mark.parametrize(
    ("keys", "source", "data", "type_"),
    [
        pytest.param(None, TLS, TLS.data, "kubernetes.io/tls", id="all-keys-type-kept"),
        pytest.param(
            [("tls.crt", "tls.crt"), ("tls.key", "tls.key")],
            TLS,
            TLS.data,
            "kubernetes.io/tls",
            id="every-key-listed-unrenamed-type-kept",
        ),
        pytest.param(
            [("tls.key", "tls.key"), ("tls.crt", "tls.crt")],
            TLS,
            TLS.data,
            "kubernetes.io/tls",
            id="order-does-not-matter",
        ),
        pytest.param(
            [("tls.crt", "tls.crt")], TLS, {"tls.crt": b64("crt")}, "Opaque", id="partial-opaque"
        ),
        pytest.param(
            [("tls.crt", "cert"), ("tls.key", "tls.key")],
            TLS,
            {"cert": b64("crt"), "tls.key": b64("key")},
            "Opaque",
            id="renamed-opaque",
        ),
        pytest.param(
            [("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("tls.crt", "ca.crt")],
            TLS,
            {**TLS.data, "ca.crt": b64("crt")},
            "Opaque",
            id="every-key-plus-a-duplicate-opaque",
        ),
        pytest.param(
            [("token", "api-token")], S, {"api-token": S.data["token"]}, "Opaque", id="filter"
        ),
        pytest.param(
            None,
            make_source(type_="kubernetes.io/dockerconfigjson", data={".dockerconfigjson": "e30="}),
            {".dockerconfigjson": "e30="},
            "kubernetes.io/dockerconfigjson",
            id="other-typed-source-kept",
        ),
    ],
)
def test_desired_copy_keys_and_type(
    keys: list[tuple[str, str]] | None, source: Source, data: dict[str, str], type_: str
) -> None:
    d = desired_of(make_grant(keys=keys), source)
    assert dict(d.data) == data
    assert d.type == type_


def test_desired_copy_names_the_first_missing_key() -> None:
    grant = make_grant(keys=[("token", "t"), ("nope", "n"), ("also-nope", "a")])
    assert desired_copy(grant, S) == "nope"


@pytest.mark.parametrize(
    ("grant", "source"),
    [
        pytest.param(
            G, make_source(data={"token": b64("t1"), "url": b64("http://hub")}), id="value"
        ),
        pytest.param(G, make_source(data={**S.data, "new": b64("x")}), id="key-added"),
        pytest.param(G, make_source(type_="example.com/x"), id="type"),
        pytest.param(G, make_source(name="other"), id="source-name"),
        pytest.param(make_grant(labels={"x": "1"}), S, id="grant-labels"),
        pytest.param(make_grant(annotations={"x": "1"}), S, id="grant-annotations"),
        pytest.param(make_grant(on_revoke=RETAIN), S, id="on-revoke"),
        pytest.param(
            make_grant(on_source_deleted=OnSourceDeleted.DELETE), S, id="on-source-deleted"
        ),
        pytest.param(make_grant(uid="uid-other"), S, id="grant-uid"),
        pytest.param(make_grant(name="other"), S, id="grant-name"),
        pytest.param(make_grant(keys=[("token", "token"), ("url", "link")]), S, id="key-renamed"),
    ],
)
def test_desired_hash_changes_with_what_the_copy_holds(grant: Grant, source: Source) -> None:
    assert desired_of(grant, source).hash != desired_of(G, S).hash


@pytest.mark.parametrize(
    ("grant", "source", "core_changes"),
    [
        pytest.param(G, make_source(data={"token": b64("t1")}), True, id="value"),
        pytest.param(G, make_source(type_="example.com/x"), True, id="type"),
        pytest.param(G, make_source(name="other"), True, id="source-name"),
        pytest.param(make_grant(on_revoke=RETAIN), S, True, id="on-revoke"),
        pytest.param(make_grant(uid="uid-other"), S, True, id="grant-uid"),
        pytest.param(make_grant(name="other"), S, True, id="grant-name"),
        pytest.param(make_grant(labels={"x": "1"}), S, True, id="grant-label-keys"),
        pytest.param(make_grant(annotations={"x": "1"}), S, True, id="grant-annotation-keys"),
    ],
)
def test_desired_core_hash_covers_content_and_our_metadata_only(
    grant: Grant, source: Source, core_changes: bool
) -> None:
    """Grant extras' values are checked key by key (in_sync); their keys are recorded in our
    grant-metadata annotation, so they are part of the core hash."""
    assert (desired_of(grant, source).core_hash != desired_of(G, S).core_hash) is core_changes


@pytest.mark.parametrize(
    ("grant", "source"),
    [
        pytest.param(make_grant(generation=9), S, id="generation"),
        pytest.param(make_grant(namespaces=("x", "y")), S, id="targets"),
        pytest.param(make_grant(selector={"pack": "x"}), S, id="selector"),
        pytest.param(make_grant(created=T1), S, id="created"),
        pytest.param(G, make_source(export_to="a,b"), id="export-to"),
        pytest.param(
            G, make_source(data={"url": b64("http://hub"), "token": b64("t0")}), id="key-order"
        ),
        pytest.param(
            make_grant(keys=[("token", "token"), ("url", "url")]), S, id="explicit-all-keys"
        ),
        pytest.param(replace(G, uid=Uid("uid-g")), S, id="same-values"),
    ],
)
def test_desired_hash_ignores_what_the_copy_does_not_hold(grant: Grant, source: Source) -> None:
    assert desired_of(grant, source).hash == desired_of(G, S).hash


def test_manifest() -> None:
    d = desired_of(G, S)
    m = d.manifest("a")
    assert m == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "hub",
            "namespace": "a",
            "labels": dict(d.labels),
            "annotations": dict(d.annotations),
        },
        "type": "Opaque",
        "data": dict(S.data),
    }
    assert "immutable" not in m  # copies stay mutable, so later source versions can land
    meta = d.manifest("a", "42")["metadata"]
    assert isinstance(meta, dict)
    assert meta["resourceVersion"] == "42"
    data = m["data"]
    assert isinstance(data, dict)
    data["token"] = "changed"
    assert d.data["token"] == S.data["token"]  # the manifest is a copy


# -- properties -----------------------------------------------------------------------------------
# Random worlds over a small pool of names, so that targets, export-to patterns, rivals and
# copies with random owners collide often. Each draw picks a whole tuple from a precomputed
# product: drawing field by field costs hypothesis far more time than planning does.


def subsets(items: tuple[str, ...], max_size: int) -> list[frozenset[str]]:
    return [frozenset(c) for n in range(max_size + 1) for c in itertools.combinations(items, n)]


POOL = (SRC_NS, "a", "b", "team-a", "team-b", "dev")
PATTERNS = ("*", "team-*", "a", "b", "src", "nope", "dev")
OTHER_LIVE = "uid-other-live"
DEAD = "uid-dead"
TARGET_NAMES = (SRC_NAME, "contract")
TEAM = {"team": "data"}
DESIRED_POOL = {
    (name, version): desired_of(make_grant(target_name=name, labels=labels), source)
    for name in TARGET_NAMES
    for version, source, labels in (("now", S, None), ("old", S_OLD, None), ("team", S, TEAM))
}
"""Copies are edited from these, so their hashes sometimes match what the grant wants."""
# Hypothesis favours the first entry of a sampled list, so lists start with worlds where
# copies get written, and some entries repeat to weight the draw.
NS_STATES: tuple[tuple[dict[str, str], bool] | None, ...] = (
    ({"pack": "x"}, False),
    ({}, False),
    None,  # absent
    ({"pack": "y"}, False),
    ({"pack": "x"}, True),  # terminating
)
SELECTORS = (
    None,
    LabelSelector(),
    LabelSelector((("pack", "x"),)),
    LabelSelector((), (("pack", "NotIn", ("y",)),)),
)
KEYS = (None, None, (("token", "token"),), (("token", "t"), ("url", "url")), (("nope", "x"),))
FOREIGN_LABELS = {"app.kubernetes.io/part-of": "x"}
FOREIGN_NOTES = {"webhook.example.com/injected": "true"}

namespaces_st = st.sampled_from(list(itertools.product(NS_STATES, repeat=len(POOL))))
grant_st = st.tuples(
    st.sampled_from(
        [frozenset({"a", "b", "team-a"})] * 8 + subsets((*POOL, "missing"), 3)  # listed targets
    ),
    st.sampled_from(
        list(
            itertools.product(
                SELECTORS,
                KEYS,
                TARGET_NAMES,
                OnRevoke,
                OnSourceDeleted,
                [False] * 4 + [True],  # the grant is being deleted
                [None, TEAM],  # target.labels
            )
        )
    ),
)
SA_TOKEN_TYPE = "kubernetes.io/service-account-token"
source_st = st.sampled_from(
    list(
        itertools.product(
            [("*",)] * 8
            + [("team-*", "a")] * 4
            + [tuple(sorted(p)) for p in subsets(PATTERNS, 2)],  # export-to
            [S.data, S_OLD.data, {"token": b64("x")}],
            ["Opaque", "example.com/x", SA_TOKEN_TYPE],
            # REFUSED is the planner's own reading of an available source, never a snapshot's
            [
                *(s for s in SourceState if s is not SourceState.REFUSED),
                *[SourceState.AVAILABLE] * 5,
            ],
            [True, True, True, False],  # the source is in the snapshot (even Available may lack it)
            [False] * 5 + [True],  # the grant is deleted (grant=None)
        )
    )
)
rivals_st = st.lists(
    st.sampled_from(
        list(
            itertools.product(
                ["r", "z"],
                [T_OLD, T0, T1],
                [frozenset({"a", "b", "team-a"}), *subsets(POOL, 2)[1:]],
                [False, True],
            )
        )
    ),
    max_size=2,
    unique_by=lambda r: r[0],
)
orphan_st = st.sampled_from(
    list(itertools.product(("a", "team-a"), OnRevoke, ("missing", "denied"), (S, S_ELSEWHERE)))
)
"""An earlier grant `g` left a copy (its recorded policy, of our source or another) where the
live grant aims but may not write: the source is missing, or the producer does not export there."""
copies_st = st.lists(
    st.sampled_from(
        list(
            itertools.product(
                ("a", "team-a", "b", "dev", SRC_NS, "team-b"),
                [True, True, True, False],  # at the grant's target name (else at the other one)
                ["now", "old", "team"],
                ["uid-g", "uid-g", OTHER_LIVE, DEAD, None, "", "uid-r", "uid-z"],  # owner
                ["g", "other", None],  # grant label
                ["Delete", "Retain", "garbage", None],  # recorded on-revoke policy
                ["Opaque", "example.com/x"],
                [False, True],  # being deleted
                ["as-written", "as-written", "foreign-metadata", "immutable", "uid-by-hand"],
            )
        )
    ),
    min_size=1,
    max_size=6,
)


@st.composite
def snapshots(draw: st.DrawFn, *, orphaned: bool = False) -> Snapshot:
    """A world with a live, deleting or deleted (None) grant `g`, and any source state.

    Half of the worlds are writing ones (a live grant, an exported source, every namespace
    there), where the copies found at the target decide: ownership, drift, rivals. `orphaned`
    worlds add an earlier grant's copy where the live grant aims but may not write.
    """
    writing = not orphaned and draw(st.booleans())
    orphan = draw(orphan_st) if orphaned else None
    nss = {
        n: make_ns(n, state[0], terminating=state[1])
        for n, state in zip(POOL, draw(namespaces_st), strict=True)
        if state is not None
    }
    if writing:
        nss = {n: nss[n] if n in nss and not nss[n].terminating else make_ns(n) for n in POOL}
    listed, (selector, keys, target_name, on_revoke, on_source_deleted, deleting, labels) = draw(
        grant_st
    )
    deleting = deleting and not writing and orphan is None
    if orphan is not None:  # the orphan's place: existing, live, and aimed at by the grant
        listed = listed | {orphan[0]}
        nss[orphan[0]] = make_ns(orphan[0])
    grant = make_grant(
        namespaces=listed if listed or selector else {"a"},
        selector=selector,
        keys=keys,
        target_name=target_name,
        labels=labels,
        on_revoke=on_revoke,
        on_source_deleted=on_source_deleted,
        deleting=deleting,
    )
    export_to, data, type_, state, cached, deleted = draw(source_st)
    if writing:  # a source that can be projected: a credential of the cluster never is
        export_to, state, cached, deleted = ("*",), SourceState.AVAILABLE, True, False
        type_ = "Opaque" if type_ == SA_TOKEN_TYPE else type_
    source = make_source(export_to=export_to, data=data, type_=type_)
    rivals = [  # like the store's rivals: other grants with the same target name
        make_grant(
            name,
            created=created,
            namespaces=targets,
            target_name=target_name,
            deleting=rival_deleting,
        )
        for name, created, targets, rival_deleting in draw(rivals_st)
    ]
    copies: dict[ObjectKey, Copy] = {}
    for ns, at_target, version, owner, label, policy, copy_type, copy_deleting, edit in draw(
        copies_st
    ):
        name = target_name if at_target else next(n for n in TARGET_NAMES if n != target_name)
        foreign = edit == "foreign-metadata"
        c = copy_from(
            DESIRED_POOL[name, version],
            ns,
            type_=copy_type,
            labels={GRANT_LABEL: label, **(FOREIGN_LABELS if foreign else {})},
            annotations={
                GRANT_UID_ANNOTATION: owner,
                ON_REVOKE_ANNOTATION: policy,
                **(FOREIGN_NOTES if foreign else {}),
            },
            deleting=copy_deleting,
            immutable=edit == "immutable",
            uid_written_by=BY_HAND if edit == "uid-by-hand" else FIELD_MANAGER,
        )
        copies[c.key] = c
    if orphan is not None:
        place, on_revoke_then, refusal, source_then = orphan
        if refusal == "missing":
            state, cached, deleted = SourceState.MISSING, False, False
        else:
            state, cached, deleted = SourceState.AVAILABLE, True, False
            source = make_source(export_to=("nope",), data=data, type_=type_)
        then = make_grant(uid=DEAD, target_name=target_name, on_revoke=on_revoke_then)
        c = copy_from(desired_of(then, source_then), place)
        copies[c.key] = c
    live = {OTHER_LIVE} | {r.uid for r in rivals} | (set() if deleted else {grant.uid})
    return Snapshot(
        grant_name=grant.name,
        grant=None if deleted else grant,
        source=source if cached else None,
        source_state=state,
        namespaces=nss,
        copies=copies,
        live_grant_uids=frozenset(live),
        rivals=tuple(rivals),
        rival_sources={source.key: source},
    )


FAST = settings(max_examples=200, deadline=None, derandomize=True, database=None)


def source_known(snap: Snapshot) -> bool:
    """The source is authoritatively known: read (Available, and in the snapshot) or absent."""
    if snap.source_state is SourceState.UNKNOWN:
        return False
    return not (snap.source_state is SourceState.AVAILABLE and snap.source is None)


def allowed_namespaces(snap: Snapshot) -> set[str]:
    """Grant targets, and export-to, minus the source namespace; existing, live namespaces."""
    g, s = snap.grant, snap.source
    if g is None or g.deleting or s is None or snap.source_state is not SourceState.AVAILABLE:
        return set()
    return {
        n
        for n, ns in snap.namespaces.items()
        if g.targets(n, ns.labels)
        and s.exports_to(n)
        and n != g.source.namespace
        and not ns.terminating
    }


def rival_wants(snap: Snapshot, rival: Grant, namespace: str) -> bool:
    """Admin and producer both want the rival's copy in `namespace` (DESIGN: the older wins)."""
    ns = snap.namespaces.get(namespace)
    source = snap.rival_sources.get(rival.source)
    return (
        ns is not None
        and namespace != rival.source.namespace
        and rival.targets(namespace, ns.labels)
        and source is not None
        and source.exports_to(namespace)
    )


def owner_of(copy: Copy) -> str | None:
    """The grant-uid mark, if projector's field manager wrote it (else no owner at all)."""
    return copy.annotations.get(GRANT_UID_ANNOTATION) if copy.marked_by_projector else None


def may_overwrite(snap: Snapshot, copy: Copy) -> bool:
    """Ours to write: our uid; an orphan of our name (a non-empty uid of no live grant) that we
    would write the same (same source and name); or the copy of a younger live grant that still
    wants it there. Never anything else."""
    g, owner = snap.grant, owner_of(copy)
    assert g is not None
    if not owner:
        return False
    if owner == g.uid:
        return True
    if owner not in snap.live_grant_uids:  # an orphan: only the very copy this grant writes
        return (
            copy.labels.get(GRANT_LABEL) == g.name
            and copy.key.name == g.target_name
            and copy.annotations.get(SOURCE_ANNOTATION) == str(g.source)
        )
    return any(
        r.uid == owner and r.seniority > g.seniority and rival_wants(snap, r, copy.key.namespace)
        for r in snap.rivals
    )


def may_delete(snap: Snapshot, copy: Copy) -> bool:
    """Ours to delete by the policy that governs it, and not already being deleted.

    The live grant's own copy: by its policy (onRevoke, or onSourceDeleted once the source is
    gone). An orphan of our name (its grant deleted) or a copy of a grant being deleted: only
    by the onRevoke recorded on the copy, whatever the grant that reuses the name says.
    """
    owner, g = owner_of(copy), snap.grant
    if not owner or copy.deleting:
        return False
    if g is not None and not g.deleting and owner == g.uid:
        return g.on_revoke is OnRevoke.DELETE or (
            snap.source_state is SourceState.MISSING
            and g.on_source_deleted is OnSourceDeleted.DELETE
        )
    ours = (g is not None and owner == g.uid) or (
        owner not in snap.live_grant_uids and copy.labels.get(GRANT_LABEL) == snap.grant_name
    )
    return ours and copy.annotations.get(ON_REVOKE_ANNOTATION) == OnRevoke.DELETE.value


def refused_orphans(snap: Snapshot) -> list[Copy]:
    """Orphans of our name at places the live grant targets but may not serve: the source is
    missing, or the producer does not export there (where the reported data loss happened)."""
    g, s = snap.grant, snap.source
    if g is None or g.deleting:
        return []
    refused = snap.source_state is SourceState.MISSING
    found = []
    for c in snap.copies.values():
        owner, ns = owner_of(c), snap.namespaces.get(c.key.namespace)
        if (
            owner
            and owner not in snap.live_grant_uids
            and c.labels.get(GRANT_LABEL) == g.name
            and c.key.name == g.target_name
            and ns is not None
            and not ns.terminating
            and ns.name != g.source.namespace
            and g.targets(ns.name, ns.labels)
            and (refused or (s is not None and not s.exports_to(ns.name)))
        ):
            found.append(c)
    return found


@pytest.fixture
def kinds_of_plans() -> Iterator[Counter[str]]:
    """What the generated worlds made the planner do, checked once every example has run: a
    safety property over worlds that never write, delete or conflict would pass vacuously."""
    seen: Counter[str] = Counter()
    yield seen
    n = seen["examples"]
    assert n >= 100, seen
    # The derandomized worlds still vary with the process's string hash seed (PYTHONHASHSEED:
    # some set's order reaches the strategies; not found which): updates 7 to 32 of 200 and
    # deletes 7 to 18 were seen. 3% holds for every seed seen, and is far from vacuous.
    for kind, share in (("writes", 0.5), ("creates", 0.4), ("updates", 0.03), ("deletes", 0.03)):
        assert seen[kind] >= share * n, f"only {seen[kind]} of {n} worlds had {kind}: {seen}"
    assert seen["conflicts"] >= 0.1 * n, seen


@settings(FAST, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(snap=snapshots())
def test_property_plan_is_safe(snap: Snapshot, kinds_of_plans: Counter[str]) -> None:
    """Whatever the world, data lands only where admin and producer agree, and no delete
    touches another live grant's copy or happens on an unknown source; plans converge."""
    p = plan(snap)
    actions = {s.action for s in p.writes}
    kinds_of_plans.update(
        ["examples"]
        + (["writes"] if p.writes else [])
        + (["creates"] if A.CREATE in actions else [])
        + (["updates"] if A.UPDATE in actions or A.REPLACE in actions else [])
        + (["deletes"] if A.DELETE in actions else [])
        + (["conflicts"] if any(s.reason is R.CONFLICT for s in p.steps) else [])
    )
    check_steps(snap, p)
    allowed = allowed_namespaces(snap)
    live_grant = snap.grant is not None and not snap.grant.deleting
    if live_grant and not source_known(snap):
        assert p.source_state is SourceState.UNKNOWN
        assert p.desired is None
    for s in p.writes:
        if s.action is A.DELETE:
            assert s.existing is not None
            assert may_delete(snap, s.existing), s
            if live_grant:
                assert source_known(snap), s
        else:
            assert s.namespace in allowed, s
            assert snap.grant is not None and s.name == snap.grant.target_name
            assert p.desired is not None
            if s.existing is not None and not may_overwrite(snap, s.existing):
                # only an orphan its recorded policy deletes makes way for our copy
                assert s.action is A.REPLACE and may_delete(snap, s.existing), s
            elif s.existing is not None:  # never overwrite what is not ours, nor a dying copy
                assert not s.existing.deleting, s
                # the API refuses a type change or any update of an immutable Secret
                must_replace = s.existing.immutable or s.existing.type != p.desired.type
                assert (s.action is A.REPLACE) is must_replace, s
    assert plan(simulate(snap, p)).writes == ()


@FAST
@given(snap=snapshots(orphaned=True))
def test_property_an_orphan_follows_the_policy_recorded_on_it(snap: Snapshot) -> None:
    """The reported data loss: an earlier grant's copy, where a grant that reuses its name aims
    but may not write (source missing, or not exported there), is deleted exactly when the
    policy recorded on it says Delete, whatever the new grant's policy; nothing else is."""
    orphans = refused_orphans(snap)
    assert orphans, "every world of this generator has such an orphan"
    p = plan(snap)
    deleted = {ObjectKey(s.namespace, s.name) for s in p.writes if s.action is A.DELETE}
    for s in p.writes:
        assert s.action is not A.DELETE or (s.existing and may_delete(snap, s.existing)), s
    for c in orphans:
        recorded = c.annotations.get(ON_REVOKE_ANNOTATION)
        assert (c.key in deleted) is (recorded == "Delete" and not c.deleting), (c, p.steps)


def with_metadata_of_others(c: Copy) -> Copy:
    """The copy after another tool (or a mutating webhook) added its labels and annotations."""
    return replace(
        c,
        labels={**c.labels, "other.example.com/owner": "x"},
        annotations={**c.annotations, "other.example.com/seen": "1"},
    )


@FAST
@given(snapshots())
def test_property_metadata_others_add_changes_no_decision(snap: Snapshot) -> None:
    """The controller never fights other tools over labels and annotations outside its own."""
    decorated = replace(
        snap,
        copies={k: with_metadata_of_others(c) for k, c in snap.copies.items()},
    )

    def decisions(p: Plan) -> list[tuple[str, str, Action, Reason]]:
        return [(s.namespace, s.name, s.action, s.reason) for s in p.steps]

    assert decisions(plan(decorated)) == decisions(plan(snap))


@settings(FAST, max_examples=100, phases=[Phase.generate])
@given(snapshots())
def test_property_never_touches_a_secret_without_grant_uid(snap: Snapshot) -> None:
    for s in plan(snap).writes:
        if s.existing is not None:
            assert s.existing.annotations.get(GRANT_UID_ANNOTATION), s
            assert s.existing.marked_by_projector, s


def test_grant_extra_values_are_not_in_the_core_hash() -> None:
    """Changing only a value of a grant's extra label is seen by in_sync, not by core_hash."""
    one, two = make_grant(labels={"x": "1"}), make_grant(labels={"x": "2"})
    assert desired_of(one, S).core_hash == desired_of(two, S).core_hash
    assert desired_of(one, S).hash != desired_of(two, S).hash


def test_no_secret_value_in_a_repr() -> None:
    """A value must not leak through a log line or an exception that formats these objects."""
    source = make_source(data={"token": b64("repr-canary")})
    desired = desired_of(G, source)
    for obj in (source, desired, plan(make_snapshot(G, source, namespaces=namespaces("a")))):
        text = repr(obj)
        assert b64("repr-canary") not in text and "repr-canary" not in text
