"""`projector run` as an operator meets it: its HTTP port, its metrics, its exit codes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.bed.kube import eventually
from tests.bed.launcher import ControllerProcess, run_module
from tests.support import Cluster, NamespaceFactory


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("projector", *args)


def test_fatal_errors_exit_non_zero_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: a kubeconfig\n")
    result = run("run", f"--kubeconfig={bad}", "--http-port=0", "--no-leader-elect")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("projector: fatal:"), result.stderr


def test_bad_flags_are_refused() -> None:
    assert run("run", "--workers=0").returncode == 2
    assert run("run", "--debounce=1", "--debounce-max=0.5").returncode == 2
    assert run("launch").returncode == 2
    assert run("run", "--lease-duration=10s", "--renew-deadline=10s").returncode == 2
    assert run("run", "--retry-period=3s", "--renew-deadline=2s").returncode == 2
    assert run("run", "--id=").returncode == 2


def test_http_port_serves_health_readiness_and_metrics(
    k8s: Cluster, make_namespace: NamespaceFactory, controller: ControllerProcess
) -> None:
    assert controller.get("/healthz") == (200, "ok\n")
    assert controller.get("/readyz") == (200, "ok\n")
    src, a = make_namespace(), make_namespace()
    k8s.source(src, "hub", {"k": "CANARY-cli"}, export_to="*")
    g = k8s.grant((src, "hub"), namespaces=[a])
    eventually(lambda: k8s.copy_data(a, "hub") is not None)
    eventually(lambda: controller.metric("projector_grants", ready="true") >= 1)
    eventually(lambda: controller.metric("projector_projection_latency_seconds_count") >= 1)
    names = {name for name, _ in controller.metrics()}
    for expected in (
        "projector_projection_latency_seconds_bucket",
        "projector_reconcile_duration_seconds_bucket",
        "projector_reconcile_total",
        "projector_writes_total",
        "projector_queue_depth",
        "projector_api_requests_total",
        "projector_informer_events_total",
        "projector_grants",
        "projector_leader",
    ):
        assert expected in names, expected
    assert controller.metric("projector_writes_total", action="Create", result="ok") >= 1
    before = controller.metric("projector_grants")
    revoked = controller.metric("projector_revocation_seconds_count")
    k8s.delete_grant(g)  # onRevoke Delete: the copy goes, a revocation observed
    eventually(lambda: controller.metric("projector_grants") == before - 1)
    eventually(lambda: k8s.copy_data(a, "hub") is None)
    # at least this one: orphans other tests left on the session plane are revoked too
    eventually(lambda: controller.metric("projector_revocation_seconds_count") >= revoked + 1)
