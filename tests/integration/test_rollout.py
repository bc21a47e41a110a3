"""Opt-in rollouts on the real API server (DESIGN §2, issue 23): `projector run --rollouts`
under the chart's RBAC with `rollouts.enabled=true` (deploy/rbac/rollouts/ added to the rest).

The plane's kube-controller-manager runs the deployment and replicaset controllers, so each
change of a Deployment's pod template really is a rollout: its revision goes up by one. There
is no node here, so a Deployment of one replica never becomes available (its rollout is
still progressing), and one of zero replicas completes at once. The pods on a node are
tests/node/test_rollout.py's.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from tests.bed.kube import RBAC, apply_manifests, eventually
from tests.bed.launcher import ControllerProcess
from tests.support import Cluster, NamespaceFactory
from tests.workloads import REVISION, ROLLOUT_ON, consumer, copy_hash, revision, stamp

IMAGE = "localhost/never-pulled:none"  # no node: no pod of these tests ever runs
MANAGER = "projector-rollout"
LEASE_FLAGS = ("--lease-duration=3s", "--renew-deadline=2s", "--retry-period=0.5s")


@pytest.fixture(scope="module")
def rollout_rbac(admin_client: client.ApiClient, projector_kubeconfig: Any) -> Iterator[None]:
    """What rollouts.enabled=true adds to the shipped RBAC, with the admission policy that
    confines its workload patches to rollout annotations; removed again afterwards."""
    assert apply_manifests(admin_client, RBAC / "rollouts") == 4
    yield
    rbac = client.RbacAuthorizationV1Api(admin_client)
    rbac.delete_cluster_role_binding("projector-rollouts")
    rbac.delete_cluster_role("projector-rollouts")
    admission = client.AdmissionregistrationV1Api(admin_client)
    admission.delete_validating_admission_policy_binding("projector-rollout-annotations-only")
    admission.delete_validating_admission_policy("projector-rollout-annotations-only")


@pytest.fixture
def apps_v1(admin_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(admin_client)


@dataclass(frozen=True)
class World:
    """What each test here stands on: the cluster, its clients, and the controller launcher."""

    k8s: Cluster
    make_namespace: NamespaceFactory
    core: client.CoreV1Api
    apps: client.AppsV1Api
    start: Callable[..., ControllerProcess]

    def project(self) -> tuple[str, str, str]:
        return project(self.k8s, self.make_namespace)

    def opted_in(self) -> tuple[str, str]:
        return opted_in(self.k8s, self.make_namespace, self.core, self.apps)


@pytest.fixture
def world(
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    core_v1: client.CoreV1Api,
    apps_v1: client.AppsV1Api,
) -> World:
    return World(k8s, make_namespace, core_v1, apps_v1, start_controller)


def project(k8s: Cluster, make_namespace: NamespaceFactory) -> tuple[str, str, str]:
    """A source `db` projected into a consumer namespace: (producer, consumer, grant)."""
    producer, ns = make_namespace(), make_namespace()
    k8s.source(producer, "db", {"password": "CANARY-rollout-0"}, export_to=ns)
    grant = k8s.grant((producer, "db"), namespaces=[ns])
    eventually(lambda: k8s.copy_data(ns, "db") == {"password": "CANARY-rollout-0"})
    return producer, ns, grant


def rotate(k8s: Cluster, core: client.CoreV1Api, producer: str, ns: str, value: str) -> str:
    """Change the source; return the hash prefix of the copy once it holds `value`."""
    k8s.patch_secret(producer, "db", {"data": {"password": value}})
    eventually(lambda: k8s.copy_data(ns, "db") == {"password": value})
    return copy_hash(core, ns)


def opted_in(
    k8s: Cluster, make_namespace: NamespaceFactory, core: client.CoreV1Api, apps: client.AppsV1Api
) -> tuple[str, str]:
    """A projected copy `db` and a Deployment `web` that opted in, baselined: (producer, ns)."""
    producer, ns, _ = project(k8s, make_namespace)
    apps.create_namespaced_deployment(ns, consumer("web", IMAGE, rollout_on="db"))
    eventually(lambda: baselined(apps, ns, "web", copy_hash(core, ns)))
    return producer, ns


def rolled(
    k8s: Cluster, core: client.CoreV1Api, apps: client.AppsV1Api, producer: str, ns: str
) -> str:
    """The first rotation after opting in: `web` rolls once (revision 2); its hash prefix."""
    h = rotate(k8s, core, producer, ns, "CANARY-rollout-1")
    eventually(lambda: stamp(apps, ns, "web") == h and revision(apps, ns, "web") == 2)
    return h


def baselined(apps: client.AppsV1Api, ns: str, name: str, h: str) -> bool:
    d = apps.read_namespaced_deployment(name, ns)
    return (d.metadata.annotations or {}).get("projector.nebari.dev/seen-db") == h


def checked(cp: ControllerProcess, ns: str, name: str) -> int:
    """How often this controller decided about the Deployment (its debug log line)."""
    n = 0
    for line in cp.logs().splitlines():
        if '"rollout checked"' in line:
            n += json.loads(line).get("workload") == f"deployments/{ns}/{name}"
    return n


def without(obj: dict[str, Any], manager: str) -> dict[str, Any]:
    """Spec and managedFields of a workload, minus what `manager` owns and the time stamps."""
    meta = obj["metadata"]
    fields = [
        {k: v for k, v in f.items() if k != "time"}
        for f in meta.get("managedFields") or []
        if f["manager"] != manager and f.get("subresource") != "status"
    ]
    spec = json.loads(json.dumps(obj["spec"]))
    template = spec["template"]["metadata"]
    notes = template.pop("annotations", None) or {}
    rest = {
        k: v
        for k, v in notes.items()
        if not k.startswith("projector.nebari.dev/rollout-") or k == ROLLOUT_ON
    }
    if rest:
        template["annotations"] = rest
    return {"spec": spec, "managedFields": fields}


def raw(admin_client: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    """The Deployment as the server stores it (camelCase, managedFields included)."""
    d = client.AppsV1Api(admin_client).read_namespaced_deployment(name, ns)
    return dict(admin_client.sanitize_for_serialization(d))


def settled(cp: ControllerProcess, ns: str, name: str) -> bool:
    """The controller decided about the Deployment, and has nothing left to do."""
    return checked(cp, ns, name) >= 1 and cp.idle()


def test_a_content_change_rolls_an_opted_in_deployment_once_and_touches_nothing_else(
    rollout_rbac: None,
    world: World,
    admin_client: client.ApiClient,
) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    cp = world.start("--rollouts")
    producer, ns, grant = world.project()
    core_v1.create_namespaced_secret(  # a Secret of the namespace that projector does not own
        ns, client.V1Secret(metadata=client.V1ObjectMeta(name="theirs"), string_data={"k": "v"})
    )
    apps_v1.create_namespaced_deployment(ns, consumer("web", IMAGE, rollout_on="db"))
    apps_v1.create_namespaced_deployment(ns, consumer("plain", IMAGE))
    apps_v1.create_namespaced_deployment(
        ns, consumer("foreign", IMAGE, rollout_on="theirs", secret="theirs")
    )
    h0 = copy_hash(core_v1, ns)

    # first sight: a baseline on the Deployment itself, and no rollout
    eventually(lambda: baselined(apps_v1, ns, "web", h0), message="the baseline recorded")
    eventually(cp.idle)
    assert revision(apps_v1, ns, "web") == 1 and stamp(apps_v1, ns, "web") is None
    before = {n: raw(admin_client, ns, n) for n in ("web", "plain", "foreign")}

    h1 = rotate(k8s, core_v1, producer, ns, "CANARY-rollout-1")
    eventually(lambda: stamp(apps_v1, ns, "web") == h1, message="the template stamped")
    eventually(lambda: revision(apps_v1, ns, "web") == 2, message="the Deployment rolled")
    eventually(cp.idle)

    after = raw(admin_client, ns, "web")
    assert without(after, MANAGER) == without(before["web"], MANAGER)  # nothing else changed
    ours = [f for f in after["metadata"]["managedFields"] if f["manager"] == MANAGER]
    assert len(ours) == 1 and ours[0]["operation"] == "Apply"
    assert ours[0]["fieldsV1"] == {
        "f:metadata": {"f:annotations": {"f:projector.nebari.dev/seen-db": {}}},
        "f:spec": {
            "f:template": {
                "f:metadata": {"f:annotations": {"f:projector.nebari.dev/rollout-db": {}}}
            }
        },
    }
    for name in ("plain", "foreign"):  # not opted in; naming a Secret that is not ours
        now = raw(admin_client, ns, name)
        assert now["metadata"]["resourceVersion"] == before[name]["metadata"]["resourceVersion"]
    events = core_v1.list_namespaced_event(ns, field_selector="involvedObject.name=web").items
    rolled = [e for e in events if e.reason == "RolloutStarted"]
    assert len(rolled) == 1 and rolled[0].involved_object.kind == "Deployment"
    assert cp.metric("projector_rollouts_total", grant=grant, namespace=ns) == 1


def test_restarts_and_a_leader_failover_roll_nothing(rollout_rbac: None, world: World) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    first = world.start("--rollouts")
    producer, ns = world.opted_in()
    h1 = rolled(k8s, core_v1, apps_v1, producer, ns)
    first.stop()

    for _ in range(2):  # two restarts: each decides again, and rolls nothing
        cp = world.start("--rollouts")
        eventually(lambda: settled(cp, ns, "web"))  # noqa: B023 (called before the loop goes on)
        assert revision(apps_v1, ns, "web") == 2
        cp.stop()

    a, b = (
        world.start("--rollouts", f"--id=r{i}", *LEASE_FLAGS, leader_elect=True) for i in (1, 2)
    )
    leading = eventually(lambda: [p for p in (a, b) if p.metric("projector_leader") == 1])
    leader, standby = (a, b) if leading == [a] else (b, a)
    eventually(lambda: settled(leader, ns, "web"))
    leader.stop(signal.SIGKILL)  # no release: the standby waits out the lease, then leads
    eventually(lambda: standby.metric("projector_leader") == 1, 20, message="failover")
    eventually(lambda: settled(standby, ns, "web"))
    assert revision(apps_v1, ns, "web") == 2 and stamp(apps_v1, ns, "web") == h1

    h2 = rotate(k8s, core_v1, producer, ns, "CANARY-rollout-2")  # the new leader rolls changes
    eventually(lambda: stamp(apps_v1, ns, "web") == h2 and revision(apps_v1, ns, "web") == 3)


def test_a_rollout_waits_for_the_last_one_to_finish_then_rolls_the_newest_once(
    rollout_rbac: None, world: World
) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    cp = world.start("--rollouts")
    producer, ns = world.opted_in()
    h1 = rolled(k8s, core_v1, apps_v1, producer, ns)

    # one replica that can never become available (no node): its rollout keeps progressing
    apps_v1.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 1}})
    eventually(
        lambda: (
            (apps_v1.read_namespaced_deployment_status("web", ns).status.updated_replicas or 0) == 1
        )
    )
    rotate(k8s, core_v1, producer, ns, "CANARY-rollout-2")
    rotate(k8s, core_v1, producer, ns, "CANARY-rollout-3")
    h3 = copy_hash(core_v1, ns)
    eventually(lambda: '"rollout held' in cp.logs(), message="the rollout held back")
    eventually(cp.idle)
    assert stamp(apps_v1, ns, "web") == h1 and revision(apps_v1, ns, "web") == 2

    apps_v1.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 0}})  # done now
    eventually(lambda: stamp(apps_v1, ns, "web") == h3, message="the newest content rolled")
    eventually(cp.idle)
    assert revision(apps_v1, ns, "web") == 3  # once more, with the newest hash only


def test_a_burst_of_100_source_updates_in_10_s_rolls_a_few_times(
    rollout_rbac: None,
    world: World,
    record_property: Any,
) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    # the chart's debounce (the tests' default is shorter)
    cp = world.start("--rollouts", "--debounce=0.05", "--debounce-max=0.5")
    producer, ns = world.opted_in()
    start = time.monotonic()
    k8s.burst(producer, "db", "password", "CANARY-burst-")
    eventually(lambda: k8s.copy_data(ns, "db") == {"password": "CANARY-burst-99"}, 30)
    final = copy_hash(core_v1, ns)
    eventually(lambda: stamp(apps_v1, ns, "web") == final, 30, message="the last content rolled")
    eventually(cp.idle)
    rollouts = revision(apps_v1, ns, "web") - 1
    record_property("rollouts", rollouts)
    print(f"burst: 100 updates in {time.monotonic() - start:.1f} s -> {rollouts} rollouts")
    assert 1 <= rollouts <= 5  # measured 1, 3, 4, 1 (zero replicas: only the window collapses)


# --- opted in on the pod template (issue 37, item 3) ----------------------------------------------

CHART = "helm"
"""The field manager of the chart that renders the consumer (Helm 4 applies server-side)."""
CHECKSUM = {"checksum/config": "c1"}  # what charts put on a pod template anyway


def chart_apply(api: client.ApiClient, ns: str, name: str, template_notes: dict[str, str]) -> None:
    """What a chart with values like dask-gateway's `gateway.annotations` renders and applies:
    a Deployment whose pod template carries `template_notes`, its own metadata none. Not
    forced: a field of projector's in the way would fail it."""
    body = api.sanitize_for_serialization(consumer(name, IMAGE))
    body |= {"apiVersion": "apps/v1", "kind": "Deployment"}
    body["metadata"]["namespace"] = ns
    body["spec"]["template"]["metadata"]["annotations"] = dict(template_notes)
    dynamic = DynamicClient(api)
    deployments = dynamic.resources.get(api_version="apps/v1", kind="Deployment")
    dynamic.server_side_apply(deployments, body=body, field_manager=CHART)


