"""Pure: from a reconcile's outcomes to the grant's status and the Events worth telling.

A status is written at most once per reconcile, and only when it differs from the stored one
(ignoring transition times), so a controller restart over an up-to-date cluster writes nothing.
Nothing here ever sees a Secret value: outcomes carry reasons and namespace names only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from projector.reconcile import FAILURE_REASONS, Action, Outcome, Plan, Reason, SourceState

MAX_FAILURES = 20
"""Bound on status.failures, so a grant over 10,000 namespaces keeps a small status."""


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


def compute(plan: Plan, outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Summarise outcomes into status: conditions, counts and a bounded failures list."""
    grant = plan.grant
    generation = grant.generation if grant else 0
    counts = Counter(o.reason for o in outcomes)
    projected = counts[Reason.PROJECTED]
    conflicted = counts[Reason.CONFLICT] + counts[Reason.GRANT_CONFLICT]
    denied = counts[Reason.DENIED]
    failures = _failures(outcomes)
    errors = [o for o in outcomes if o.reason is Reason.WRITE_FAILED]
    source_ok = plan.source_state is SourceState.AVAILABLE and counts[Reason.KEY_MISSING] == 0
    if plan.source_state is SourceState.AVAILABLE and counts[Reason.KEY_MISSING]:
        source_reason, source_msg = Reason.KEY_MISSING.value, "the source lacks a granted key"
    else:
        source_reason = plan.source_state.value
        source_msg = {
            SourceState.AVAILABLE: "the source Secret is exported",
            SourceState.NOT_EXPORTED: "the source Secret lacks the export label",
            SourceState.MISSING: "the source Secret does not exist"
            + (
                "; copies deleted"
                if grant is not None and grant.on_source_deleted.value == "Delete"
                else "; last good copies kept"
            ),
            SourceState.UNKNOWN: "the source Secret could not be read",
        }[plan.source_state]
    if not source_ok:
        ready, reason, message = False, source_reason, source_msg
    elif errors:
        ready, reason, message = False, Reason.WRITE_FAILED.value, f"{len(errors)} write(s) failed"
    elif conflicted:
        ready, reason, message = False, Reason.CONFLICT.value, f"{conflicted} namespace(s) conflict"
    elif plan.matched and projected == 0 and denied:
        ready, reason, message = False, Reason.DENIED.value, "the producer exports to none"
    else:
        ready, reason, message = True, Reason.PROJECTED.value, f"projected to {projected}"
    conditions = [
        _condition("Ready", ready, reason, message, generation),
        _condition("SourceAvailable", source_ok, source_reason, source_msg, generation),
        _condition(
            "Conflicted",
            conflicted > 0,
            Reason.CONFLICT.value if conflicted else "NoConflict",
            f"{conflicted} namespace(s) hold a Secret this grant may not write",
            generation,
        ),
    ]
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "targets": {
            "matched": plan.matched,
            "projected": projected,
            "conflicted": conflicted,
            "denied": denied,
        },
        "failures": failures,
    }


def _failures(outcomes: Iterable[Outcome]) -> list[dict[str, str]]:
    """The failures an admin must act on, sorted by namespace, at most MAX_FAILURES."""
    failing = sorted(
        (o for o in outcomes if o.reason in FAILURE_REASONS), key=lambda o: o.namespace
    )
    return [
        {"namespace": o.namespace, "reason": o.reason.value, "message": o.message}
        for o in failing[:MAX_FAILURES]
    ]


def merge_transition_times(new: dict[str, Any], old: Mapping[str, Any] | None, now: str) -> None:
    """Stamp lastTransitionTime: kept from `old` where a condition's status did not change."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or ()}
    for c in new["conditions"]:
        prev = before.get(c["type"])
        if (
            prev is not None
            and prev.get("status") == c["status"]
            and prev.get("lastTransitionTime")
        ):
            c["lastTransitionTime"] = prev["lastTransitionTime"]
        else:
            c["lastTransitionTime"] = now


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


def events(outcomes: Iterable[Outcome], old: Mapping[str, Any] | None) -> list[Event]:
    """Events for what changed: writes done (aggregated) and failures not already reported."""
    done = Counter(o.step.action for o in outcomes if o.written)
    out: list[Event] = []
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
    for f in _failures(outcomes):  # the same bounded list the status keeps: no repeats
        if (f["namespace"], f["reason"]) not in known:
            out.append(
                Event("Warning", f["reason"], f"{f['namespace']}: {f['message']}".rstrip(": "))
            )
    return out
