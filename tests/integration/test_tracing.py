"""Traces proven on a real OpenTelemetry Collector (built from its Go modules, tests/bed/otel/).

`projector run` exports to the collector over OTLP/HTTP while it projects against the real API
server; the collector's file exporter writes what it received as OTLP/JSON, and the test reads
the span tree of one fan-out from there: one reconcile span, one child per copy write and one for
the status write, the grant and namespace on each, the service name and version on the
resource, and an error status on the write that a ResourceQuota (secrets: 0) refused. The same
trace id is the exemplar of the latency histograms (OpenMetrics) and the `trace_id` of the
reconcile's log lines. With PROJECTOR_UPDATE_DOCS=1 these artefacts are written into the traces
section of docs/observability.md.

A second test exports into a black hole (a port that reads and never answers) and stops the
controller: the exit is bounded by `tracing.SPAN_SHUTDOWN_SECONDS`, not by the export timeout.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from projector import __version__
from projector.telemetry.tracing import SPAN_SHUTDOWN_SECONDS
from tests.bed.kube import eventually, unique_name
from tests.bed.launcher import REPO, ControllerProcess
from tests.bed.observability import traces
from tests.bed.otel.harness import STATUS_ERROR, BlackHole, Collector, Span, binary
from tests.support import Cluster, NamespaceFactory

FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
"""A batch leaves 100 ms after the previous one (5 s by default): the test waits less."""


@pytest.fixture(scope="session")
def otelcol_bin() -> Path:
    return binary()


@pytest.fixture
def collector(otelcol_bin: Path, tmp_path: Path) -> Iterator[Collector]:
    c = Collector(otelcol_bin, tmp_path / "otelcol")
    yield c
    c.stop()


def _refusing_namespace(core_v1: client.CoreV1Api, namespace: str) -> None:
    """A ResourceQuota of zero Secrets; wait until its controller has counted usage, so the
    quota admission refuses a create with 'exceeded quota' (not 'status unknown')."""
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-secrets"),
        spec=client.V1ResourceQuotaSpec(hard={"secrets": "0"}),
    )
    core_v1.create_namespaced_resource_quota(namespace, quota)

    def counted() -> bool:
        status = core_v1.read_namespaced_resource_quota("no-secrets", namespace).status
        return bool(status and status.hard and status.used is not None)

    eventually(counted, timeout=30, message="the resourcequota controller counted the quota")


def _openmetrics(ctl: ControllerProcess) -> str:
    """The /metrics page in OpenMetrics, the exposition that carries exemplars."""
    status, page = ctl.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200, status
    return page


def _exemplars(ctl: ControllerProcess, family: str) -> set[str]:
    """The trace ids of the exemplars of one histogram."""
    page = _openmetrics(ctl)
    return {
        s.exemplar.labels["trace_id"]
        for fam in text_string_to_metric_families(page)
        if fam.name == family
        for s in fam.samples
        if s.exemplar is not None
    }


def _tree(spans: list[Span], root: Span) -> str:
    """The span tree of one trace, as text: name, attributes, status."""
    by_parent: dict[str, list[Span]] = {}
    for s in spans:
        by_parent.setdefault(s.parent_id, []).append(s)

    def line(s: Span, depth: int) -> list[str]:
        attrs = " ".join(f"{k}={v}" for k, v in sorted(s.attributes.items()))
        status = f"  ERROR: {s.status_message}" if s.status_code == STATUS_ERROR else ""
        out = [f"{'  ' * depth}{s.name} [{s.span_id}] {attrs}{status}"]
        kids = sorted(by_parent.get(s.span_id, []), key=lambda k: (k.name, str(k.attributes)))
        for kid in kids:
            out += line(kid, depth + 1)
        return out

    return "\n".join([f"trace {root.trace_id}", *line(root, 1)])


def test_one_fan_out_is_one_trace_on_the_collector_linked_from_exemplar_and_logs(
    collector: Collector,
    start_controller: Any,
    k8s: Cluster,
    make_namespace: NamespaceFactory,
    core_v1: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    # Short names, since the span tree goes into the docs as it is.
    src, refused = make_namespace(unique_name("team-db")), make_namespace(unique_name("no-room"))
    targets = sorted(make_namespace(unique_name(f"app-{i}")) for i in range(3))
    _refusing_namespace(core_v1, refused)
    k8s.source(src, "db", {"password": "CANARY-trace-1"}, export_to=",".join([*targets, refused]))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, **FAST_EXPORT}
    ctl: ControllerProcess = start_controller(env=env)
    grant = k8s.grant((src, "db"), name=unique_name("db-to-apps"), namespaces=[*targets, refused])
    eventually(
        lambda: all(k8s.copy_data(ns, "db") == {"password": "CANARY-trace-1"} for ns in targets),
        timeout=30,
        message="copies written",
    )

    def fan_out() -> tuple[Span, list[Span]]:
        """The trace of the reconcile that wrote every copy (retries of the refused one follow)."""
        spans = collector.spans()
        for root in (s for s in spans if s.name == "reconcile"):
            trace = [s for s in spans if s.trace_id == root.trace_id]
            writes = {s.attributes.get("namespace") for s in trace if s.name == "write"}
            if writes == {*targets, refused}:
                return root, trace
        raise AssertionError(f"no fan-out trace among {len(spans)} spans yet")

    root, trace = eventually(fan_out, timeout=30, message="the fan-out's spans reach the collector")
    writes = [s for s in trace if s.name == "write"]
    (status_write,) = [s for s in trace if s.name == "write_status"]
    assert [s for s in trace if s.name == "reconcile"] == [root] and root.parent_id == ""
    assert len(writes) == 4 and len(trace) == 6, [s.name for s in trace]
    assert all(s.parent_id == root.span_id for s in [*writes, status_write])
    assert root.attributes["grant"] == grant and root.attributes["result"] == "error"
    assert root.status_code == STATUS_ERROR  # a write failed: the reconcile is retried
    assert {s.attributes["grant"] for s in [*writes, status_write]} == {grant}
    assert sorted(s.attributes["namespace"] for s in writes) == sorted([*targets, refused])
    for s in writes:
        if s.attributes["namespace"] == refused:
            assert s.status_code == STATUS_ERROR and "exceeded quota" in s.status_message, s
            assert s.attributes["result"] == "WriteFailed"
        else:
            assert s.status_code != STATUS_ERROR and s.attributes["result"] == "Projected", s
    assert status_write.attributes["result"] == "ok"
    for s in trace:
        assert s.resource["service.name"] == "projector"
        assert s.resource["service.version"] == __version__

    # The trace id is the exemplar of both latency histograms and the trace_id of the log lines.
    tid = root.trace_id
    assert _exemplars(ctl, "projector_fanout_latency_seconds") == {tid}
    assert _exemplars(ctl, "projector_projection_latency_seconds") == {tid}
    lines = [json.loads(x) for x in ctl.logs().splitlines() if x.startswith("{")]
    mine = [x for x in lines if x.get("trace_id") == tid]
    assert any(x["event"] == "reconciled" for x in mine), mine
    assert all(x["grant"] == grant for x in mine)
    assert {x["reconcile_id"] for x in mine} == {root.attributes["reconcile_id"]}
    assert ctl.metric("projector_spans_exported_total") > 0
    assert ctl.metric("projector_spans_dropped_total") == 0

    # No Secret value anywhere the collector wrote (the fixture scans logs, metrics, status).
    k8s.canaries.assert_absent("spans received by the collector", collector.text())

    reconciled = next(x for x in mine if x["event"] == "reconciled")
    exemplar_line = next(
        line
        for line in _openmetrics(ctl).splitlines()
        if line.startswith("projector_fanout_latency_seconds_bucket") and tid in line
    )
    section = traces.section(
        tree=_tree(trace, root), exemplar=exemplar_line, log_line=json.dumps(reconciled)
    )
    print(section)
    docs = REPO / "docs" if os.environ.get("PROJECTOR_UPDATE_DOCS") == "1" else tmp_path
    page = (REPO / "docs" / "observability.md").read_text()
    (docs / "observability.md").write_text(traces.replace(page, section))


def test_a_black_holed_receiver_delays_the_exit_by_the_stated_bound_at_most(
    start_controller: Any, k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    hole = BlackHole()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": hole.endpoint,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "60",  # unbounded, the exit would wait this long
            **FAST_EXPORT,
        }
        ctl: ControllerProcess = start_controller(env=env)
        src, dst = make_namespace(), make_namespace()
        k8s.source(src, "db", {"password": "CANARY-trace-2"}, export_to=dst)
        k8s.grant((src, "db"), namespaces=[dst])
        eventually(lambda: k8s.copy_data(dst, "db") is not None, timeout=30, message="copy")
        eventually(lambda: hole.received > 0, timeout=30, message="an export is in flight")
        t0 = time.monotonic()
        assert ctl.stop(signal.SIGTERM, timeout=30) == 0
        took = time.monotonic() - t0
        # SPAN_SHUTDOWN_SECONDS for the spans, plus the controller's own orderly stop.
        assert took < SPAN_SHUTDOWN_SECONDS + 3.0, f"exit took {took:.1f}s"
        print(f"exit with a black-holed receiver: {took:.2f}s")
    finally:
        hole.close()
