"""Fixtures to run the real `projector run` process against the local control plane.

The controller runs as a subprocess (`tests.bed.launcher`), with a ServiceAccount token bound to the
ClusterRole and Role shipped in `deploy/rbac/`, so the shipped permissions are what the tests
prove; its /metrics is served as shipped (HTTPS, each token reviewed by the API server) and
read with the token of a scraper bound to the shipped metrics-reader ClusterRole. Tests arrange
and assert with the official client (as admin). Every Secret value a test creates is a canary:
after each controller stops, its logs and metrics, and the Events and statuses of the test's
grants, are scanned for those values (raw and base64).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests import support
from tests.bed import kube
from tests.bed.controlplane.plane import ControlPlane
from tests.bed.kube import eventually
from tests.bed.launcher import ControllerProcess, launch
from tests.bed.proxy import Relay, relay_to
from tests.support import Canaries, Cluster


@pytest.fixture(scope="session")
def projector_kubeconfig(
    control_plane: ControlPlane,
    admin_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A kubeconfig for the ServiceAccount of deploy/rbac/, with exactly the shipped RBAC."""
    dest = tmp_path_factory.mktemp("projector") / "kubeconfig"
    return kube.projector_kubeconfig(admin_client, dest)


@pytest.fixture(scope="session")
def metrics_token(admin_client: client.ApiClient) -> str:
    """The token of a scraper (monitoring/prometheus) bound to the shipped metrics-reader role.

    The shipped RBAC is applied here too (idempotent): a module may override
    `projector_kubeconfig` with a function-scoped one.
    """
    kube.install_rbac(admin_client)
    return support.scraper_token(admin_client)


@pytest.fixture
def start_controller(
    projector_kubeconfig: Path, metrics_token: str, tmp_path: Path, canaries: Canaries
) -> Iterator[Any]:
    """Start `projector run` subprocesses; each is stopped (SIGTERM, exit 0) and scanned.

    A process the test stopped itself (`ControllerProcess.stop`) had its exit checked there.
    """
    procs: list[ControllerProcess] = []

    def start(
        *extra: str,
        wait_ready: bool = True,
        leader_elect: bool = False,
        kubeconfig: Path | None = None,
        env: Mapping[str, str] | None = None,
        scraper: str | None = None,
    ) -> ControllerProcess:
        """`kubeconfig`: another identity than the session's shipped-RBAC ServiceAccount (e.g.
        one whose RBAC or API priority a test changes), never admin. `env`: added to the
        process's environment (OTEL_* of a test's collector). `scraper`: the metrics token of
        another control plane's scraper (`support.scraper_token`), for a controller run there."""
        log = tmp_path / f"controller-{len(procs)}.log"
        cp = launch(
            kubeconfig or projector_kubeconfig,
            log,
            "--debounce=0.02",
            "--debounce-max=0.2",
            "--log-level=debug",
            *extra,
            leader_elect=leader_elect,
            env=env,
            metrics_token=scraper or metrics_token,
        )
        procs.append(cp)
        if wait_ready:
            eventually(cp.ready, timeout=30, message="controller /readyz")
            # A first scrape, as Prometheus's would be: the scraper's token is then known, and
            # stays allowed while a fault test keeps the API server from reviewing it.
            eventually(lambda: cp.get("/metrics")[0] == 200, message="a first scrape")
        return cp

    yield start
    results = []
    for cp in procs:  # stop every process before asserting anything, so none leaks
        ended = cp.stopped  # the test ended it itself, and checked how
        metrics = "" if cp.proc.poll() is not None else cp.get("/metrics")[1]
        results.append((cp, cp.stop(), metrics, ended))
    for cp, code, metrics, ended in results:
        print(f"--- controller log (tail) {cp.log} ---\n" + "\n".join(cp.logs().splitlines()[-60:]))
        assert ended or code == 0, f"controller exit code {code}:\n{cp.logs()[-3000:]}"
        canaries.assert_absent("controller logs", cp.logs())
        canaries.assert_absent("metrics", metrics)


@pytest.fixture
def controller(start_controller: Any) -> ControllerProcess:
    """One running controller for this test."""
    return start_controller()


@pytest.fixture
def relayed(
    control_plane: ControlPlane, projector_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[Relay, Path]]:
    """A relay to the session's API server and the controller's kubeconfig through it, for the
    fault tests that break the network (ask for it after `start_controller`: it closes first)."""
    with relay_to(control_plane.server, projector_kubeconfig, tmp_path / "relayed") as pair:
        yield pair


@pytest.fixture
def k8s(start_controller: Any, k8s: Cluster) -> Cluster:
    """The `k8s` of tests/conftest.py, set up after `start_controller` so that it tears down
    first: the test's grants are deleted while its controllers still run, leaving fewer orphans
    to later tests."""
    return k8s
