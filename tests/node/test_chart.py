"""The chart's pods, for real: ``helm install`` with ci/node-values.yaml on the real node.

Two replicas are scheduled, Running and Ready through the kubelet's own probes, with the
restricted security context (read-only root, 65532); one holds the Lease. Deleting the leader's
pod hands over, and the next source change lands within the lease duration + 2 s. A rolling
update to a new image tag keeps projecting, never below the PodDisruptionBudget. ``helm
uninstall`` leaves the CRD, the grants and every copy in place.
"""

from __future__ import annotations

import ssl
import time
import urllib.request
from collections import Counter

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests import support
from tests.bed.controlplane.plane import ControlPlane
from tests.bed.helm import chart
from tests.bed.kube import eventually
from tests.bed.node.node import Node
from tests.bed.registry import tag
from tests.node.release import NAMESPACE, NODE_VALUES, RELEASE, Release
from tests.support import GROUP, PLURAL, Canaries, Cluster, NamespaceFactory

CRD = f"{PLURAL}.{GROUP}"
LEASE_SECONDS = float(
    yaml.safe_load((chart.CHART / "values.yaml").read_text())["leaderElection"]["leaseDuration"][
        :-1
    ]
)


def projected(k8s: Cluster, make_namespace: NamespaceFactory, value: str) -> tuple[str, str]:
    src, dst = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"token": value}, export_to=dst)
    k8s.grant((src, "hub"), namespaces=[dst])
    eventually(lambda: k8s.copy_data(dst, "hub") == {"token": value}, 30)
    return src, dst


def test_two_replicas_are_ready_by_the_kubelets_probes_and_one_leads(
    release: Release, node: Node, canaries: Canaries
) -> None:
    print(f"\nhelm install -> both replicas Ready: {release.install_seconds:.1f}s")
    pods = release.ready_pods()
    assert len(pods) == 2
    for pod in pods:
        assert pod.spec.node_name == node.name
        assert pod.spec.containers[0].readiness_probe.http_get.path == "/readyz"
        assert pod.spec.security_context.run_as_user == 65532
        assert pod.spec.containers[0].security_context.read_only_root_filesystem is True
        assert pod.status.container_statuses[0].restart_count == 0
    names = {p.metadata.name for p in pods}
    assert eventually(release.leader, 30) in names
    canaries.assert_absent("the chart's pod logs", release.logs())


def test_deleting_the_leaders_pod_hands_over_within_the_lease(
    release: Release, k8s: Cluster, make_namespace: NamespaceFactory, canaries: Canaries
) -> None:
    src, dst = projected(k8s, make_namespace, "CANARY-chart-1")
    old = str(eventually(release.leader, 30))
    started = time.monotonic()
    release.core.delete_namespaced_pod(old, NAMESPACE)  # SIGTERM: the leader releases the Lease
    new = eventually(
        lambda: (h := release.leader()) not in (None, old) and h,
        LEASE_SECONDS + 2,
        interval=0.02,
        message="a new Lease holder after the leader's pod was deleted",
    )
    handover = time.monotonic() - started
    k8s.patch_secret(src, "hub", {"data": {"token": "CANARY-chart-2"}})
    eventually(
        lambda: k8s.copy_data(dst, "hub") == {"token": "CANARY-chart-2"},
        LEASE_SECONDS + 2 - handover,
        interval=0.02,
        message="the change after the handover, within lease duration + 2 s of the deletion",
    )
    landed = time.monotonic() - started
    print(f"\nleader pod deleted -> new leader {handover:.2f}s, next change landed {landed:.2f}s")
    assert new in {p.metadata.name for p in release.pods()}
    release.wait_rolled_out()
    canaries.assert_absent("the chart's pod logs", release.logs())


def test_a_rolling_update_to_a_new_tag_keeps_projecting_within_the_pdb(
    release: Release,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
) -> None:
    src, dst = projected(k8s, make_namespace, "CANARY-roll-0")
    image, _, digest = release.published.image.partition("@")
    repository = image.partition("/")[2]
    new = tag(image.partition("/")[0], repository, digest, "roll")  # the same image, a new name
    release.helm(
        "upgrade",
        RELEASE,
        *release.chart(),
        "-n",
        NAMESPACE,
        "-f",
        str(NODE_VALUES),
        "--set=image.digest=",
        "--set=image.tag=roll",
    )
    policy = client.PolicyV1Api(release.api)
    n = 0

    def rolled() -> bool:
        pods = release.ready_pods()
        return len(pods) == 2 and all(p.spec.containers[0].image == new for p in pods)

    while not rolled():
        n += 1
        value = f"CANARY-roll-{n}"
        k8s.patch_secret(src, "hub", {"data": {"token": value}})
        eventually(lambda v=value: k8s.copy_data(dst, "hub") == {"token": v}, 20)  # type: ignore[misc]
        pdb = policy.read_namespaced_pod_disruption_budget(RELEASE, NAMESPACE).status
        assert len(release.ready_pods()) >= 1
        if pdb is not None and pdb.observed_generation is not None:
            assert (pdb.current_healthy or 0) >= (pdb.desired_healthy or 0), pdb
        assert n < 200, "the rollout did not finish"
    release.wait_rolled_out()
    value = "CANARY-roll-done"
    k8s.patch_secret(src, "hub", {"data": {"token": value}})
    eventually(lambda: k8s.copy_data(dst, "hub") == {"token": value}, 20)
    print(f"\nrolling update: {n} source changes projected during the rollout")


