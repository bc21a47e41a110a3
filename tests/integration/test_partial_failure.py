"""One informer fails while the others stay healthy: nothing is deleted until it is back.

The controller runs as a ServiceAccount of this test, bound to a copy of the shipped ClusterRole,
so taking the namespaces rule away at run time touches no other test's RBAC. Its watches end
every second or so (`--watch-timeout=1`), so the namespace informer's next watch meets the 403
at once. Deletes are read from the API server's audit log and from the copies' uids.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests import reliability
from tests.bed.kube import eventually, unique_name
from tests.support import (
    AuditWrite,
    Cluster,
    NamespaceFactory,
    ServiceAccountKubeconfigFactory,
    audit_writes,
)

DATA = {"token": "PARTIAL-canary-1"}


pytestmark = pytest.mark.fault


@pytest.fixture
def own_role(rbac_v1: client.RbacAuthorizationV1Api) -> Iterator[str]:
    """A copy of the shipped ClusterRole `projector` (deploy/rbac), deleted afterwards."""
    shipped = rbac_v1.read_cluster_role("projector")
    name = unique_name("projector-partial")
    rbac_v1.create_cluster_role(
        client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name), rules=shipped.rules)
    )
    yield name
    rbac_v1.delete_cluster_role(name)


def copy_uids(k8s: Cluster, namespaces: list[str]) -> dict[str, str | None]:
    return {ns: (c.metadata.uid if (c := k8s.copy(ns, "hub")) else None) for ns in namespaces}


def test_a_failing_namespace_informer_deletes_nothing_then_converges(
    own_role: str,  # first: its RBAC outlives the controller, which stops in k8s's teardown
    service_account_kubeconfig: ServiceAccountKubeconfigFactory,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    start_controller: Any,
    rbac_v1: client.RbacAuthorizationV1Api,
    audit_log: Path,
) -> None:
    src, a, b, c = (make_namespace() for _ in range(4))
    k8s.source(src, "hub", DATA, export_to="*")
    kubeconfig = service_account_kubeconfig(own_role, "projector-system")
    ctl = start_controller("--watch-timeout=1", kubeconfig=kubeconfig)
    deleted = k8s.grant((src, "hub"), namespaces=[a], on_revoke="Delete")
    edited = k8s.grant((src, "hub"), namespaces=[b, c], on_revoke="Delete")
    eventually(lambda: all(k8s.copy_data(ns, "hub") == DATA for ns in (a, b, c)))
    eventually(lambda: k8s.observed(deleted) and k8s.observed(edited) and ctl.idle())
    uids = copy_uids(k8s, [a, b, c])

    rules = rbac_v1.read_cluster_role(own_role).rules or []
    kept = [r for r in rules if "namespaces" not in (r.resources or ())]
    assert len(kept) == len(rules) - 1
    started = datetime.now(UTC)
    errors = ctl.metric("projector_informer_events_total", kind="namespaces", type="ERROR")
    serialize = rbac_v1.api_client.sanitize_for_serialization
    rbac_v1.patch_cluster_role(own_role, {"rules": [serialize(r) for r in kept]})
    eventually(  # the namespace informer, and only it, fails: the controller is not ready
        lambda: (
            ctl.metric("projector_informer_events_total", kind="namespaces", type="ERROR") > errors
            and ctl.get("/readyz")[0] != 200
        ),
        timeout=60,
        message="the namespace informer never failed",
    )
    for healthy in ("grants", "sources", "copies"):
        assert ctl.metric("projector_informer_events_total", kind=healthy, type="ERROR") == 0

    def projector_deletes() -> list[AuditWrite]:
        writes = audit_writes(audit_log, started)
        return [w for w in writes if w.verb == "delete" and w.agent.startswith("projector/")]

    changed = (deleted, edited)
    runs = {g: ctl.reconciled(g) for g in changed}
    refused = {g: ctl.reconciled(g, "requeue") for g in changed}
    k8s.delete_grant(deleted)
    k8s.patch_grant(edited, {"spec": {"target": {"namespaces": [b]}}})
    # Both changes reach the controller and each grant is reconciled twice after them (or a
    # delete shows up first, and the assertions below say so).
    eventually(
        lambda: projector_deletes() or all(ctl.reconciled(g) >= runs[g] + 2 for g in changed),
        timeout=60,
        message="the controller never reconciled the changed grants",
    )
    assert projector_deletes() == []
    assert copy_uids(k8s, [a, b, c]) == uids
    assert all(ctl.reconciled(g, "requeue") >= refused[g] + 2 for g in changed)  # refused
    assert ctl.get("/readyz")[0] != 200, "the namespace informer recovered by itself"
    deletes_while_failing = len(projector_deletes())

    restored = time.monotonic()
    rbac_v1.patch_cluster_role(own_role, {"rules": [serialize(r) for r in rules]})
    eventually(
        lambda: (
            k8s.copy(a, "hub") is None
            and k8s.copy(c, "hub") is None
            and k8s.observed(edited)["targets"]["matched"] == 1
        ),
        timeout=90,
        message="never converged once the RBAC was back",
    )
    converge_seconds = time.monotonic() - restored
    print(f"partial failure: 0 deletes while failing; converged {converge_seconds:.2f} s after")
    assert copy_uids(k8s, [b]) == {b: uids[b]}
    assert k8s.copy_data(b, "hub") == DATA
    reliability.record(
        "An informer failing alone (its RBAC removed at run time)",
        injected="the namespaces rule removed from the controller's ClusterRole while it ran; "
        "meanwhile one grant deleted (onRevoke: Delete) and another narrowed; then restored",
        observed={
            "deletes": deletes_while_failing,
            "missed_updates": sum(k8s.copy(ns, "hub") is not None for ns in (a, c))
            + (k8s.copy_data(b, "hub") != DATA),
            "converge_seconds": round(converge_seconds, 2),
        },
    )
