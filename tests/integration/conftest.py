"""Fixtures to run the real `projector run` process against the local control plane.

The controller runs as a subprocess, with a ServiceAccount token bound to the ClusterRole and
Role shipped in `deploy/rbac/`, so the shipped permissions are what the tests prove. Tests
arrange and assert with the official client (as admin). Every Secret value a test creates is a
canary: after each controller stops, its logs and metrics, and the Events and statuses of the
test's grants, are scanned for those values (raw and base64).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tests import support
from tests.controlplane.plane import ControlPlane, free_port
from tests.support import eventually, unique_name

REPO = Path(__file__).resolve().parents[2]
SYSTEM_NS = "projector-system"
GROUP, VERSION, PLURAL = "projector.nebari.dev", "v1alpha1", "projectiongrants"


@dataclass
class ControllerProcess:
    """One `projector run` subprocess, with its log file and HTTP port."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"controller exited {self.proc.returncode}:\n{self.logs()[-3000:]}"
            )
        with contextlib.suppress(OSError):
            return self.get("/readyz")[0] == 200
        return False

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(self.get("/metrics")[1]):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return sum(
            v
            for (n, ls), v in self.metrics().items()
            if n == name and all((k, val) in ls for k, val in labels.items())
        )

    def reconciles(self) -> float:
        return self.metric("projector_reconcile_total")

    def settled(self) -> bool:
        """Workers ran, and nothing is ready or processing (delayed rechecks may wait)."""
        m = self.metrics()
        return (
            sum(v for (n, _), v in m.items() if n == "projector_reconcile_total") >= 1
            and m.get(("projector_queue_depth", ()), 1) == 0
            and m.get(("projector_queue_processing", ()), 1) == 0
        )

    def writes(self) -> float:
        """Every write the controller made: copies and grant statuses."""
        ok = self.metric("projector_writes_total", result="ok")
        return ok + self.metric("projector_status_writes_total")

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


@dataclass
class Canaries:
    """Secret values planted by tests; none may appear anywhere but in Secrets."""

    values: set[str] = field(default_factory=set)

    def add(self, value: str) -> None:
        self.values.add(value)

    def forms(self) -> set[str]:
        out = set()
        for v in self.values:
            out.add(v)
            out.add(base64.b64encode(v.encode()).decode())
        return out

    def assert_absent(self, where: str, text: str) -> None:
        leaked = sorted(f for f in self.forms() if f in text)
        assert not leaked, f"secret value(s) leaked into {where}: {len(leaked)} found"