def liveness_probes(release: Release, node: Node, plane: ControlPlane) -> Counter[tuple[str, str]]:
    """The kubelet's liveness probe results of the release's pods, by (pod, result), from its
    own /metrics/probes on loopback, as the API server's kubelet client (the API server's node
    proxy refuses a loopback node address)."""
    port = release.core.read_node(node.name).status.daemon_endpoints.kubelet_endpoint.port
    tls = ssl.create_default_context(cafile=str(plane.pki / "serving-ca.crt"))
    tls.load_cert_chain(plane.pki / "kubelet-client.crt", plane.pki / "kubelet-client.key")
    url = f"https://{node.name}:{port}/metrics/probes"  # the node's name resolves to 127.0.0.1
    with urllib.request.urlopen(url, context=tls, timeout=10) as response:
        text = response.read().decode()
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "prober_probe_total"
                and labels.get("probe_type") == "Liveness"
                and labels.get("namespace") == NAMESPACE
            ):
                counts[labels["pod"], labels["result"]] += int(sample.value)
    return counts


@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param(12, id="10s"),
        pytest.param(180, id="3m", marks=pytest.mark.long),
    ],
)
def test_an_api_server_outage_restarts_no_pod_and_the_next_change_lands(
    seconds: int,
    release: Release,
    node: Node,
    control_plane: ControlPlane,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    canaries: Canaries,
) -> None:
    """The API server stopped for 10 s (past the leader's renew deadline) or 3 minutes, with the
    kubelet losing it too: every pod keeps running with restartCount 0, the kubelet's liveness
    probes of /healthz all succeed meanwhile, and the next change lands once it is back."""
    src, dst = projected(k8s, make_namespace, "CANARY-outage-0")
    release.wait_rolled_out()
    before = {p.metadata.name: p.status.container_statuses[0].restart_count for p in release.pods()}
    assert set(before.values()) == {0}
    probes_before = liveness_probes(release, node, control_plane)
    containers = [
        p.status.container_statuses[0].container_id.split("//")[-1] for p in release.pods()
    ]

    def running() -> bool:  # containerd's own word: the kubelet cannot post status meanwhile
        tasks = {
            line.split()[0]: line.split()[-1]
            for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]
        }
        return all(tasks.get(c) == "RUNNING" for c in containers)

    with control_plane.apiserver_down():
        support.consistently(running, duration=seconds, interval=1.0, message="a pod stopped")
    back = time.monotonic()
    k8s.patch_secret(src, "hub", {"data": {"token": "CANARY-outage-1"}})
    sent = time.monotonic()
    eventually(
        lambda: k8s.copy_data(dst, "hub") == {"token": "CANARY-outage-1"},
        60,
        interval=0.05,
        message="the next change after the outage",
    )
    landed = time.monotonic() - sent
    probes = liveness_probes(release, node, control_plane) - probes_before
    after = {p.metadata.name: p.status.container_statuses[0].restart_count for p in release.pods()}
    print(
        f"\nAPI server down {seconds} s: restarts {after}, liveness probes during and after "
        f"{dict(probes)}, next change landed {landed:.2f} s after it was sent "
        f"({sent - back:.2f} s after the API server was ready)"
    )
    logs = release.logs()
    assert '"lost the lease; campaigning again"' in logs  # the outage outlasted a term
    assert after == before  # the same pods, none restarted
    assert not [k for k in probes if k[1] != "successful"], probes
    assert all(probes[pod, "successful"] >= seconds // 10 for pod in before), probes
    assert landed <= support.OUTAGE_LANDS_WITHIN, f"the next change took {landed:.1f} s to land"
    canaries.assert_absent("the chart's pod logs", logs)


def test_helm_uninstall_leaves_the_crd_the_grants_and_the_copies(
    release: Release,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    admin_client: client.ApiClient,
) -> None:
    _, dst = projected(k8s, make_namespace, "CANARY-uninstall")
    grant = k8s.grants[-1]
    release.uninstall()
    eventually(lambda: not release.pods(), 60, message="the release's pods gone")
    ext = client.ApiextensionsV1Api(admin_client)
    assert ext.read_custom_resource_definition(CRD).metadata.name == CRD
    assert k8s.get_grant(grant)["metadata"]["name"] == grant
    assert k8s.copy_data(dst, "hub") == {"token": "CANARY-uninstall"}
    release.install()  # for the tests after this one
