"""Pure: from a reconcile's outcomes to the grant's status and its Events.

The only place a status is shaped. A status is written at most once per reconcile, and only
when it differs from the stored one (ignoring transition times), so a controller restart over
an up-to-date cluster writes nothing. Nothing here ever sees a Secret value: outcomes carry
reasons and namespace names only.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from projector.core.exports import LABEL, Export, consented
from projector.core.model import GrantRecord, Source
from projector.core.plans import (
    FAILURE_REASONS,
    Action,
    Outcome,
    Plan,
    Reason,
    Result,
    SourceState,
    verdict,
)

MAX_FAILURES = 20
"""Bound on status.failures, so a grant over 10,000 namespaces keeps a small status."""

FAILURE_ORDER = (
    Reason.WRITE_FAILED,
    Reason.CONFLICT,
    Reason.GRANT_CONFLICT,
    Reason.KEY_MISSING,
    Reason.KEY_NOT_EXPORTED,
    Reason.NAMESPACE_MISSING,
    Reason.PROTECTED_NAMESPACE,
    Reason.SOURCE_NAMESPACE,
)
"""Which failures status.failures lists first when there are more than it keeps: a write the
server refuses, then an object in the way, then a grant's own mistakes (a key, a namespace);
every failure reason is named here (a unit test checks it)."""
_SEVERITY = {reason: i for i, reason in enumerate(FAILURE_ORDER)}
_LAST = len(FAILURE_ORDER)
FAILURES_OMITTED = "failuresOmitted"
"""How many failures status.failures leaves out (absent when it lists them all)."""


@dataclass(frozen=True, slots=True)
class Event:
    """A reason-coded Event to record on the grant."""

    type: str  # Normal | Warning
    reason: str
    message: str


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _targets(matched: int = 0, projected: int = 0, conflicted: int = 0, denied: int = 0) -> Any:
    return {"matched": matched, "projected": projected, "conflicted": conflicted, "denied": denied}


def invalid(rec: GrantRecord) -> dict[str, Any]:
    """The status of a grant whose spec cannot be acted on (nothing is written for it)."""
    return {
        "observedGeneration": rec.generation,
        "conditions": [
            _condition("Ready", False, "InvalidSpec", rec.invalid or "", rec.generation)
        ],
        "targets": _targets(),
        "failures": [],
    }


def is_ready(status: Mapping[str, Any]) -> bool:
    """Tell whether a status says Ready=True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in status["conditions"])