def template_notes(apps: client.AppsV1Api, ns: str, name: str) -> dict[str, str]:
    return dict(apps.read_namespaced_deployment(name, ns).spec.template.metadata.annotations or {})


def owned(obj: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    """The managedFields entries of `manager`, without their time stamps."""
    return [
        {k: v for k, v in f.items() if k != "time"}
        for f in obj["metadata"].get("managedFields") or []
        if f["manager"] == manager
    ]


def test_a_pod_template_opt_in_rolls_once_and_its_annotation_stays_the_charts(
    rollout_rbac: None,
    world: World,
    admin_client: client.ApiClient,
) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    cp = world.start("--rollouts")
    producer, ns, grant = world.project()
    h0 = copy_hash(core_v1, ns)
    chart = {**CHECKSUM, ROLLOUT_ON: "db"}
    chart_apply(admin_client, ns, "web", chart)  # opted in from the start, on its template only
    chart_apply(admin_client, ns, "late", CHECKSUM)
    eventually(lambda: revision(apps_v1, ns, "late") == 1)
    chart_apply(admin_client, ns, "late", chart)  # opts in later: a template change of its own
    eventually(lambda: revision(apps_v1, ns, "late") == 2, message="Kubernetes' own rollout")

    # first sight: a baseline on each Deployment's own metadata, no stamp, no rollout of ours
    for name in ("web", "late"):
        eventually(lambda: baselined(apps_v1, ns, name, h0), message=f"{name} baselined")  # noqa: B023
    eventually(cp.idle)
    assert stamp(apps_v1, ns, "web") is None and stamp(apps_v1, ns, "late") is None
    assert revision(apps_v1, ns, "web") == 1 and revision(apps_v1, ns, "late") == 2
    before = raw(admin_client, ns, "web")

    h1 = rotate(k8s, core_v1, producer, ns, "CANARY-rollout-1")
    for name, rev in (("web", 2), ("late", 3)):  # one rollout each, no more
        eventually(
            lambda: stamp(apps_v1, ns, name) == h1 and revision(apps_v1, ns, name) == rev,  # noqa: B023
            message=f"{name} rolled once",
        )
    eventually(cp.idle)
    assert revision(apps_v1, ns, "web") == 2 and revision(apps_v1, ns, "late") == 3

    after = raw(admin_client, ns, "web")
    assert template_notes(apps_v1, ns, "web") == {**chart, "projector.nebari.dev/rollout-db": h1}
    assert without(after, MANAGER) == without(before, MANAGER)  # nothing else changed
    # the chart's fields, rollout-on on the template among them, are still the chart's alone
    charts = owned(after, CHART)
    assert charts == owned(before, CHART) and len(charts) == 1
    template_fields = charts[0]["fieldsV1"]["f:spec"]["f:template"]["f:metadata"]
    assert f"f:{ROLLOUT_ON}" in template_fields["f:annotations"]
    ours = owned(after, MANAGER)
    assert len(ours) == 1 and ours[0]["fieldsV1"] == {
        "f:metadata": {"f:annotations": {"f:projector.nebari.dev/seen-db": {}}},
        "f:spec": {
            "f:template": {
                "f:metadata": {"f:annotations": {"f:projector.nebari.dev/rollout-db": {}}}
            }
        },
    }
    events = core_v1.list_namespaced_event(ns, field_selector="involvedObject.name=web").items
    assert [e.reason for e in events if e.reason == "RolloutStarted"] == ["RolloutStarted"]
    assert cp.metric("projector_rollouts_total", grant=grant, namespace=ns) == 2  # web, late

    chart_apply(admin_client, ns, "web", chart)  # the chart applied again: nothing moves
    eventually(cp.idle)
    assert raw(admin_client, ns, "web")["metadata"]["generation"] == after["metadata"]["generation"]


def test_removing_a_pod_template_opt_in_stops_rollouts(
    rollout_rbac: None,
    world: World,
    admin_client: client.ApiClient,
) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    cp = world.start("--rollouts")
    producer, ns, _ = world.project()
    chart = {**CHECKSUM, ROLLOUT_ON: "db"}
    chart_apply(admin_client, ns, "web", chart)
    eventually(lambda: baselined(apps_v1, ns, "web", copy_hash(core_v1, ns)))
    h1 = rotate(k8s, core_v1, producer, ns, "CANARY-rollout-1")
    eventually(lambda: stamp(apps_v1, ns, "web") == h1 and revision(apps_v1, ns, "web") == 2)

    # the chart drops it: gone from the template (projector never held it), and Kubernetes
    # rolls that template change as any other
    chart_apply(admin_client, ns, "web", CHECKSUM)
    eventually(lambda: ROLLOUT_ON not in template_notes(apps_v1, ns, "web"), message="dropped")
    eventually(lambda: revision(apps_v1, ns, "web") == 3)
    # a later opt-in on the same watch, baselined: the removal before it has been seen too
    chart_apply(admin_client, ns, "probe", chart)
    eventually(lambda: baselined(apps_v1, ns, "probe", h1), message="the probe baselined")

    h2 = rotate(k8s, core_v1, producer, ns, "CANARY-rollout-2")
    eventually(lambda: stamp(apps_v1, ns, "probe") == h2, message="the probe rolled")
    eventually(cp.idle)
    assert stamp(apps_v1, ns, "web") == h1 and revision(apps_v1, ns, "web") == 3
    assert template_notes(apps_v1, ns, "web") == {**CHECKSUM, "projector.nebari.dev/rollout-db": h1}


def test_without_the_flag_no_workload_is_listed_watched_or_touched(world: World) -> None:
    k8s, core_v1, apps_v1 = world.k8s, world.core, world.apps
    cp = world.start()  # the default: --rollouts off, and the shipped RBAC has no apps rule
    producer, ns, _ = world.project()
    created = apps_v1.create_namespaced_deployment(ns, consumer("web", IMAGE, rollout_on="db"))
    rotate(k8s, core_v1, producer, ns, "CANARY-rollout-1")
    eventually(cp.idle)
    now = apps_v1.read_namespaced_deployment("web", ns)  # its status moves; nothing else
    notes = {k: v for k, v in now.metadata.annotations.items() if k != REVISION}
    assert now.metadata.generation == 1 and notes == {ROLLOUT_ON: "db"}
    assert {f.manager for f in now.metadata.managed_fields} == {
        f.manager for f in created.metadata.managed_fields
    } | {"kube-controller-manager"}
    assert revision(apps_v1, ns, "web") == 1
    requested = {ls for (n, ls) in cp.metrics() if n == "projector_api_requests_total"}
    resources = {dict(ls).get("resource") for ls in requested}
    assert "secrets" in resources and not resources & {"deployments", "statefulsets", "daemonsets"}
