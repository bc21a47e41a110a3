"""From outcomes to a grant's status and Events: counts, conditions, bounded failures, no churn."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from projector.core.model import Grant, OnSourceDeleted
from projector.core.plans import FAILURE_REASONS, Action, Outcome, Plan, Reason, SourceState, Step
from projector.core.reconcile import plan
from projector.core.status import (
    FAILURE_ORDER,
    FAILURES_OMITTED,
    MAX_FAILURES,
    Event,
    compute,
    events,
    stamped,
    unchanged,
)
from tests.unit.factories import (
    SRC_NS,
    T0,
    T1,
    b64,
    copy_from,
    desired_of,
    foreign_secret,
    make_grant,
    make_snapshot,
    make_source,
    namespaces,
)

A, R = Action, Reason
G = make_grant(generation=4)
AVAILABLE = SourceState.AVAILABLE


def outcome(
    namespace: str,
    reason: Reason,
    action: Action = A.NOOP,
    *,
    written: bool = False,
    message: str = "",
) -> Outcome:
    return Outcome(Step(namespace, action, reason, name="hub"), reason, message, written)


def a_plan(state: SourceState = AVAILABLE, matched: int = 0, grant: Grant | None = G) -> Plan:
    return Plan(make_snapshot(grant, None, state=state, grant_name="g"), state, None, (), matched)


def executed(p: Plan) -> list[Outcome]:
    """Outcomes of a writer that succeeded at every step."""
    return [Outcome(s, s.reason, s.message, s.action is not A.NOOP) for s in p.steps]


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


# -- compute --------------------------------------------------------------------------------------


def test_counts() -> None:
    outs = [
        outcome("a", R.PROJECTED, A.CREATE, written=True),
        outcome("b", R.PROJECTED),
        outcome("c", R.PROJECTED, A.UPDATE, written=True),
        outcome("d", R.CONFLICT),
        outcome("e", R.GRANT_CONFLICT),
        outcome("f", R.DENIED),
        outcome("g", R.DENIED, A.DELETE, written=True),
        outcome("h", R.NAMESPACE_MISSING),
        outcome("i", R.TERMINATING),
        outcome("j", R.RETAINED),
    ]
    status = compute(a_plan(matched=9), outs)
    assert status["targets"] == {"matched": 9, "projected": 3, "conflicted": 2, "denied": 2}


OK_TRUE = ("True", "Projected")
NO_CONFLICT = ("False", "NoConflict")
CONFLICTED = ("True", "Conflict")
SOURCE_OK = ("True", "Available")


def no(reason: str) -> tuple[str, str]:
    """A condition that is False for `reason`."""
    return ("False", reason)


def row(
    id_: str,
    state: SourceState,
    reasons: str,
    matched: int,
    ready: tuple[str, str],
    source: tuple[str, str] = SOURCE_OK,
    conflicted: tuple[str, str] = NO_CONFLICT,
) -> Any:
    """One case: the namespaces a, b, ... end with `reasons` (names of `Reason`), in order."""
    outs = [outcome(ns, R[r]) for ns, r in zip("abcdefghij", reasons.split(), strict=False)]
    expected = {"Ready": ready, "SourceAvailable": source, "Conflicted": conflicted}
    return pytest.param(state, outs, matched, expected, id=id_)


@pytest.mark.parametrize(
    ("state", "outs", "matched", "expected"),
    [
        row("all-projected", AVAILABLE, "PROJECTED PROJECTED", 2, OK_TRUE),
        row("nothing-matched-yet", AVAILABLE, "", 0, OK_TRUE),
        row("some-denied", AVAILABLE, "PROJECTED DENIED", 2, OK_TRUE),
        row("producer-exports-to-none", AVAILABLE, "DENIED NAMESPACE_MISSING", 2, no("Denied")),
        row(
            "namespaces-missing-or-terminating",
            AVAILABLE,
            "NAMESPACE_MISSING TERMINATING",
            2,
            no("NamespaceMissing"),
        ),
        row("terminating-only", AVAILABLE, "TERMINATING", 1, OK_TRUE),
        row("some-projected-some-missing", AVAILABLE, "PROJECTED NAMESPACE_MISSING", 2, OK_TRUE),
        row("conflict", AVAILABLE, "PROJECTED CONFLICT", 2, no("Conflict"), conflicted=CONFLICTED),
        row(
            "grant-conflict", AVAILABLE, "GRANT_CONFLICT", 1, no("Conflict"), conflicted=CONFLICTED
        ),
        row(
            "write-failed-before-conflict",
            AVAILABLE,
            "WRITE_FAILED CONFLICT",
            2,
            no("WriteFailed"),
            conflicted=CONFLICTED,
        ),
        row(
            "key-missing",
            AVAILABLE,
            "KEY_MISSING KEY_MISSING",
            2,
            no("KeyMissing"),
            source=no("KeyMissing"),
        ),
        row(
            "source-missing-before-write-failed",
            SourceState.MISSING,
            "SOURCE_MISSING WRITE_FAILED",
            2,
            no("SourceMissing"),
            source=no("SourceMissing"),
        ),
        row(
            "not-exported",
            SourceState.NOT_EXPORTED,
            "DENIED",
            1,
            no("NotExported"),
            source=no("NotExported"),
        ),
        row(
            "source-unknown",
            SourceState.UNKNOWN,
            "SOURCE_UNKNOWN",
            1,
            no("Unknown"),
            source=no("Unknown"),
        ),
        row(
            "source-unknown-and-conflict",
            SourceState.UNKNOWN,
            "CONFLICT",
            1,
            no("Unknown"),
            source=no("Unknown"),
            conflicted=CONFLICTED,
        ),
    ],
)
def test_conditions(
    state: SourceState,
    outs: list[Outcome],
    matched: int,
    expected: dict[str, tuple[str, str]],
) -> None:
    status = compute(a_plan(state, matched), outs)
    assert conditions(status) == expected
    assert [c["type"] for c in status["conditions"]] == ["Ready", "SourceAvailable", "Conflicted"]
    for c in status["conditions"]:
        assert set(c) == {"type", "status", "reason", "message", "observedGeneration"}
        assert c["message"]


@pytest.mark.parametrize(
    ("grant", "message"),
    [
        pytest.param(
            make_grant(on_source_deleted=OnSourceDeleted.RETAIN),
            "the source Secret does not exist; last good copies kept",
            id="retain",
        ),
        pytest.param(
            make_grant(on_source_deleted=OnSourceDeleted.DELETE),
            "the source Secret does not exist; copies deleted",
            id="delete",
        ),
        pytest.param(
            None, "the source Secret does not exist; last good copies kept", id="no-grant"
        ),
    ],
)
def test_source_missing_message_follows_the_policy(grant: Grant | None, message: str) -> None:
    status = compute(a_plan(SourceState.MISSING, 1, grant), [outcome("a", R.SOURCE_MISSING)])
    by_type = {c["type"]: c for c in status["conditions"]}
    assert SourceState.MISSING.value == "SourceMissing"
    assert by_type["SourceAvailable"]["reason"] == "SourceMissing"
    assert by_type["SourceAvailable"]["message"] == message
    assert by_type["Ready"]["message"] == message


def test_messages_count_what_they_describe() -> None:
    status = compute(a_plan(matched=3), [outcome(n, R.CONFLICT) for n in "abc"])
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["message"] == "3 namespace(s) conflict"
    assert by_type["Conflicted"]["message"].startswith("3 namespace(s)")
    status = compute(a_plan(matched=2), [outcome(n, R.PROJECTED) for n in "ab"])
    assert {c["type"]: c for c in status["conditions"]}["Ready"]["message"] == "projected to 2"


@pytest.mark.parametrize(
    ("grant", "generation"),
    [
        pytest.param(make_grant(generation=7), 7, id="grant"),
        pytest.param(None, 0, id="grant-deleted"),
    ],
)
def test_observed_generation(grant: Grant | None, generation: int) -> None:
    status = compute(a_plan(grant=grant), [outcome("a", R.PROJECTED)])
    assert status["observedGeneration"] == generation
    assert {c["observedGeneration"] for c in status["conditions"]} == {generation}


def test_failures_list_only_what_an_admin_must_act_on() -> None:
    outs = [outcome(f"ns-{r.value.lower()}", r, message=f"why {r.value}") for r in Reason]
    status = compute(a_plan(matched=len(outs)), outs)
    assert {f["reason"] for f in status["failures"]} == {r.value for r in FAILURE_REASONS}
    for f in status["failures"]:
        assert f == {
            "namespace": f"ns-{f['reason'].lower()}",
            "reason": f["reason"],
            "message": f"why {f['reason']}",
        }


def test_failures_sorted_by_namespace() -> None:
    outs = [outcome(n, R.CONFLICT) for n in ("zeta", "alpha", "mid")]
    outs.insert(1, outcome("beta", R.PROJECTED))
    status = compute(a_plan(matched=4), outs)
    assert [f["namespace"] for f in status["failures"]] == ["alpha", "mid", "zeta"]


def test_failures_bounded_keeps_the_first_in_order() -> None:
    names = [f"ns-{i:02}" for i in range(MAX_FAILURES + 5)]
    outs = [outcome(n, R.CONFLICT) for n in reversed(names)]
    status = compute(a_plan(matched=len(names)), outs)
    assert MAX_FAILURES == 20
    assert [f["namespace"] for f in status["failures"]] == names[:MAX_FAILURES]
    assert status["targets"]["conflicted"] == len(names)  # counts are not bounded
    assert status[FAILURES_OMITTED] == 5  # and the status says how many it left out


def test_failures_list_the_most_severe_first_then_by_namespace() -> None:
    """With more failures than the status keeps, the admin sees the ones that matter most: a
    write the server refused is listed even behind 10,000 missing namespaces (issue 36)."""
    assert set(FAILURE_ORDER) == FAILURE_REASONS  # every failure has its place
    missing = [outcome(f"aa-{i:05}", R.NAMESPACE_MISSING) for i in range(10_000)]
    worst = [
        outcome("zz-refused", R.WRITE_FAILED, message="500"),
        outcome("zz-taken", R.CONFLICT),
        outcome("yy-rival", R.GRANT_CONFLICT),
        outcome("xx-key", R.KEY_MISSING),
        outcome("src", R.SOURCE_NAMESPACE),
    ]
    status = compute(a_plan(matched=len(missing) + len(worst)), [*missing, *worst])
    listed = [(f["reason"], f["namespace"]) for f in status["failures"]]
    assert listed[:4] == [
        ("WriteFailed", "zz-refused"),
        ("Conflict", "zz-taken"),
        ("GrantConflict", "yy-rival"),
        ("KeyMissing", "xx-key"),
    ]
    assert listed[4:] == [("NamespaceMissing", f"aa-{i:05}") for i in range(MAX_FAILURES - 4)]
    assert status[FAILURES_OMITTED] == len(missing) + len(worst) - MAX_FAILURES


def test_failures_omitted_is_absent_when_all_are_listed_and_dropped_once_it_is_not_needed() -> None:
    """A status stored before the count existed is unchanged (no write on upgrade); a count
    no longer needed is removed by the merge patch (null), then nothing is written again."""
    few = [outcome(f"ns-{i}", R.CONFLICT) for i in range(MAX_FAILURES)]
    many = [*few, outcome("ns-zz", R.CONFLICT)]
    assert FAILURES_OMITTED not in compute(a_plan(matched=len(few)), few)
    old = stamped(compute(a_plan(matched=len(many)), many), None, T0)
    assert old[FAILURES_OMITTED] == 1
    new = stamped(compute(a_plan(matched=len(few)), few), old, T1)
    assert new[FAILURES_OMITTED] is None and not unchanged(new, old)
    stored = {k: v for k, v in new.items() if v is not None}  # what the server keeps
    again = stamped(compute(a_plan(matched=len(few)), few), stored, T1)
    assert FAILURES_OMITTED not in again and unchanged(again, stored)


def test_status_is_json_and_holds_no_secret_value() -> None:
    secret = "hunter2-very-secret"
    source = make_source(data={"token": b64(secret)})
    grant = make_grant(namespaces=("a", "b", "c", "d", SRC_NS))
    d = desired_of(grant, make_source())
    copies = [copy_from(d, "b"), foreign_secret("c")]
    snap = make_snapshot(grant, source, namespaces=namespaces("a", "b", "c"), copies=copies)
    p = plan(snap)
    outs = executed(p)
    assert {s.action for s in p.steps} == {A.CREATE, A.UPDATE, A.NOOP}
    text = json.dumps([compute(p, outs), [dataclasses.asdict(e) for e in events(outs, None)]])
    assert secret not in text
    assert b64(secret) not in text


# -- unchanged and transition times ---------------------------------------------------------------


BASE = compute(a_plan(matched=2), [outcome("a", R.PROJECTED), outcome("b", R.CONFLICT)])


@pytest.mark.parametrize(
    ("new", "old", "same"),
    [
        pytest.param(BASE, None, False, id="no-old-status"),
        pytest.param(BASE, {}, False, id="empty-old-status"),
        pytest.param(BASE, copy.deepcopy(BASE), True, id="equal"),
        pytest.param(
            stamped(BASE, None, T1),
            stamped(BASE, None, T0),
            True,
            id="only-transition-times-differ",
        ),
        pytest.param(BASE, stamped(BASE, None, T0), True, id="old-has-times-new-not-yet"),
        pytest.param(
            compute(a_plan(matched=2), [outcome("a", R.PROJECTED), outcome("b", R.PROJECTED)]),
            BASE,
            False,
            id="counts-and-conditions-differ",
        ),
        pytest.param(
            compute(a_plan(matched=3), [outcome("a", R.PROJECTED), outcome("b", R.CONFLICT)]),
            BASE,
            False,
            id="matched-differs",
        ),
        pytest.param(
            compute(
                a_plan(matched=2, grant=make_grant(generation=5)),
                [outcome("a", R.PROJECTED), outcome("b", R.CONFLICT)],
            ),
            BASE,
            False,
            id="generation-differs",
        ),
        pytest.param(
            compute(
                a_plan(matched=2),
                [outcome("a", R.PROJECTED), outcome("b", R.CONFLICT, message="other text")],
            ),
            BASE,
            False,
            id="failure-message-differs",
        ),
    ],
)
def test_unchanged(new: dict[str, Any], old: dict[str, Any] | None, same: bool) -> None:
    assert unchanged(new, old) is same


def test_unchanged_does_not_mutate() -> None:
    new, old = stamped(BASE, None, T1), stamped(BASE, None, T0)
    before = copy.deepcopy((new, old))
    unchanged(new, old)
    assert (new, old) == before


def times(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}


def test_stamped_first_status() -> None:
    new = stamped(BASE, None, T0)
    assert "lastTransitionTime" not in BASE["conditions"][0]  # the input is left alone
    assert times(new) == {"Ready": T0, "SourceAvailable": T0, "Conflicted": T0}


def test_stamped_keeps_times_of_unchanged_statuses() -> None:
    old = stamped(BASE, None, T0)
    resolved = compute(a_plan(matched=2), [outcome("a", R.PROJECTED), outcome("b", R.PROJECTED)])
    resolved = stamped(resolved, old, T1)
    # Ready and Conflicted flipped; SourceAvailable did not
    assert times(resolved) == {"Ready": T1, "SourceAvailable": T0, "Conflicted": T1}


def test_stamped_same_status_new_reason_keeps_time() -> None:
    old = stamped(compute(a_plan(matched=1), [outcome("a", R.CONFLICT)]), None, T0)
    new = stamped(compute(a_plan(matched=1), [outcome("a", R.WRITE_FAILED)]), old, T1)
    assert conditions(new)["Ready"] == ("False", "WriteFailed")
    assert times(new)["Ready"] == T0  # lastTransitionTime follows status, not reason


@pytest.mark.parametrize(
    "old_conditions",
    [
        pytest.param([{"type": "Ready", "status": "True"}], id="old-without-time"),
        pytest.param([{"type": "Ready", "status": "True", "lastTransitionTime": ""}], id="empty"),
        pytest.param([], id="old-without-conditions"),
        pytest.param(None, id="old-conditions-null"),
    ],
)
def test_stamped_stamps_now_when_old_has_no_time(
    old_conditions: list[dict[str, str]] | None,
) -> None:
    new = compute(a_plan(matched=1), [outcome("a", R.PROJECTED)])
    new = stamped(new, {"conditions": old_conditions}, T1)
    assert times(new)["Ready"] == T1


# -- events ---------------------------------------------------------------------------------------


def test_events_aggregate_writes_in_a_fixed_order() -> None:
    outs = [
        outcome("a", R.REVOKED, A.DELETE, written=True),
        outcome("b", R.PROJECTED, A.UPDATE, written=True),
        outcome("c", R.PROJECTED, A.CREATE, written=True),
        outcome("d", R.PROJECTED, A.CREATE, written=True),
        outcome("e", R.PROJECTED, A.REPLACE, written=True),
        outcome("f", R.PROJECTED),
    ]
    assert events(outs, None) == [
        Event("Normal", "Created", "created 2 copies"),
        Event("Normal", "Updated", "updated 1 copy"),
        Event("Normal", "Replaced", "replaced 1 copy"),
        Event("Normal", "Deleted", "deleted 1 copy"),
    ]


def test_events_skip_writes_that_did_not_happen() -> None:
    outs = [
        outcome("a", R.WRITE_FAILED, A.CREATE, written=False, message="403 Forbidden"),
        outcome("b", R.PROJECTED, A.NOOP),
    ]
    assert events(outs, None) == [Event("Warning", "WriteFailed", "a: 403 Forbidden")]


def test_events_report_new_failures_only() -> None:
    old = {
        "failures": [
            {"namespace": "a", "reason": "Conflict", "message": "taken"},
            {"namespace": "b", "reason": "KeyMissing", "message": "no key"},
        ]
    }
    outs = [
        outcome("a", R.CONFLICT, message="taken"),  # already reported
        outcome("b", R.GRANT_CONFLICT, message="older grant r"),  # same namespace, new reason
        outcome("c", R.SOURCE_NAMESPACE),  # new, no message
        outcome("d", R.DENIED),  # not a failure
    ]
    assert events(outs, old) == [
        Event("Warning", "GrantConflict", "b: older grant r"),
        Event("Warning", "SourceNamespace", "c"),
    ]


def test_events_none_when_nothing_changed() -> None:
    outs = [outcome("a", R.PROJECTED), outcome("b", R.CONFLICT, message="taken")]
    old = compute(a_plan(matched=2), outs)
    assert events(outs, old) == []


def test_events_none_when_nothing_changed_beyond_the_failure_bound() -> None:
    outs = [outcome(f"ns-{i:02}", R.CONFLICT, message="taken") for i in range(MAX_FAILURES + 5)]
    old = compute(a_plan(matched=len(outs)), outs)
    assert events(outs, old) == []


def test_events_report_failures_from_the_bounded_sorted_list() -> None:
    """Warnings come from the list the status keeps: the first MAX_FAILURES by severity, then
    by namespace."""
    names = [f"ns-{i:02}" for i in range(MAX_FAILURES + 5)]
    outs = [outcome(n, R.CONFLICT, message="taken") for n in reversed(names)]
    assert events(outs, None) == [
        Event("Warning", "Conflict", f"{n}: taken") for n in names[:MAX_FAILURES]
    ]
    old = compute(a_plan(matched=len(outs)), outs)
    # a new failure sorting after the bound is not in the status, so it is not told either;
    # one sorting before it (more severe, or an earlier namespace) enters the status, and is
    # told once
    late = [*outs, outcome("zz-late", R.CONFLICT, message="taken")]
    assert events(late, old) == []
    early = [*outs, outcome("zz-refused", R.WRITE_FAILED, message="500")]
    assert events(early, old) == [Event("Warning", "WriteFailed", "zz-refused: 500")]
    assert events(early, compute(a_plan(matched=len(early)), early)) == []


# -- the whole loop -------------------------------------------------------------------------------


def reconcile_status(
    snap_copies: Sequence[Any], old: dict[str, Any] | None, now: str
) -> tuple[dict[str, Any], bool, list[Event]]:
    grant = make_grant(namespaces=("a", "b", "c"), generation=2)
    source = make_source()
    snap = make_snapshot(grant, source, namespaces=namespaces("a", "b", "c"), copies=snap_copies)
    p = plan(snap)
    outs = executed(p)
    new = stamped(compute(p, outs), old, now)
    return new, unchanged(new, old), events(outs, old)


def test_restart_over_an_up_to_date_cluster_writes_no_status_and_no_event() -> None:
    d = desired_of(make_grant(namespaces=("a", "b", "c"), generation=2), make_source())
    synced = [copy_from(d, "a"), copy_from(d, "b"), foreign_secret("c")]
    first, same, evs = reconcile_status(synced, None, T0)
    assert not same
    assert evs == [Event("Warning", "Conflict", f"c: {first['failures'][0]['message']}")]
    again, same, evs = reconcile_status(synced, first, T1)
    assert same
    assert evs == []
    assert again == first  # times kept: nothing transitioned


def test_first_projection_status_and_events() -> None:
    status, same, evs = reconcile_status([], None, T0)
    assert not same
    assert status["targets"] == {"matched": 3, "projected": 3, "conflicted": 0, "denied": 0}
    assert conditions(status)["Ready"] == OK_TRUE
    assert evs == [Event("Normal", "Created", "created 3 copies")]


def test_a_failing_grant_says_it_is_retried_in_words_that_do_not_change_per_retry() -> None:
    new = compute(a_plan(matched=1), [outcome("a", R.WRITE_FAILED)])
    assert conditions(new)["Ready"] == ("False", "WriteFailed")
    ready = next(c for c in new["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "1 write(s) failed; retried with backoff"


def test_ignored_export_to_entries_are_reported() -> None:
    source = make_source(export_to=("a", "!b", "-c"))
    source = dataclasses.replace(source, ignored_export_to=("!b", "-c"))
    p = plan(make_snapshot(G, source, namespaces=namespaces("a")))
    new = compute(p, executed(p))
    available = next(c for c in new["conditions"] if c["type"] == "SourceAvailable")
    assert available["message"].endswith("export-to entries that match no namespace: !b, -c")
    told = [e for e in events(executed(p), None, new) if e.reason == "InvalidExportTo"]
    assert [e.type for e in told] == ["Warning"] and "!b, -c" in told[0].message
    again = compute(p, executed(p))
    assert not [e for e in events(executed(p), new, again) if e.reason == "InvalidExportTo"]
    other = dataclasses.replace(make_source(export_to=("a", "!d")), ignored_export_to=("!d",))
    p2 = plan(make_snapshot(G, other, namespaces=namespaces("a")))
    changed = compute(p2, executed(p2))  # other entries: told again
    assert [e for e in events(executed(p2), new, changed) if e.reason == "InvalidExportTo"]


@pytest.mark.parametrize(
    ("state", "outs", "reason"),
    [
        pytest.param(SourceState.MISSING, [outcome("a", R.SOURCE_MISSING)], "SourceMissing"),
        pytest.param(SourceState.NOT_EXPORTED, [outcome("a", R.DENIED)], "NotExported"),
        pytest.param(AVAILABLE, [outcome("a", R.NAMESPACE_MISSING)], "NamespaceMissing"),
        pytest.param(AVAILABLE, [outcome("a", R.DENIED)], "Denied"),
    ],
)
def test_an_unsatisfiable_grant_is_told_by_one_event(
    state: SourceState, outs: list[Outcome], reason: str
) -> None:
    """Ready turning False for a grant-wide reason is one Warning; the next reconcile, none."""
    new = compute(a_plan(state, matched=1), outs)
    first = events(outs, None, new)
    assert [(e.type, e.reason) for e in first if e.reason == reason] == [("Warning", reason)]
    assert [e for e in events(outs, new, new) if e.reason == reason] == []
