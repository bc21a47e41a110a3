"""The local control plane is a real Kubernetes API: each test fails against a fake or a half-plane.

Watches with resourceVersion semantics, RBAC that denies, CEL validation, label selectors,
optimistic concurrency, and the controllers (namespace, garbage collector) that envtest lacks.
The last section tests the plane's own lifecycle: starts that retry, stops that leave nothing.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from tests.bed.controlplane import plane as plane_module
from tests.bed.controlplane.plane import (
    APISERVER,
    CONTROLLER_MANAGER,
    ETCD,
    ControlPlane,
    ControlPlaneError,
    Process,
    group_members,
    kube_version,
    proc_stat,
    processes_under,
    stop_processes,
)
from tests.bed.kube import (
    api_client,
    bind_service_account,
    eventually,
    token_kubeconfig,
    unique_name,
)
from tests.support import NamespaceFactory, ServiceAccountKubeconfigFactory, status_of

TEST_GROUP = "tests.projector.invalid"
CEL_MESSAGE = "replicas must not exceed maxReplicas"

ClusterRoleFactory = Callable[[list[client.V1PolicyRule]], str]


def _secret(name: str, labels: dict[str, str] | None = None, **meta: Any) -> client.V1Secret:
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels=labels, **meta),
        string_data={"value": name},
    )


@pytest.fixture
def cluster_role(rbac_v1: client.RbacAuthorizationV1Api) -> Iterator[ClusterRoleFactory]:
    """Throwaway ClusterRoles (cluster-scoped, so namespace deletion would not remove them)."""
    created: list[str] = []

    def make(rules: list[client.V1PolicyRule]) -> str:
        name = unique_name("tests-role")
        rbac_v1.create_cluster_role(
            client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name), rules=rules)
        )
        created.append(name)
        return name

    yield make
    for name in created:
        rbac_v1.delete_cluster_role(name)


SECRET_READER = [client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["list", "get"])]


def test_watch_sees_secret_created_after_it_started(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_secret(namespace, _secret("before"))
    listed = core_v1.list_namespaced_secret(namespace)
    assert listed.metadata is not None
    core_v1.create_namespaced_secret(namespace, _secret("first"))

    watcher = watch.Watch()
    stream = watcher.stream(
        core_v1.list_namespaced_secret,
        namespace,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=30,
    )
    seen: list[tuple[str, str]] = []
    try:
        for event in stream:
            name = event["raw_object"]["metadata"]["name"]
            seen.append((event["type"], name))
            if name == "first":
                # The watch is open now (it delivered an event): this one can only come live.
                core_v1.create_namespaced_secret(namespace, _secret("second"))
            if name == "second":
                break
    finally:
        watcher.stop()
        stream.close()
    assert seen == [("ADDED", "first"), ("ADDED", "second")]


def test_service_account_needs_rbac(
    core_v1: client.CoreV1Api,
    rbac_v1: client.RbacAuthorizationV1Api,
    cluster_role: ClusterRoleFactory,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    core_v1.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    kubeconfig = token_kubeconfig(tmp_path / "sa", core_v1.api_client, "reader", namespace)
    api = api_client(kubeconfig)
    request.addfinalizer(api.close)
    as_reader = client.CoreV1Api(api)
    list_secrets = functools.partial(as_reader.list_namespaced_secret, namespace)

    assert status_of(list_secrets) == 403

    role = cluster_role(SECRET_READER)
    binding = unique_name("tests-reader")
    bind_service_account(rbac_v1, binding, role, "reader", namespace)
    request.addfinalizer(functools.partial(rbac_v1.delete_cluster_role_binding, binding))

    eventually(lambda: status_of(list_secrets) == 200, message="binding never took effect")
    assert status_of(as_reader.list_namespace) == 403  # only what the role grants


def test_service_account_kubeconfig_fixture(
    service_account_kubeconfig: ServiceAccountKubeconfigFactory,
    cluster_role: ClusterRoleFactory,
    namespace: str,
    request: pytest.FixtureRequest,
) -> None:
    kubeconfig = service_account_kubeconfig(cluster_role(SECRET_READER), namespace)
    api = api_client(kubeconfig)
    request.addfinalizer(api.close)

    review = client.AuthenticationV1Api(api).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert review.status is not None and review.status.user_info is not None
    username = review.status.user_info.username or ""
    assert username.startswith(f"system:serviceaccount:{namespace}:")
    as_sa = client.CoreV1Api(api)
    assert status_of(functools.partial(as_sa.list_namespaced_secret, namespace)) == 200
    assert status_of(functools.partial(as_sa.list_namespaced_config_map, namespace)) == 403


@pytest.fixture
def widget_crd(admin_client: client.ApiClient) -> Iterator[str]:
    """A throwaway CRD whose schema carries a CEL rule; returns its plural."""
    ext = client.ApiextensionsV1Api(admin_client)
    name = f"widgets.{TEST_GROUP}"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["replicas", "maxReplicas"],
                "properties": {
                    "replicas": {"type": "integer"},
                    "maxReplicas": {"type": "integer"},
                },
                "x-kubernetes-validations": [
                    {"rule": "self.replicas <= self.maxReplicas", "message": CEL_MESSAGE}
                ],
            }
        },
    }
    crd = client.V1CustomResourceDefinition.model_validate(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": TEST_GROUP,
                "scope": "Namespaced",
                "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": schema},
                    }
                ],
            },
        }
    )
    ext.create_custom_resource_definition(crd)

    def established() -> bool:
        status = ext.read_custom_resource_definition(name).status
        conditions = (status.conditions if status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    eventually(established, message=f"CRD {name} never Established")
    yield "widgets"
    ext.delete_custom_resource_definition(name)


def test_crd_cel_rule_rejects_invalid_object(
    custom_objects: client.CustomObjectsApi, widget_crd: str, namespace: str
) -> None:
    def widget(name: str, replicas: int, max_replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": f"{TEST_GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "maxReplicas": max_replicas},
        }

    create = functools.partial(
        custom_objects.create_namespaced_custom_object, TEST_GROUP, "v1", namespace, widget_crd
    )
    # Established can precede the handler serving the new type by a moment.
    eventually(lambda: create(widget("good", 1, 2)), message="valid Widget never accepted")

    with pytest.raises(client.ApiException) as rejected:
        create(widget("bad", 3, 2))
    assert rejected.value.status == 422
    assert CEL_MESSAGE in (rejected.value.body or "")


def test_label_selector_returns_only_matching(core_v1: client.CoreV1Api, namespace: str) -> None:
    for name, tier in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        core_v1.create_namespaced_secret(namespace, _secret(name, {"tier": tier}))
    core_v1.create_namespaced_secret(namespace, _secret("unlabelled"))

    def names(selector: str) -> set[str]:
        items = core_v1.list_namespaced_secret(namespace, label_selector=selector).items
        return {s.metadata.name for s in items if s.metadata and s.metadata.name}

    assert names("tier=a") == {"a1", "a2"}
    assert names("tier=b") == {"b1"}
    assert names("tier") == {"a1", "a2", "b1"}


def test_stale_update_conflicts(core_v1: client.CoreV1Api, namespace: str) -> None:
    core_v1.create_namespaced_secret(namespace, _secret("contended"))
    fresh = core_v1.read_namespaced_secret("contended", namespace)
    stale = fresh.model_copy(deep=True)

    fresh.string_data = {"value": "new"}
    core_v1.replace_namespaced_secret("contended", namespace, fresh)

    stale.string_data = {"value": "lost update"}
    with pytest.raises(client.ApiException) as conflict:
        core_v1.replace_namespaced_secret("contended", namespace, stale)
    assert conflict.value.status == 409


def test_namespace_deletion_completes(
    core_v1: client.CoreV1Api, make_namespace: NamespaceFactory
) -> None:
    doomed = make_namespace()
    core_v1.create_namespaced_secret(doomed, _secret("content"))
    core_v1.delete_namespace(doomed)

    read = functools.partial(core_v1.read_namespace, doomed)
    eventually(
        lambda: status_of(read) == 404,
        timeout=60,
        message=f"namespace {doomed} still exists: is kube-controller-manager running?",
    )


def test_garbage_collector_deletes_dependents(core_v1: client.CoreV1Api, namespace: str) -> None:
    owner = core_v1.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    assert owner.metadata is not None and owner.metadata.uid is not None
    reference = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    core_v1.create_namespaced_secret(namespace, _secret("dependent", owner_references=[reference]))
    core_v1.delete_namespaced_config_map("owner", namespace)

    read = functools.partial(core_v1.read_namespaced_secret, "dependent", namespace)
    eventually(
        lambda: status_of(read) == 404,
        timeout=60,
        message="dependent Secret outlived its owner: is the garbage collector running?",
    )


def test_version_is_pinned(admin_client: client.ApiClient) -> None:
    """The pin, or the version make compat asked for: its tests ran on the server it names."""
    info = client.VersionApi(admin_client).get_code()
    assert info.git_version == kube_version()


# --- the plane's own lifecycle (issue 14): a start that never flakes, a stop that never leaks ---

CYCLES = 10
SPAWNS = 30


class RecordingPlane(ControlPlane):
    """A plane that remembers every process it spawned, across attempts and stop()."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spawned: list[Process] = []

    def _spawn(self, name: str, args: list[str]) -> None:
        super()._spawn(name, args)
        self.spawned.append(self.processes[name])


