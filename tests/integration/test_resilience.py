"""The API server becomes unreachable mid-flight: nothing is deleted on a guess, and once it is
back, the controller converges (DESIGN §3, last row).

The controller talks to the real API server through a loopback TCP relay (tests/bed/proxy.py) that
the test can cut (every connection reset, new ones refused) and restore.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests import reliability
from tests.bed.kube import eventually
from tests.bed.proxy import Relay
from tests.support import Cluster, NamespaceFactory, audit_writes

DATA = {"token": "CANARY-resilience-1"}


@pytest.mark.fault
def test_unreachable_api_server_deletes_nothing_and_converges_when_back(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    audit_log: Path,
    relayed: tuple[Relay, Path],
) -> None:
    relay, kubeconfig = relayed
    src, a, b = make_namespace(), make_namespace(), make_namespace()
    k8s.source(src, "hub", DATA, export_to="*")
    ctl = start_controller(f"--kubeconfig={kubeconfig}")
    k8s.grant((src, "hub"), namespaces=[a])
    revoked = k8s.grant((src, "hub"), namespaces=[b], target_name="other")
    eventually(lambda: k8s.copy_data(a, "hub") == DATA and k8s.copy_data(b, "other") == DATA)
    uid = k8s.copy(a, "hub").metadata.uid
    started = datetime.now(UTC)
    try:
        relay.cut()
        eventually(
            lambda: ctl.metric("projector_informer_events_total", type="ERROR") >= 4,
            message="every informer noticed the outage",
        )
        v2 = {"token": "CANARY-resilience-2"}
        k8s.patch_secret(src, "hub", {"data": v2})
        k8s.delete_grant(revoked)
        assert k8s.copy_data(a, "hub") == DATA  # nothing could be written meanwhile
        assert ctl.get("/healthz")[0] == 200  # alive, waiting, not crashing
    finally:
        relay.restore()
    back = time.monotonic()
    eventually(lambda: k8s.copy_data(a, "hub") == v2, timeout=60)
    eventually(lambda: k8s.copy(b, "other") is None, timeout=60)  # authoritative: grant gone
    converged = time.monotonic() - back
    deletes = [
        f"{w.namespace}/{w.name}"
        for w in audit_writes(audit_log, started)
        if w.verb == "delete" and w.resource == "secrets"
    ]
    unasked = [d for d in deletes if d != f"{b}/other"]
    reliability.record(
        "API server unreachable (connections reset)",
        injected=(
            "every connection between the controller and the API server reset and new ones "
            "refused (a loopback TCP relay cut); meanwhile a source change and a grant deleted "
            "(onRevoke: Delete); then connections allowed again."
        ),
        observed={
            "deletes": len(unasked),
            "missed_updates": int(k8s.copy_data(a, "hub") != v2),
            "converge_seconds": converged,
            "revoked_copy_deleted_once_back": deletes.count(f"{b}/other"),
        },
    )
    assert unasked == []
    assert k8s.copy(a, "hub").metadata.uid == uid  # updated in place, never deleted
    relay.cut()
