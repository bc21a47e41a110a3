"""The pure core's values: the snapshot a plan reads, the steps it decides, their outcomes.

Also the codes they carry (`SourceState`, `Action`, `Reason`): status, Events and metrics name
them; and the verdict the outcomes give the work queue (`verdict`: done, retry, recheck).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from enum import StrEnum

from projector.core.desired import Desired
from projector.core.exports import Export
from projector.core.model import Copy, Grant, GrantRecord, Namespace, ObjectKey, Source, SourceKind


class SourceState(StrEnum):
    """What we know of the grant's source Secret."""

    AVAILABLE = "Available"
    NOT_EXPORTED = "NotExported"
    """It exists but lacks the export label: the producer has not (or no longer) opted in."""
    MISSING = "SourceMissing"
    """The API said 404: authoritative evidence that the source is gone."""
    UNKNOWN = "Unknown"
    """A read failed: nothing may be deleted on this."""
    REFUSED = "SourceRefused"
    """It exists and is exported, but may never be a source (`Source.refused`): a credential
    of the cluster, or a copy projector wrote."""


class Action(StrEnum):
    """What the writer does in one namespace."""

    CREATE = "Create"
    UPDATE = "Update"
    REPLACE = "Replace"
    """Delete then create: the API forbids changing a Secret's type in place."""
    DELETE = "Delete"
    NOOP = "NoOp"
    """Nothing to write: in sync, retained, denied, conflicted or waiting."""


class Reason(StrEnum):
    """Why a namespace is in the state it is in; status and Events use these codes."""

    PROJECTED = "Projected"
    DENIED = "Denied"
    CONFLICT = "Conflict"
    GRANT_CONFLICT = "GrantConflict"
    SOURCE_NAMESPACE = "SourceNamespace"
    PROTECTED_NAMESPACE = "ProtectedNamespace"
    NAMESPACE_MISSING = "NamespaceMissing"
    TERMINATING = "NamespaceTerminating"
    SOURCE_MISSING = "SourceMissing"
    KEY_MISSING = "KeyMissing"
    KEY_NOT_EXPORTED = "KeyNotExported"
    SOURCE_UNKNOWN = "SourceUnknown"
    REVOKED = "Revoked"
    RETAINED = "Retained"
    COPY_DELETING = "CopyDeleting"
    WRITE_FAILED = "WriteFailed"


def conflict_message(kind: SourceKind) -> str:
    """Why a place is not written: an object of the copy's kind there is not this grant's."""
    return f"a {kind.value} of that name exists and is not owned by this grant"


ORPHAN_MESSAGE = "an earlier grant of this name left a copy of another source here"
ORPHAN_DELETED = (
    "an earlier grant of this name left a copy of another source; deleted by its policy"
)

FAILURE_REASONS = frozenset(
    {
        Reason.CONFLICT,
        Reason.GRANT_CONFLICT,
        Reason.SOURCE_NAMESPACE,
        Reason.PROTECTED_NAMESPACE,
        Reason.NAMESPACE_MISSING,
        Reason.KEY_MISSING,
        Reason.KEY_NOT_EXPORTED,
        Reason.WRITE_FAILED,
    }
)
"""Reasons that an admin must act on; they are listed in the grant's status.failures (a listed
namespace that does not exist is most often a typo in the grant)."""


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
    desired: Desired | None = None
    """The copy a namespace both consents grant should hold (its keys are the producer's
    scope there); None where nothing is to be held."""


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
    protected: AbstractSet[str] = frozenset()
    """Namespaces never written into, whatever the grant targets (`Config.protected`)."""
    exports: Mapping[ObjectKey, tuple[Export, ...]] = field(default_factory=dict)
    """The ProjectionExports naming the grant's source and its rivals' sources, by source."""

    def exports_of(self, key: ObjectKey) -> tuple[Export, ...]:
        """The exports that name source `key` (none: the label path alone may consent)."""
        return self.exports.get(key, ())


class Result(StrEnum):
    """What a reconcile tells the work queue (controller-runtime's Result, as data)."""

    OK = "success"
    """Done: forget the key's failures."""
    RECHECK = "recheck"
    """Done, but look again later: a conflicting object is not cached, so no event will come."""
    ERROR = "error"
    """Retry with per-key exponential backoff."""
    UNHEALTHY = "requeue"
    """A cache may be behind the server: nothing was done; retry shortly."""

    @property
    def metric(self) -> str:
        """The `result` label of projector_reconcile_total."""
        return Result.OK.value if self is Result.RECHECK else self.value


@dataclass(frozen=True)
class Verdict:
    """What the work queue should do with a grant after its reconcile.

    `retry_after` is the longest wait the server asked of a throttled write (Retry-After): the
    queue's backoff for an ERROR never cuts it short.
    """

    result: Result
    retry_after: float = 0.0


def verdict(plan: Plan, outcomes: Sequence[Outcome]) -> Verdict:
    """Retry failed writes and unreadable sources; look again later at conflicts."""
    reasons = {o.reason for o in outcomes}
    if Reason.WRITE_FAILED in reasons or (
        plan.grant is not None and plan.source_state is SourceState.UNKNOWN
    ):
        return Verdict(Result.ERROR, max((o.retry_after for o in outcomes), default=0.0))
    if Reason.CONFLICT in reasons:
        return Verdict(Result.RECHECK)
    return Verdict(Result.OK)