def fake_binaries(dest: Path, real: Path, **fakes: str) -> Path:
    """A binaries dir of links to the real ones, except ``fakes``: name (with _ for -) -> either
    an absolute path to link to, or the body of a shell script."""
    dest.mkdir()
    for name in (ETCD, APISERVER, CONTROLLER_MANAGER):
        fake = fakes.get(name.replace("-", "_"))
        if fake is None or fake.startswith("/"):
            (dest / name).symlink_to(fake or real / name)
        else:
            (dest / name).write_text(f"#!/bin/sh\n{fake}")
            (dest / name).chmod(0o755)
    return dest


def evict_from_page_cache(path: Path) -> None:
    """Drop a file's cached pages (clean ones, not mapped by a running process)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def survivors(plane: RecordingPlane) -> list[str]:
    """Anything of the plane still running, or not reaped: by recorded pid and start time, by
    process group, and by a /proc scan for command lines that name the plane's root dir."""
    found = []
    for proc in plane.spawned:
        assert proc.popen is not None
        if proc.popen.returncode is None:
            found.append(f"{proc.name} pid {proc.pid} was not reaped")
        stat = proc_stat(proc.pid)
        if stat is not None and stat.start_ticks == proc.start_ticks:
            found.append(f"{proc.name} pid {proc.pid} is still there ({stat.state})")
    for proc in plane.spawned:
        found += [f"pid {pid} in {proc.name}'s process group" for pid in group_members(proc.pid)]
    found += [f"pid {pid} under {plane.root}: {cmd}" for pid, cmd in processes_under(plane.root)]
    return found


