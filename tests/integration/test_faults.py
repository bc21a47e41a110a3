"""Faults injected into real processes: the API server goes away in the middle of a fan-out.

What must hold is DESIGN §3's last row: no deletes on uncertainty, and convergence once the
server is back. Deletes are read from the API server's audit log (every write it received)
and from the copies' uids (a copy deleted and re-created would have a new one).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client

from tests.controlplane.plane import ControlPlane
from tests.launcher import ControllerProcess
from tests.support import (
    Cluster,
    NamespaceFactory,
    audit_writes,
    b64,
    eventually,
    unique_name,
)

FANOUT = 200


def copies(core: client.CoreV1Api, grant: str) -> dict[str, tuple[str, str]]:
    """(uid, token) of every copy of `grant`, by namespace, from one list."""
    items = core.list_secret_for_all_namespaces(
        label_selector=f"projector.nebari.dev/grant={grant}"
    ).items
    return {
        str(s.metadata.namespace): (str(s.metadata.uid), str((s.data or {}).get("token", "")))
        for s in items
    }


def all_hold(core: client.CoreV1Api, grant: str, value: str) -> Callable[[], bool]:
    want = b64(value)

    def check() -> bool:
        c = copies(core, grant)
        return len(c) == FANOUT and all(token == want for _, token in c.values())

    return check


def deletes_since(audit_log: Path, since: datetime) -> list[str]:
    """Secret deletions the API server received since `since`, from any client."""
    return [
        f"{w.namespace}/{w.name} by {w.agent}"
        for w in audit_writes(audit_log, since)
        if w.verb == "delete" and w.resource == "secrets"
    ]


def test_api_server_down_during_a_fan_out_deletes_nothing_and_converges(
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    controller: ControllerProcess,
    control_plane: ControlPlane,
    audit_log: Path,
) -> None:
    team = unique_name("outage")
    src = make_namespace()
    for _ in range(FANOUT):
        make_namespace(labels={"outage": team})
    k8s.source(src, "hub", {"token": "outage-canary-0"}, export_to="*")
    grant = k8s.grant((src, "hub"), selector={"matchLabels": {"outage": team}})
    eventually(all_hold(k8s.core, grant, "outage-canary-0"), timeout=180)
    before = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    relists = controller.metric("projector_informer_events_total", type="RELIST")
    started = datetime.now(UTC)
    k8s.patch_secret(src, "hub", {"data": {"token": "outage-canary-1"}})  # a fan-out begins
    with control_plane.apiserver_down():
        # Down until the controller has seen it: every cache behind, so it is not Ready.
        eventually(lambda: controller.get("/readyz")[0] == 503, timeout=60)
    # Back: a change made while the informers are still reconnecting (relisting after 410).
    k8s.patch_secret(src, "hub", {"data": {"token": "outage-canary-2"}})
    eventually(all_hold(k8s.core, grant, "outage-canary-2"), timeout=180)
    assert deletes_since(audit_log, started) == []
    after = {ns: uid for ns, (uid, _) in copies(k8s.core, grant).items()}
    assert after == before  # no copy was deleted and re-created either
    assert controller.metric("projector_informer_events_total", type="RELIST") > relists
    eventually(lambda: controller.get("/readyz")[0] == 200)
