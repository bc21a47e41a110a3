"""A stopped node leaves nothing behind, as the plane's leak test proves for the plane.

The node is stopped with a pod running (so there are mounts, a network namespace, a veth on the
bridge, cgroups and shims to clean), and the host is compared with the snapshot taken before
the session's node first started: no process naming the node's root, no mount, cgroup, bridge,
iptables chain or path outside the root, and every sysctl the kubelet or the bridge plugin set
has its old value. Then the node starts again for the tests after this one.
"""

from __future__ import annotations

import dataclasses

from kubernetes import client

from tests.bed.kube import eventually
from tests.bed.node.node import HostSnapshot, Node, node_cgroups
from tests.bed.node.pods import run_pod


def test_node_stop_restores_the_host_and_a_restart_is_ready_again(
    node: Node,
    host_before: HostSnapshot,
    core_v1: client.CoreV1Api,
    namespace: str,
    busybox: str,
) -> None:
    name = run_pod(core_v1, namespace, busybox, ["sleep", "3600"])

    def running() -> bool:
        return core_v1.read_namespaced_pod(name, namespace).status.phase == "Running"

    eventually(running, 90, message="a pod running before the node stops")
    during = HostSnapshot.take(node.root)
    assert during.cgroups and during.mounts and during.processes  # there was something to clean
    assert during.sysctls["vm/overcommit_memory"] == "1"  # the kubelet's tuning, undone below

    node.stop()
    after = HostSnapshot.take(node.root)
    assert dataclasses.asdict(after) == dataclasses.asdict(host_before)
    assert not node_cgroups()

    node.start()
    assert node.ready()
