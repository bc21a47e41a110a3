"""The node joins the control plane as deployed nodes do: its own identity, Node authorization,
NodeRestriction, and the API server reaching the kubelet (pods/log) with its own certificate."""

from __future__ import annotations

from kubernetes import client

from tests.bed.kube import api_client, eventually, unique_name
from tests.bed.node.node import SYNC_FREQUENCY, Node
from tests.bed.node.pods import delete_pod, pod_log, run_pod
from tests.support import status_of


def test_the_node_is_ready_under_its_own_identity(node: Node, core_v1: client.CoreV1Api) -> None:
    got = core_v1.read_node(node.name)
    ready = [c for c in got.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True", ready
    assert got.status.node_info.kubelet_version == node.plane.version()["gitVersion"]
    assert got.status.node_info.container_runtime_version.startswith("containerd://")
    assert not [t for t in got.spec.taints or [] if t.key.startswith("node.kubernetes.io/")]
    # The kubelet's own credentials: the Node authorizer lets it read its Node, not Secrets
    # that no pod of it uses, and NodeRestriction keeps it off other Nodes' objects.
    as_node = client.CoreV1Api(api_client(node.plane.node_kubeconfig))
    assert as_node.read_node(node.name).metadata.name == node.name
    assert status_of(lambda: as_node.list_secret_for_all_namespaces()) == 403
    assert status_of(lambda: as_node.read_namespaced_secret("nope", "default")) == 403
    other = client.V1Node(metadata=client.V1ObjectMeta(name=unique_name("other-node")))
    assert status_of(lambda: as_node.create_node(other)) == 403
    assert SYNC_FREQUENCY == "100ms"


def test_a_pod_runs_and_its_log_is_read_through_the_api(
    node: Node, core_v1: client.CoreV1Api, namespace: str, busybox: str
) -> None:
    name = run_pod(core_v1, namespace, busybox, ["sh", "-c", "echo hello from $(id -u)"])
    try:
        assert eventually(lambda: "hello from 0" in pod_log(core_v1, namespace, name), 60)
    finally:
        delete_pod(core_v1, namespace, name)
