"""DESIGN §3 rows tested where they bite: the narrow side of each change, not only the easy one.

Each test asserts a state that differs from the one before its action, so a controller that
never processed the action cannot pass it.
"""

from __future__ import annotations

import json
import math
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.launcher import ControllerProcess
from tests.support import Cluster, NamespaceFactory, audit_writes, eventually

DATA = {"token": "ROWS-canary-1"}


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
    assert denied(k8s, g) == 0
    k8s.patch_secret(
        src, "hub", {"metadata": {"annotations": {"projector.nebari.dev/export-to": a}}}
    )
    eventually(lambda: denied(k8s, g) == 1)
    if policy == "Delete":
        eventually(lambda: k8s.copy(b, "hub") is None)
    else:
        assert k8s.copy_data(b, "hub") == DATA
    assert k8s.copy_data(a, "hub") == DATA


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_a_namespace_removed_from_the_grant_follows_on_revoke(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(b, "hub") == DATA)
    assert k8s.status(g)["targets"]["matched"] == 2
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [a]}}})
    eventually(lambda: k8s.status(g)["targets"]["matched"] == 1)
    if policy == "Delete":
        eventually(lambda: k8s.copy(b, "hub") is None)
    else:
        assert k8s.copy_data(b, "hub") == DATA
    assert k8s.copy_data(a, "hub") == DATA


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


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_a_namespace_untargeted_while_the_controller_is_down_follows_its_recorded_policy(
    k8s: Cluster, make_namespace: NamespaceFactory, start_controller: Any, policy: str
) -> None:
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    first = start_controller()
    g = k8s.grant((src, "hub"), namespaces=[a, b], on_revoke=policy)
    eventually(lambda: k8s.copy_data(b, "hub") == DATA)
    kept = k8s.copy(b, "hub")
    assert first.stop() == 0
    k8s.patch_grant(g, {"spec": {"target": {"namespaces": [a]}}})
    second = start_controller("--debounce=0")
    eventually(lambda: k8s.observed(g)["targets"]["matched"] == 1)
    if policy == "Delete":
        eventually(lambda: k8s.copy(b, "hub") is None)
    else:
        eventually(second.idle)
        now = k8s.copy(b, "hub")
        assert now is not None and kept is not None
        assert (now.metadata.uid, now.metadata.resource_version) == (
            kept.metadata.uid,
            kept.metadata.resource_version,
        )


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
    """50 patches in about 200 ms, debounce 0.2 s: each copy is written once, with the last."""
    ctl = start_controller("--debounce=0.2", "--debounce-max=1")
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
    seconds = (datetime.now(UTC) - started).total_seconds()
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
    if seconds < 0.8:  # the whole burst, plus its trailing 0.2 s, fits the 1 s window
        assert writes == {ns: 1 for ns in targets}, writes
    else:  # a slow machine spread it out: one write per debounce window (1 s), plus the last
        limit = 1 + math.ceil(seconds)
        assert all(1 <= n <= limit for n in writes.values()), (writes, seconds)