@pytest.fixture(scope="session")
def projector_kubeconfig(
    control_plane: ControlPlane,
    admin_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A kubeconfig for the ServiceAccount of deploy/rbac/, with exactly the shipped RBAC."""
    dest = tmp_path_factory.mktemp("projector") / "kubeconfig"
    return support.projector_kubeconfig(admin_client, control_plane, dest)


@pytest.fixture
def canaries() -> Canaries:
    return Canaries()


@pytest.fixture
def start_controller(
    projector_kubeconfig: Path, tmp_path: Path, canaries: Canaries
) -> Iterator[Any]:
    """Start `projector run` subprocesses; each is stopped (SIGTERM, exit 0) and scanned."""
    procs: list[ControllerProcess] = []

    def start(*extra: str, wait_ready: bool = True) -> ControllerProcess:
        port = free_port()
        log = tmp_path / f"controller-{len(procs)}.log"
        args = [
            sys.executable,
            "-m",
            "projector",
            "run",
            f"--kubeconfig={projector_kubeconfig}",
            f"--namespace={SYSTEM_NS}",
            f"--http-port={port}",
            "--http-host=127.0.0.1",
            "--no-leader-elect",
            "--debounce=0.02",
            "--debounce-max=0.2",
            "--log-level=debug",
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        cp = ControllerProcess(proc, port, log)
        procs.append(cp)
        if wait_ready:
            eventually(cp.ready, timeout=30, message="controller /readyz")
        return cp

    yield start
    results = []
    for cp in procs:  # stop every process before asserting anything, so none leaks
        metrics = cp.get("/metrics")[1] if cp.proc.poll() is None else ""
        results.append((cp, cp.stop(), metrics))
    for cp, code, metrics in results:
        print(f"--- controller log (tail) {cp.log} ---\n" + "\n".join(cp.logs().splitlines()[-60:]))
        assert code == 0, f"controller exit code {code}:\n{cp.logs()[-3000:]}"
        canaries.assert_absent("controller logs", cp.logs())
        canaries.assert_absent("metrics", metrics)


@pytest.fixture
def controller(start_controller: Any) -> ControllerProcess:
    """One running controller for this test."""
    return start_controller()


class Cluster:
    """Arrange and assert with the official client, as admin."""

    def __init__(
        self,
        core: client.CoreV1Api,
        custom: client.CustomObjectsApi,
        canaries: Canaries,
        prefix: str,
    ) -> None:
        self.core = core
        self.custom = custom
        self.canaries = canaries
        self.prefix = prefix
        self.grants: list[str] = []

    # -- sources ---------------------------------------------------------------------------------

    def source(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        *,
        export_to: str | None = None,
        exported: bool = True,
        type_: str = "Opaque",
        immutable: bool | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> client.V1Secret:
        for v in data.values():
            self.canaries.add(v)
        meta_labels = dict(labels or {})
        if exported:
            meta_labels["projector.nebari.dev/export"] = "true"
        annotations = (
            {"projector.nebari.dev/export-to": export_to} if export_to is not None else None
        )
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, labels=meta_labels, annotations=annotations),
            type=type_,
            data=encode(data),
            immutable=immutable,
        )
        return self.core.create_namespaced_secret(namespace, body)

    def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        for v in ((patch.get("data") or {}) | (patch.get("stringData") or {})).values():
            if v is not None:
                self.canaries.add(v)
        if "data" in patch:
            patch = {
                **patch,
                "data": {k: None if v is None else b64(v) for k, v in patch["data"].items()},
            }
        self.core.patch_namespaced_secret(name, namespace, patch)

    # -- grants ----------------------------------------------------------------------------------

    def grant(
        self,
        source: tuple[str, str],
        *,
        name: str | None = None,
        namespaces: Sequence[str] | None = None,
        selector: Mapping[str, Any] | None = None,
        keys: Sequence[Mapping[str, str]] | None = None,
        target_name: str | None = None,
        on_revoke: str | None = None,
        on_source_deleted: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        name = name or unique_name(self.prefix)
        target: dict[str, Any] = {}
        if namespaces is not None:
            target["namespaces"] = list(namespaces)
        if selector is not None:
            target["namespaceSelector"] = dict(selector)
        if target_name:
            target["name"] = target_name
        if labels:
            target["labels"] = dict(labels)
        spec: dict[str, Any] = {
            "source": {"namespace": source[0], "name": source[1]},
            "target": target,
        }
        if keys is not None:
            spec["keys"] = list(keys)
        policy = {
            k: v for k, v in (("onRevoke", on_revoke), ("onSourceDeleted", on_source_deleted)) if v
        }
        if policy:
            spec["policy"] = policy
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProjectionGrant",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        self.grants.append(name)
        return name

    def get_grant(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        return cast(dict[str, Any], obj)

    def patch_grant(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, patch)

    def delete_grant(self, name: str) -> None:
        with contextlib.suppress(client.ApiException):
            self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get_grant(name).get("status") or {}

    def condition(self, grant: str, type_: str) -> dict[str, Any] | None:
        for c in self.status(grant).get("conditions") or ():
            if c["type"] == type_:
                return dict(c)
        return None

    def events(self, grant: str) -> list[client.CoreV1Event]:
        evs = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={grant}"
        )
        return list(evs.items)

    # -- copies ----------------------------------------------------------------------------------

    def copy(self, namespace: str, name: str) -> client.V1Secret | None:
        try:
            return self.core.read_namespaced_secret(name, namespace)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def copy_data(self, namespace: str, name: str) -> dict[str, str] | None:
        s = self.copy(namespace, name)
        return None if s is None else decode(s.data or {})

    def scan(self) -> None:
        """No canary in any test grant's status or Events."""
        for g in self.grants:
            with contextlib.suppress(client.ApiException):
                self.canaries.assert_absent(f"status of {g}", json.dumps(self.status(g)))
            text = json.dumps([(e.reason, e.message) for e in self.events(g)])
            self.canaries.assert_absent(f"events of {g}", text)

    def cleanup(self) -> None:
        for g in self.grants:
            self.delete_grant(g)


def b64(v: str) -> str:
    return base64.b64encode(v.encode()).decode()


def encode(data: Mapping[str, str]) -> dict[str, bytes | str]:
    return {k: b64(v) for k, v in data.items()}


def decode(data: Mapping[str, bytes | str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


@pytest.fixture
def k8s(
    core_v1: client.CoreV1Api,
    custom_objects: client.CustomObjectsApi,
    canaries: Canaries,
    request: pytest.FixtureRequest,
    start_controller: Any,
) -> Iterator[Cluster]:
    """The test's view of the cluster; its grants are scanned for canaries and deleted after.

    It depends on `start_controller` so that grants are deleted while the test's controllers
    still run (fixtures tear down in reverse order), leaving fewer orphans to later tests.
    """
    c = Cluster(core_v1, custom_objects, canaries, request.node.name)
    yield c
    try:
        c.scan()
    finally:
        c.cleanup()