def compute(plan: Plan, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Summarise outcomes into status: conditions, counts and a bounded failures list.

    A failing grant's status says that it is retried with backoff, and Ready's
    lastTransitionTime when it started failing; the attempt count and the next wait change on
    every retry, so they are metrics (projector_grant_retries, projector_grant_retry_delay_seconds)
    rather than a status write per retry.
    """
    grant = plan.grant
    generation = grant.generation if grant else 0
    counts = Counter(o.reason for o in outcomes)
    projected = counts[Reason.PROJECTED]
    conflicted = counts[Reason.CONFLICT] + counts[Reason.GRANT_CONFLICT]
    denied = counts[Reason.DENIED]
    missing = counts[Reason.NAMESPACE_MISSING]
    errors = [o for o in outcomes if o.reason is Reason.WRITE_FAILED]
    source_ok, source_reason, source_msg = _source(plan, counts[Reason.KEY_MISSING], outcomes)
    kind = _kind(plan)
    if not source_ok:
        ready, reason, message = False, source_reason, source_msg
    elif errors:
        ready, reason, message = False, Reason.WRITE_FAILED.value, f"{len(errors)} write(s) failed"
    elif conflicted:
        ready, reason, message = False, Reason.CONFLICT.value, f"{conflicted} namespace(s) conflict"
    elif plan.matched and projected == 0 and denied:
        ready, reason, message = False, Reason.DENIED.value, "the producer exports to none"
    elif plan.matched and projected == 0 and missing:
        ready, reason = False, Reason.NAMESPACE_MISSING.value
        message = f"{missing} target namespace(s) do not exist"
    else:
        ready, reason, message = True, Reason.PROJECTED.value, f"projected to {projected}"
        if missing:
            message = f"{message}; {missing} target namespace(s) do not exist"
    if verdict(plan, outcomes).result is Result.ERROR:
        message = f"{message}; {RETRIED}"
    conditions = [
        _condition("Ready", ready, reason, message, generation),
        _condition("SourceAvailable", source_ok, source_reason, source_msg, generation),
        _condition(
            "Conflicted",
            conflicted > 0,
            Reason.CONFLICT.value if conflicted else "NoConflict",
            f"{conflicted} namespace(s) hold a {kind} this grant may not write",
            generation,
        ),
    ]
    failures, omitted = _failures(outcomes)
    out: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "targets": _targets(plan.matched, projected, conflicted, denied),
        "failures": failures,
    }
    if omitted:  # absent when none: a status stored before the field was added is unchanged
        out[FAILURES_OMITTED] = omitted
    return out


def _source(plan: Plan, keys_missing: int, outcomes: Sequence[Outcome]) -> tuple[bool, str, str]:
    """The SourceAvailable condition: available with every granted key, reason, message."""
    grant, kind = plan.grant, _kind(plan)
    refused = next((o.message for o in outcomes if o.reason is Reason.KEY_NOT_EXPORTED), "")
    if plan.source_state is SourceState.AVAILABLE and refused:
        source_reason, source_msg = Reason.KEY_NOT_EXPORTED.value, refused
    elif plan.source_state is SourceState.AVAILABLE and keys_missing:
        source_reason, source_msg = Reason.KEY_MISSING.value, "the source lacks a granted key"
    else:
        source_reason = plan.source_state.value
        source_msg = {
            SourceState.AVAILABLE: f"the source {kind} is exported",
            SourceState.NOT_EXPORTED: f"the source {kind} lacks the export label",
            SourceState.MISSING: f"the source {kind} does not exist"
            + (
                "; copies deleted"
                if grant is not None and grant.on_source_deleted.value == "Delete"
                else "; last good copies kept"
            ),
            SourceState.UNKNOWN: f"the source {kind} could not be read",
            SourceState.REFUSED: _refused(plan),
        }[plan.source_state]
    source = plan.snapshot.source
    if source is not None and source.export_to_refused:
        source_msg = f"{source_msg}; {source.export_to_refused}"
    if source is not None and source.ignored_export_to:
        ignored = ", ".join(source.ignored_export_to)[:200]
        source_msg = f"{source_msg}; {IGNORED_EXPORT_TO}{ignored}"
    if source is not None and source.export_keys_refused:
        source_msg = f"{source_msg}; {source.export_keys_refused}"
    ok = plan.source_state is SourceState.AVAILABLE and keys_missing == 0 and not refused
    return ok, source_reason, source_msg


def _refused(plan: Plan) -> str:
    source = plan.snapshot.source
    if source is not None:
        return source.refused
    return f"{_kind(plan)} grants are not served by this controller (--no-configmaps)"


def _kind(plan: Plan) -> str:
    """What the grant projects, for messages: Secret or ConfigMap."""
    return plan.grant.kind.value if plan.grant is not None else "Secret"


def _failures(outcomes: Iterable[Outcome]) -> tuple[list[dict[str, str]], int]:
    """The failures an admin must act on, at most MAX_FAILURES, and how many more there are.

    The most severe first (`FAILURE_ORDER`), then by namespace: with 10,000 namespaces
    missing, a write the server refuses is still listed.
    """
    failing = [o for o in outcomes if o.reason in FAILURE_REASONS]
    listed = heapq.nsmallest(
        MAX_FAILURES, failing, key=lambda o: (_SEVERITY.get(o.reason, _LAST), o.namespace)
    )
    failures = [
        {"namespace": o.namespace, "reason": o.reason.value, "message": o.message} for o in listed
    ]
    return failures, len(failing) - len(listed)


def stamped(new: Mapping[str, Any], old: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """`new` with lastTransitionTime on each condition: kept from `old` where its status held."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or ()}
    conditions = []
    for c in new["conditions"]:
        prev = before.get(c["type"])
        kept = prev is not None and prev.get("status") == c["status"]
        since = prev.get("lastTransitionTime") if kept and prev is not None else None
        conditions.append({**c, "lastTransitionTime": since or now})
    out = {**new, "conditions": conditions}
    if FAILURES_OMITTED not in out and FAILURES_OMITTED in (old or {}):
        out[FAILURES_OMITTED] = None  # a merge patch keeps what it does not name; null drops it
    return out


def unchanged(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Tell whether writing `new` would change nothing but timestamps."""
    if not old:
        return False

    def strip(s: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in s.get("conditions") or ()
        ]
        return out

    return strip(new) == strip(old)


STATE_REASONS = frozenset(
    {
        "InvalidSpec",
        SourceState.NOT_EXPORTED.value,
        SourceState.MISSING.value,
        SourceState.UNKNOWN.value,
        SourceState.REFUSED.value,
        Reason.DENIED.value,
    }
)
"""Ready=False reasons about the grant as a whole, told by one Event when Ready turns to them
(per-namespace failures, NamespaceMissing included, have their own Events)."""


RETRIED = "retried with backoff"
"""Ready's message of a failing grant ends so; how many tries and the next wait are metrics."""

IGNORED_EXPORT_TO = "export-to entries that match no namespace: "
"""How SourceAvailable's message names the source's unusable export-to entries."""


def _stored(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any]:
    for c in (status or {}).get("conditions") or ():
        if c.get("type") == type_:
            return dict(c)
    return {}


def _ignored_export_to(status: Mapping[str, Any] | None) -> str:
    message = str(_stored(status, "SourceAvailable").get("message", ""))
    return message.partition(IGNORED_EXPORT_TO)[2]


def events(
    outcomes: Iterable[Outcome],
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None = None,
) -> list[Event]:
    """Events for what changed: writes, failures, Ready False, unusable export-to entries.

    Writes are aggregated; a failure already in the stored status is not told again; Ready
    turning False for a reason about the whole grant, or the source's unusable export-to
    entries, are told once, not at every reconcile.
    """
    done = Counter(o.step.action for o in outcomes if o.written)
    out: list[Event] = []
    now, before = _stored(new, "Ready"), _stored(old, "Ready")
    if (
        now.get("status") == "False"
        and now.get("reason") in STATE_REASONS
        and (before.get("status"), before.get("reason")) != ("False", now["reason"])
    ):
        out.append(Event("Warning", now["reason"], str(now.get("message", ""))))
    ignored = _ignored_export_to(new)
    if ignored and ignored != _ignored_export_to(old):
        out.append(
            Event("Warning", "InvalidExportTo", f"the source's {IGNORED_EXPORT_TO}{ignored}")
        )
    for action, verb in (
        (Action.CREATE, "Created"),
        (Action.UPDATE, "Updated"),
        (Action.REPLACE, "Replaced"),
        (Action.DELETE, "Deleted"),
    ):
        n = done[action]
        if n:
            out.append(Event("Normal", verb, f"{verb.lower()} {n} cop{'y' if n == 1 else 'ies'}"))
    known = {(f.get("namespace"), f.get("reason")) for f in (old or {}).get("failures") or ()}
    for f in _failures(outcomes)[0]:  # the same bounded list the status keeps: no repeats
        if (f["namespace"], f["reason"]) not in known:
            out.append(
                Event("Warning", f["reason"], f"{f['namespace']}: {f['message']}".rstrip(": "))
            )
    return out


# --- a ProjectionExport's status -------------------------------------------------------------

MAX_GRANTS_LISTED: Final = 20
"""Grant names an export's status lists at most (the count of copies covers them all)."""

_SOURCE_FOUND = {
    SourceState.AVAILABLE: ("True", "Found", "the source exists and is read"),
    SourceState.REFUSED: ("True", "SourceRefused", "the source exists but may never be projected"),
    SourceState.MISSING: ("False", "SourceMissing", "the source does not exist"),
}


def export_status(
    export: Export, state: SourceState | None, grants: Iterable[str], copies: int
) -> dict[str, Any]:
    """What a ProjectionExport's status says, from names and counts only (never a value).

    Does its source exist, which grants project it (those of this very source: nothing of
    other producers), and how many namespaces hold a copy it lets in.
    """
    found, reason, message = _SOURCE_FOUND.get(
        state or SourceState.UNKNOWN, ("Unknown", "SourceUnknown", "no grant reads it yet")
    )
    if export.refused:
        message = f"{message}; {export.refused}"
    condition = {
        "type": "SourceFound",
        "status": found,
        "reason": reason,
        "message": message,
        "observedGeneration": export.generation,
    }
    return {
        "observedGeneration": export.generation,
        "conditions": [condition],
        "grants": sorted(grants)[:MAX_GRANTS_LISTED],
        "copies": copies,
    }


def copies_by_export(
    source: Source | None, exports: Sequence[Export], projected: Iterable[str]
) -> Counter[str]:
    """How many of the `projected` namespaces each export (`namespace/name`) lets the copy into.

    One consent per namespace, whatever the number of exports: a tenant's thousand exports of
    one source cost a pass over the namespaces, not a thousand.
    """
    counts: Counter[str] = Counter()
    for ns in projected:
        if (got := consented(source, exports, ns)) is not None:
            counts.update(v.removeprefix("export ") for v in got.via if v != LABEL)
    return counts
