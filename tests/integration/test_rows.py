"""DESIGN §3 rows tested where they bite: the narrow side of each change, not only the easy one.

Each test asserts a state that differs from the one before its action, so a controller that
never processed the action cannot pass it.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.launcher import ControllerProcess
from tests.support import (
    Cluster,
    NamespaceFactory,
    audit_writes,
    consistently,
    eventually,
    unique_name,
)

DATA = {"token": "ROWS-canary-1"}


def revoked_by(k8s: Cluster, policy: str, ns: str, *, kept: str) -> None:
    """The copy in `ns` went (Delete) or stayed as it was (Retain); the one in `kept` stayed."""
    if policy == "Delete":
        eventually(lambda: k8s.copy(ns, "hub") is None)
    else:
        assert k8s.copy_data(ns, "hub") == DATA
    assert k8s.copy_data(kept, "hub") == DATA


def denied(k8s: Cluster, grant: str) -> int:
    return int(k8s.status(grant)["targets"]["denied"])


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_narrowing_export_to_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to=f"{a},{b}")
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(a, "hub") == DATA and k8s.copy_data(b, "hub") == DATA)
    eventually(lambda: denied(k8s, g) == 0)  # the status follows the copies
    k8s.patch_secret(
        src, "hub", {"metadata": {"annotations": {"projector.nebari.dev/export-to": a}}}
    )
    eventually(lambda: denied(k8s, g) == 1)
    revoked_by(k8s, policy, b, kept=a)


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_a_namespace_removed_from_the_grant_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(b, "hub") == DATA)
    eventually(lambda: k8s.status(g)["targets"]["matched"] == 2)  # the status follows the copies
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [a]}}})
    eventually(lambda: k8s.status(g)["targets"]["matched"] == 1)
    revoked_by(k8s, policy, b, kept=a)


def test_the_source_namespace_with_the_source_name_is_refused_and_the_source_untouched(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """The copy would overwrite the source itself: a condition, and no write at all."""
    src, other = make_namespace(), make_namespace()
    source = k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[src, other])  # the target name defaults to "hub"
    eventually(lambda: k8s.copy_data(other, "hub") == DATA)
    failures = eventually(lambda: k8s.status(g).get("failures"))
    assert [(f["namespace"], f["reason"]) for f in failures] == [(src, "SourceNamespace")]
    now = k8s.core.read_namespaced_secret("hub", src)
    assert now.metadata.resource_version == source.metadata.resource_version
    assert "projector.nebari.dev/grant-uid" not in (now.metadata.annotations or {})


@pytest.mark.parametrize("selected", [False, True], ids=["listed", "selected"])
def test_a_copy_in_the_namespace_the_source_moves_into_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, selected: bool
) -> None:
    """Issue 42: the grant's source moves into a namespace where it holds a copy; that one is
    the source's own namespace now, never a target, and its copy (onRevoke Delete) goes."""
    label = {"projector-test/moved": unique_name("m")}
    p1, p2 = make_namespace(), make_namespace(labels=label)
    k8s.source(p1, "s", DATA, export_to="*")
    k8s.source(p2, "other", {"token": "ROWS-canary-other"}, export_to="*")
    target = {"selector": {"matchLabels": label}} if selected else {"namespaces": [p2]}
    g = k8s.grant((p1, "s"), target_name="copy", on_revoke="Delete", **target)
    eventually(lambda: k8s.copy_data(p2, "copy") == DATA)
    k8s.patch_grant(g, {"spec": {"source": {"namespace": p2, "name": "other"}}})
    eventually(lambda: k8s.copy(p2, "copy") is None, message="the stranded copy is revoked")
    assert k8s.copy_data(p2, "other") == {"token": "ROWS-canary-other"}  # the source untouched


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_a_namespace_untargeted_while_the_controller_is_down_follows_its_recorded_policy(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    first = start_controller()
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(b, "hub") == DATA)
    kept = k8s.version(b, "hub")
    assert first.stop() == 0
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [a]}}})
    second = start_controller("--debounce=0")
    eventually(lambda: k8s.observed(g)["targets"]["matched"] == 1)
    if policy == "Delete":
        eventually(lambda: k8s.copy(b, "hub") is None)
    else:
        eventually(second.idle)
        assert kept is not None and k8s.version(b, "hub") == kept


