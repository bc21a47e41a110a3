"""Defects a review found, each guarded against the real API server (issue: safety)."""

from __future__ import annotations

from kubernetes import client

from tests.launcher import ControllerProcess
from tests.support import GROUP, PLURAL, VERSION, Cluster, NamespaceFactory, eventually, unique_name


def test_a_reused_grant_name_leaves_the_earlier_grants_retained_copies_alone(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    src1, src2, a, b = (make_namespace() for _ in range(4))
    k8s.source(src1, "hub", {"token": "reuse-canary-1"}, export_to="*")
    k8s.source(src2, "other", {"token": "reuse-canary-2"}, export_to="*")
    name = unique_name("reused")
    k8s.grant((src1, "hub"), name=name, namespaces=[a], on_revoke="Retain")
    eventually(lambda: k8s.copy_data(a, "hub") == {"token": "reuse-canary-1"})
    retained = k8s.copy(a, "hub")
    assert retained is not None
    k8s.delete_grant(name)

    def gone() -> bool:
        try:
            k8s.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except client.ApiException as e:
            return e.status == 404
        return False

    eventually(gone)
    # The same name again, for another source and another namespace, with onRevoke Delete.
    k8s.grant((src2, "other"), name=name, namespaces=[b])
    eventually(lambda: k8s.copy_data(b, "other") == {"token": "reuse-canary-2"})
    eventually(controller.settled)
    kept = k8s.copy(a, "hub")
    assert kept is not None, "the earlier grant's Retained copy was deleted by the new grant"
    assert kept.metadata.uid == retained.metadata.uid
    assert k8s.copy_data(a, "hub") == {"token": "reuse-canary-1"}