def only_port_clashes(failed_attempts: list[str]) -> bool:
    """start() retries any failure, so a stress test must look at why attempts failed: a port
    that free_ports() chose and something else bound before the server is the one excusable."""
    return all("address already in use" in failure for failure in failed_attempts)


def test_own_child_is_alive_whatever_proc_says(
    binaries: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a child of ours runs is its wait status, never a read of /proc (that can fail)."""
    monkeypatch.setattr(plane_module, "_is_recorded_process", lambda *_: False)
    fakes = fake_binaries(tmp_path / "bin", binaries, etcd="/bin/sleep")
    plane = RecordingPlane(tmp_path / "plane", fakes)
    plane._clean()
    try:
        plane._spawn(ETCD, ["300"])
        assert plane.processes[ETCD].alive()
    finally:
        plane.stop()
    assert not plane.spawned[0].alive()
    assert survivors(plane) == []


def test_a_just_started_server_is_alive(binaries: Path, tmp_path: Path) -> None:
    """Issue 14: /proc/<pid>/cmdline reads empty between the exec() that Popen waits for and the
    kernel filling in the new argv. The check that read it declared a starting etcd dead (its log
    still empty), and stop() skipped it as dead: it kept running. The window is widest when the
    binary is not in the page cache (after a build, under memory pressure): the old check said
    "dead" for about half of these spawns, and for 1-3% on a busy machine with a warm cache."""
    plane = RecordingPlane(tmp_path, binaries, crd_dir=None)
    plane._clean()
    try:
        for i in range(SPAWNS):
            evict_from_page_cache(binaries / ETCD)
            plane._spawn(
                ETCD,
                [
                    f"--data-dir={tmp_path / f'etcd-{i}'}",
                    "--listen-client-urls=http://127.0.0.1:0",
                    "--listen-peer-urls=http://127.0.0.1:0",
                    "--advertise-client-urls=http://127.0.0.1:2379",
                ],
            )
            assert plane.processes[ETCD].alive(), f"spawn {i}: a just-started etcd looks dead"
            stop_processes([plane.processes[ETCD]])
    finally:
        stop_processes(plane.spawned)
    assert survivors(plane) == []


def test_failed_start_retries_and_leaves_nothing_running(binaries: Path, tmp_path: Path) -> None:
    """Each attempt: etcd runs, then kube-apiserver exits leaving a child that ignores SIGTERM
    in its process group. The error names every attempt and quotes every log; nothing survives."""
    fakes = fake_binaries(
        tmp_path / "bin",
        binaries,
        kube_apiserver="trap '' TERM\nsleep 300 &\necho broken apiserver >&2\nexit 3\n",
    )
    plane = RecordingPlane(tmp_path / "plane", fakes, crd_dir=None, die_with_parent=True)
    with pytest.raises(ControlPlaneError) as failed:
        plane.start(attempts=2)
    message = str(failed.value)
    assert "2 of 2 attempts failed" in message
    for attempt in (1, 2):
        assert f"attempt {attempt}: kube-apiserver (pid" in message
    assert message.count("ended (exit code 3)") == 2
    assert message.count("broken apiserver") == 2
    assert message.count(f"last lines of {plane.logs / 'etcd.log'}") == 2
    assert [p.name for p in plane.spawned] == [ETCD, APISERVER] * 2
    assert len({p.pid for p in plane.spawned}) == 4
    assert plane.processes == {}
    assert survivors(plane) == []


def test_error_of_stop_never_hides_the_start_error(
    binaries: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_stop(processes: Sequence[Process]) -> None:
        stop_processes(processes)
        raise ControlPlaneError("stop failed too")

    monkeypatch.setattr(plane_module, "stop_processes", failing_stop)
    fakes = fake_binaries(tmp_path / "bin", binaries, etcd=str(tmp_path / "missing"))
    plane = RecordingPlane(tmp_path / "plane", fakes, crd_dir=None)
    with pytest.raises(ControlPlaneError) as failed:
        plane.start(attempts=3)
    assert "attempt 1: cannot start etcd" in str(failed.value)
    assert "1 of 3 attempts failed" in str(failed.value)  # survivors would hold ports: no retry
    assert any("stop failed too" in note for note in failed.value.__notes__)


def test_failed_controller_manager_leaves_no_server_running(binaries: Path, tmp_path: Path) -> None:
    plane = RecordingPlane(
        tmp_path,
        binaries,
        crd_dir=None,
        die_with_parent=True,
        extra_args={CONTROLLER_MANAGER: ["--no-such-flag"]},
    )
    with pytest.raises(ControlPlaneError) as failed:
        plane.start(attempts=1)
    assert "attempt 1: kube-controller-manager (pid" in str(failed.value)
    assert "unknown flag: --no-such-flag" in str(failed.value)
    assert [p.name for p in plane.spawned] == [ETCD, APISERVER, CONTROLLER_MANAGER]
    assert survivors(plane) == []


def test_start_stop_cycles_leave_nothing_running(binaries: Path, tmp_path: Path) -> None:
    """Stress: back-to-back planes in one root (the same data dir, pids and ports recycling)."""
    plane = RecordingPlane(tmp_path, binaries, die_with_parent=True)
    for cycle in range(CYCLES):
        try:
            plane.start()
            assert plane.running(), f"cycle {cycle}"
        finally:
            plane.stop()
        assert survivors(plane) == [], f"cycle {cycle}"
        assert only_port_clashes(plane.failed_attempts), f"cycle {cycle}"
    assert len(plane.spawned) >= 3 * CYCLES


def test_two_planes_at_once_leave_nothing_running(binaries: Path, tmp_path: Path) -> None:
    """Stress: two planes starting concurrently (racing for ports), serving at once, stopped.

    Started from pool threads that outlive the planes: die_with_parent's signal follows the
    thread that spawned a server."""
    planes = [
        RecordingPlane(tmp_path / name, binaries, die_with_parent=True) for name in ("a", "b")
    ]
    with ThreadPoolExecutor(max_workers=len(planes)) as pool:
        try:
            for started in [pool.submit(plane.start) for plane in planes]:
                started.result()
            assert all(plane.running() for plane in planes)
            assert len({plane.server for plane in planes}) == len(planes)
        finally:
            for plane in planes:
                plane.stop()
    for plane in planes:
        assert survivors(plane) == []
        assert only_port_clashes(plane.failed_attempts)