def test_a_denied_consumer_learns_nothing_of_the_source(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    """Granted by an admin but not exported to: its namespace gets no Secret and no Event, and
    nothing a consumer can read there names the source."""
    src, allowed, refused = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to=allowed)
    g = k8s.grant((src, "hub"), namespaces=[allowed, refused])
    eventually(lambda: k8s.copy_data(allowed, "hub") == DATA)
    eventually(lambda: denied(k8s, g) == 1)
    assert k8s.core.list_namespaced_secret(refused).items == [] or all(
        not (s.metadata.labels or {}).get("projector.nebari.dev/grant")
        for s in k8s.core.list_namespaced_secret(refused).items
    )
    events = k8s.core.list_namespaced_event(refused).items
    assert not [
        e for e in events if src in json.dumps(k8s.core.api_client.sanitize_for_serialization(e))
    ]
    assert all(f["namespace"] != refused for f in k8s.status(g).get("failures") or ())


def test_a_burst_of_source_changes_is_one_write_per_copy(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    audit_log: Path,
) -> None:
    """50 patches, each well within the debounce (3 s) of the one before, under a maximum wait
    (60 s) no burst reaches: each copy is written once, with the last value.

    A behaviour, not a speed: only the gaps between patches must stay under 3 s. How many
    writes a burst costs at the default debounce, and how fast, is `make bench`'s burst.
    """
    ctl = start_controller("--debounce=3", "--debounce-max=60", "--debounce-hot-max=60")
    src = make_namespace()
    targets = [make_namespace() for _ in range(3)]
    k8s.source(src, "hub", {"token": "burst-canary-0"}, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=targets)
    eventually(lambda: all(k8s.copy_data(ns, "hub") for ns in targets))
    eventually(lambda: k8s.observed(g) and ctl.idle())
    started = datetime.now(UTC)
    values = [f"burst-canary-{i}" for i in range(1, 51)]

    def patch(chunk: list[str]) -> None:
        for v in chunk:
            k8s.patch_secret(src, "hub", {"stringData": {"token": v}})

    # Five senders at once; the last value is sent after all the others have landed.
    threads = [threading.Thread(target=patch, args=(values[i:49:5],)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    patch(values[49:])
    eventually(lambda: all(k8s.copy_data(ns, "hub") == {"token": values[-1]} for ns in targets))
    eventually(ctl.idle)  # nothing of the burst is still debouncing: no write is yet to come
    writes: dict[str, int] = {ns: 0 for ns in targets}
    for w in audit_writes(audit_log, started):
        if (
            w.verb in ("update", "patch", "create")
            and w.resource == "secrets"
            and w.namespace in writes
            and w.agent.startswith("projector/")
        ):
            writes[w.namespace] += 1
    assert writes == {ns: 1 for ns in targets}, writes


def test_unsatisfiable_grants_are_told_once_and_not_retried_in_a_loop(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
) -> None:
    """Valid grants the world cannot satisfy yet: a listed namespace that does not exist, a
    source that does not exist, a source that has not opted in. Each gets Ready=False with the
    reason and one Warning Event; nothing is written; the controller does not keep reconciling
    them; and each is satisfied as soon as the world catches up."""
    controller = start_controller()
    src, b, c = make_namespace(), make_namespace(), make_namespace()
    missing = unique_name("rows-missing")
    k8s.source(src, "hub", DATA, export_to="*")
    k8s.source(src, "plain", {"token": "ROWS-canary-plain"}, exported=False, export_to="*")
    reasons = {
        k8s.grant((src, "hub"), namespaces=[missing]): "NamespaceMissing",
        k8s.grant((src, "ghost"), namespaces=[b]): "SourceMissing",
        k8s.grant((src, "plain"), namespaces=[c]): "NotExported",
    }

    def ready_reasons() -> dict[str, str]:
        return {g: (k8s.condition(g, "Ready") or {}).get("reason", "") for g in reasons}

    def warnings() -> dict[str, list[str]]:
        return {g: [str(e.reason) for e in k8s.events(g) if e.type == "Warning"] for g in reasons}

    eventually(lambda: ready_reasons() == reasons, timeout=60)
    assert all((k8s.condition(g, "Ready") or {}).get("status") == "False" for g in reasons)
    assert {f["namespace"]: f["reason"] for f in k8s.status(next(iter(reasons)))["failures"]} == {
        missing: "NamespaceMissing"
    }
    eventually(lambda: all(reasons[g] in w for g, w in warnings().items()), timeout=60)
    eventually(controller.idle, timeout=60)

    def runs(c: ControllerProcess) -> int:
        return sum(c.reconciled(g) for g in reasons)

    reconciles = runs(controller)
    statuses = controller.metric("projector_status_writes_total")
    bound = 2  # a hot loop at a 20 ms debounce would do about 150 in the window
    consistently(
        lambda: (
            runs(controller) <= reconciles + bound
            and controller.metric("projector_status_writes_total") <= statuses + bound
        ),
        duration=3,
        message="an unsatisfiable grant is reconciled again and again",
    )
    assert controller.metric("projector_writes_total") == 0  # not one copy written
    # a restart reconciles each grant again in the same state: still told once, not per reconcile
    assert controller.stop() == 0
    again = start_controller()
    eventually(lambda: all(again.reconciled(g) >= 1 for g in reasons) and again.idle(), timeout=60)
    told = warnings()
    assert all(told[g].count(r) == 1 for g, r in reasons.items()), told  # told once, not per retry
    assert k8s.copy(b, "ghost") is None and k8s.copy(c, "plain") is None

    make_namespace(missing)
    k8s.source(src, "ghost", {"token": "ROWS-canary-ghost"}, export_to="*")
    k8s.patch_secret(
        src, "plain", {"metadata": {"labels": {"projector.nebari.dev/export": "true"}}}
    )
    eventually(lambda: k8s.copy_data(missing, "hub") == DATA, timeout=60)
    eventually(lambda: k8s.copy_data(b, "ghost") == {"token": "ROWS-canary-ghost"}, timeout=60)
    eventually(lambda: k8s.copy_data(c, "plain") == {"token": "ROWS-canary-plain"}, timeout=60)
    eventually(lambda: set(ready_reasons().values()) == {"Projected"}, timeout=60)


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
def test_a_cleared_conflict_is_noticed_within_the_usual_latency(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, kind: str
) -> None:
    """A foreign, unlabelled object of the copy's name blocks it (no informer caches it); once
    its owner deletes it, the copy lands within seconds, not at the next conflict recheck (60 s,
    the controller's default here): a watch of that name, metadata only, saw it go."""
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    theirs = {"mine": f"ROWS-canary-theirs-{kind}"}
    if kind == "Secret":
        k8s.source(a, "hub", theirs, exported=False)
        k8s.source(src, "hub", DATA, export_to="*")
        g = k8s.grant((src, "hub"), namespaces=[a, b])
        copy_data, delete = k8s.copy_data, k8s.core.delete_namespaced_secret
    else:
        k8s.config_source(a, "hub", theirs, exported=False)
        k8s.config_source(src, "hub", DATA, export_to="*")
        g = k8s.grant((src, "hub"), namespaces=[a, b], kind=kind)
        copy_data, delete = k8s.config_data, k8s.core.delete_namespaced_config_map
    eventually(lambda: copy_data(b, "hub") == DATA)
    eventually(lambda: k8s.status(g)["targets"]["conflicted"] == 1)
    assert copy_data(a, "hub") == theirs
    # The watch has listed the place: from here on a deletion is an event, not a recheck.
    eventually(lambda: "conflict place listed" in controller.logs(), timeout=10)
    delete("hub", a)
    eventually(lambda: copy_data(a, "hub") == DATA, timeout=10, message="the copy landed")
    eventually(lambda: k8s.status(g)["targets"]["conflicted"] == 0, timeout=10)
    assert "conflict cleared; waking" in controller.logs()
