"""Traces, logs and metrics of one fan-out, on the in-memory API double.

The span tree is read from the OpenTelemetry SDK's in-memory exporter, the logs are captured as
event dicts through the production processor chain, and the metrics page is fetched over HTTP
with and without the OpenMetrics Accept header.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from projector.control.controller import Controller
from projector.core.kinds import GRANTS, NAMESPACES, SECRETS
from projector.core.model import GRANT_UID_ANNOTATION
from projector.core.names import FIELD_MANAGER
from projector.core.plans import Result
from projector.telemetry.endpoints import metrics_app
from projector.telemetry.logs import configure_logging, log_processors
from projector.telemetry.metrics import Metrics
from projector.telemetry.tracing import trace_id
from tests.bed.kube import eventually
from tests.support import python_runs
from tests.unit.fakeapi import FakeApi
from tests.unit.test_controller import controller
from tests.unit.test_store import grant_obj, ns_obj, source_obj

CANARY = "canary-value-7f3a9c"
TARGETS = ["a", "b", "c"]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    """Every log event dict, after the production chain's context merge (renderer dropped)."""
    events: list[dict[str, Any]] = []

    def keep(_: Any, __: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        events.append(dict(event))
        raise structlog.DropEvent

    chain = log_processors(console=False)[:-1]  # the JSON renderer is replaced by `keep`
    structlog.configure(processors=[*chain, keep], cache_logger_on_first_use=False)
    yield events
    structlog.reset_defaults()


async def fan_out(provider: TracerProvider, metrics: Metrics) -> tuple[FakeApi, Controller]:
    api = FakeApi()
    for ns in ["src", *TARGETS]:
        api.add(NAMESPACES, ns_obj(ns))
    source = source_obj("src", "s")
    source["data"] = {"k": base64.b64encode(CANARY.encode()).decode()}
    api.add(SECRETS, source)
    api.add(GRANTS, grant_obj("g", namespaces=TARGETS))
    ctl = await controller(api, metrics=metrics, tracer=provider.get_tracer("test"))
    metrics.triggered(["g"])
    assert await ctl.reconcile("g") is Result.OK
    return api, ctl


def _no_canary(where: str, text: str) -> None:
    encoded = base64.b64encode(CANARY.encode()).decode()
    assert CANARY not in text and encoded not in text, f"a Secret value leaked into {where}"


async def test_one_fan_out_is_one_reconcile_span_with_a_child_per_write(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    await fan_out(provider, Metrics())
    finished: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    roots = [s for s in finished if s.parent is None]
    assert [s.name for s in roots] == ["reconcile"]
    root = roots[0]
    assert root.attributes is not None
    assert root.attributes["grant"] == "g" and root.attributes["result"] == "success"
    children = [s for s in finished if s.parent is not None]
    assert all(s.parent.span_id == root.context.span_id for s in children if s.parent)
    assert all(s.context.trace_id == root.context.trace_id for s in children)
    writes = sorted(
        (dict(s.attributes or {}) for s in children if s.name == "write"),
        key=lambda a: str(a["namespace"]),
    )
    assert writes == [
        {"grant": "g", "namespace": ns, "action": "Create", "result": "Projected"} for ns in TARGETS
    ]
    statuses = [dict(s.attributes or {}) for s in children if s.name == "write_status"]
    assert statuses == [{"grant": "g", "action": "status", "result": "ok"}]
    _no_canary("spans", json.dumps([json.loads(s.to_json()) for s in finished]))


async def test_every_log_line_of_a_reconcile_carries_grant_reconcile_id_and_trace_id(
    spans: tuple[TracerProvider, InMemorySpanExporter], captured: list[dict[str, Any]]
) -> None:
    provider, exporter = spans
    await fan_out(provider, Metrics())
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "reconcile"]
    assert captured, "a fan-out that wrote logs at least its summary line"
    assert any(e["event"] == "reconciled" for e in captured)
    for event in captured:
        assert event["grant"] == "g"
        assert event["reconcile_id"] == "1"
        assert event["trace_id"] == f"{root.context.trace_id:032x}"
    _no_canary("logs", json.dumps(captured, default=str))


def test_the_controller_loads_structlog_without_rich_and_rich_stays_importable() -> None:
    """rich (3 MiB of RSS, there only for the CEL package's command line) is not loaded with
    the controller; a console line still shows an exception's traceback; `import rich` works."""
    code = (
        "import io, sys; import projector.app; "
        "from projector.telemetry.logs import configure_logging; "
        "assert 'rich' not in sys.modules, sorted(m for m in sys.modules if 'rich' in m); "
        "import structlog\n"
        "class T(io.StringIO):\n"
        "    def isatty(self): return True\n"
        "out = T(); configure_logging(stream=out)\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    structlog.get_logger('t').exception('boom')\n"
        "line = out.getvalue(); assert 'Traceback' in line and 'ZeroDivisionError' in line, line\n"
        "import rich.console; assert rich.console.Console"
    )
    python_runs(code)


def test_logs_are_json_on_a_pipe_and_console_lines_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    try:
        pipe, tty = io.StringIO(), Tty()
        configure_logging(stream=pipe)
        structlog.get_logger("t").info("hello", grant="g")
        assert json.loads(pipe.getvalue())["grant"] == "g"
        configure_logging(stream=tty)
        structlog.get_logger("t").info("hello", grant="g")
        line = tty.getvalue()
        assert "hello" in line and "grant=g" in line and not line.lstrip().startswith("{")
    finally:
        structlog.reset_defaults()


async def _scrape(metrics: Metrics, accept: str | None) -> tuple[str, str]:
    runner = web.AppRunner(metrics_app(metrics, access=None))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        headers = {"Accept": accept} if accept else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r,
        ):
            return r.headers["Content-Type"], await r.text()
    finally:
        await runner.cleanup()


async def test_latency_exemplars_carry_the_reconcile_trace_id_in_openmetrics_only(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    metrics = Metrics()
    await fan_out(provider, metrics)
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "reconcile"]
    tid = f"{root.context.trace_id:032x}"
    kind, page = await _scrape(metrics, "application/openmetrics-text; version=1.0.0")
    assert kind.startswith("application/openmetrics-text")
    for name in (
        "projector_projection_latency_seconds_bucket",
        "projector_fanout_latency_seconds_bucket",
        "projector_reconcile_duration_seconds_bucket",
    ):
        assert re.search(rf'^{name}\{{le="[^"]+"\}} \S+ # \{{trace_id="{tid}"\}}', page, re.M), name
    kind, text = await _scrape(metrics, None)
    assert kind.startswith("text/plain") and "trace_id" not in text
    _no_canary("metrics", page + text)


def _sample(page: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    braces = f"\\{{{want}\\}}" if want else ""
    m = re.search(rf"^{name}{braces} (\S+)$", page, re.M)
    assert m, f"{name}{{{want}}} is not exposed"
    return float(m.group(1))


async def test_label_values_exist_at_zero_before_anything_happens() -> None:
    metrics = Metrics()
    metrics.bind_informers(["grants", "secrets"], 180.0)
    _, page = await _scrape(metrics, None)
    assert _sample(page, "projector_writes_total", action="Create", result="conflict") == 0
    assert _sample(page, "projector_reconcile_total", result="error") == 0
    assert _sample(page, "projector_queue_events_total", event="retried") == 0
    assert _sample(page, "projector_informer_events_total", kind="grants", type="RELIST") == 0
    assert _sample(page, "projector_projections", state="Conflict") == 0
    assert _sample(page, "projector_grants", ready="false") == 0
    assert _sample(page, "projector_informer_stall_threshold_seconds") == 180
    assert "process_resident_memory_bytes" in page


def test_informer_silence_grows_until_the_server_speaks_and_errors_do_not_count() -> None:
    now = [100.0]
    metrics = Metrics(clock=lambda: now[0])
    metrics.bind_informers(["grants"], 30.0)

    def idle() -> float | None:
        return metrics.registry.get_sample_value(
            "projector_informer_seconds_since_activity", {"kind": "grants"}
        )

    now[0] = 112.0
    assert idle() == 12.0
    metrics.on_informer_event("grants", "ERROR")
    now[0] = 115.0
    assert idle() == 15.0
    metrics.on_informer_event("grants", "BOOKMARK")
    now[0] = 116.5
    assert idle() == 1.5


def test_longest_running_reconcile_is_the_oldest_under_way() -> None:
    now = [10.0]
    metrics = Metrics(clock=lambda: now[0])

    def longest() -> float | None:
        return metrics.registry.get_sample_value("projector_queue_longest_running_seconds")

    metrics.started("a", 10.0)
    metrics.started("b", 12.0)
    now[0] = 15.0
    assert longest() == 5.0
    metrics.reconciled(Result.OK, "a")
    assert longest() == 3.0
    metrics.reconciled(Result.OK, "b")
    assert longest() == 0.0


def test_spans_are_exported_over_otlp_only_when_an_endpoint_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from projector import __version__
    from projector.telemetry.tracing import BoundedSpanProcessor, configure_tracing

    def exporters(tracer: Any) -> list[Any]:
        processors = tracer.span_processor._span_processors
        return [p.span_exporter._inner for p in processors if isinstance(p, BoundedSpanProcessor)]

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert exporters(configure_tracing()) == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    tracer: Any = configure_tracing()  # the SDK tracer, to read its processors
    try:
        assert [type(e) for e in exporters(tracer)] == [OTLPSpanExporter]
        attributes = tracer.resource.attributes
        assert (attributes["service.name"], attributes["service.version"]) == (
            "projector",
            __version__,
        )
    finally:
        tracer.span_processor.shutdown()


def test_a_grant_s_conditions_are_one_series_each_by_name_and_reason_and_go_with_it() -> None:
    m = Metrics()

    def series() -> dict[tuple[str, str, str], float]:
        return {
            (s.labels["grant"], s.labels["condition"], s.labels["reason"]): s.value
            for f in m.registry.collect()
            if f.name == "projector_grant_condition"
            for s in f.samples
        }

    conflicted = [
        {"type": "Ready", "status": "False", "reason": "Conflict"},
        {"type": "SourceAvailable", "status": "True", "reason": "Available"},
    ]
    m.grant_ready("hub", False, conflicted)
    assert series() == {("hub", "Ready", "Conflict"): 0, ("hub", "SourceAvailable", "Available"): 1}
    m.grant_ready("hub", True, [{"type": "Ready", "status": "True", "reason": "Projected"}])
    assert series() == {("hub", "Ready", "Projected"): 1}  # the old reason's series is gone
    m.grant_ready("hub", None)
    assert series() == {}


class _StuckReceiver(SpanExporter):
    """An exporter whose export blocks until released, then fails: a receiver that is down."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def _end_spans(processor: Any, n: int) -> None:
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    for i in range(n):
        tracer.start_span(f"s{i}").end()


def test_with_the_receiver_stuck_spans_beyond_the_queue_are_dropped_and_counted() -> None:
    from projector.telemetry.tracing import BoundedSpanProcessor

    metrics = Metrics()
    receiver = _StuckReceiver()
    processor = BoundedSpanProcessor(
        receiver, hook=metrics.on_spans, max_queue_size=8, schedule_delay_millis=60_000
    )
    try:
        _end_spans(processor, 8)  # a full batch: the worker takes it and blocks in export
        assert receiver.entered.wait(10)
        _end_spans(processor, 20)  # 8 fill the queue again, 12 push out older ones
        assert metrics.spans_dropped.labels("queue_full")._value.get() == 12
        assert metrics.spans_dropped.labels("export_failed")._value.get() == 0
        receiver.release.set()  # the receiver answers, with failures: both batches are lost
        eventually(lambda: metrics.spans_dropped.labels("export_failed")._value.get() == 16)
        assert metrics.spans_exported._value.get() == 0
    finally:
        receiver.release.set()
        processor.shutdown()


def test_shutdown_is_bounded_while_the_receiver_never_answers() -> None:
    from projector.telemetry.tracing import BoundedSpanProcessor

    receiver = _StuckReceiver()
    receiver.shutdown = lambda: None  # type: ignore[method-assign]  # not even shutdown frees it
    processor = BoundedSpanProcessor(
        receiver, hook=lambda *_: None, max_queue_size=4, shutdown_seconds=0.5
    )
    try:
        _end_spans(processor, 8)
        assert receiver.entered.wait(10)
        started = time.monotonic()
        processor.shutdown()  # the SDK alone would wait up to 30 s for the stuck export
        assert time.monotonic() - started < 1.5
    finally:
        receiver.release.set()


def test_a_failed_export_pauses_exporting_so_a_dead_receiver_costs_nothing_per_batch() -> None:
    from projector.telemetry.tracing import EXPORT_PAUSE, _CountingExporter

    class Receiver(SpanExporter):
        def __init__(self) -> None:
            self.calls = 0
            self.up = False

        def export(self, spans: Any) -> SpanExportResult:
            self.calls += 1
            return SpanExportResult.SUCCESS if self.up else SpanExportResult.FAILURE

    now = [0.0]
    metrics, receiver = Metrics(), Receiver()
    exporter = _CountingExporter(receiver, lambda _: None, metrics.on_spans, clock=lambda: now[0])
    batch: Any = [object()] * 3
    first, cap = EXPORT_PAUSE
    assert exporter.export(batch) is SpanExportResult.FAILURE and receiver.calls == 1
    assert exporter.export(batch) is SpanExportResult.FAILURE and receiver.calls == 1  # paused
    now[0] += first
    assert exporter.export(batch) is SpanExportResult.FAILURE and receiver.calls == 2
    now[0] += first  # the pause doubled
    assert exporter.export(batch) is SpanExportResult.FAILURE and receiver.calls == 2
    now[0] += cap
    receiver.up = True
    assert exporter.export(batch) is SpanExportResult.SUCCESS and receiver.calls == 3
    assert exporter.export(batch) is SpanExportResult.SUCCESS and receiver.calls == 4
    assert metrics.spans_dropped.labels("export_failed")._value.get() == 12
    assert metrics.spans_exported._value.get() == 6


def test_no_trace_is_started_while_exporting_is_paused_and_each_is_counted() -> None:
    from projector.telemetry.tracing import WhileExporting

    paused = [False]
    metrics = Metrics()
    sampler = WhileExporting(ALWAYS_ON, paused=lambda: paused[0], hook=metrics.on_spans)
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("reconcile") as root:
        paused[0] = True  # a failure paused exporting meanwhile: the trace started goes on
        with tracer.start_as_current_span("write") as child:
            assert root.is_recording() and child.is_recording()
    with tracer.start_as_current_span("reconcile") as untraced:
        assert not untraced.is_recording() and not untraced.get_span_context().trace_flags.sampled
        assert trace_id() == ""  # neither logs nor exemplars point at a trace that is not there
    paused[0] = False
    with tracer.start_as_current_span("reconcile") as again:
        assert again.is_recording()
    assert metrics.spans_dropped.labels("paused")._value.get() == 1


def _count(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(f"{name}_count") or 0.0


async def _after(api: FakeApi, metrics: Metrics, before: Controller) -> Controller:
    """A controller restarted on `api`'s objects, its copies marked as the API server marks
    them (the API double keeps no managedFields), with the key that signed them."""
    owner: dict[str, Any] = {"f:metadata": {"f:annotations": {f"f:{GRANT_UID_ANNOTATION}": {}}}}
    for (plural, ns, _), obj in api.objects.items():
        if plural == SECRETS.plural and ns in TARGETS:
            obj["metadata"]["managedFields"] = [{"manager": FIELD_MANAGER, "fieldsV1": owner}]
    after = await controller(api, metrics=metrics)
    after.hash_key = before.hash_key
    metrics.triggered(["g"])
    return after


async def test_revocation_latency_counts_each_revoked_copy_and_never_a_source_deletion(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    revoked = Metrics()
    api, before = await fan_out(provider, revoked)
    del api.objects[GRANTS.plural, "", "g"]  # the admin withdraws consent: onRevoke Delete
    after = await _after(api, revoked, before)
    assert await after.reconcile("g") is Result.OK
    assert not [k for k in api.objects if k[0] == SECRETS.plural and k[1] in TARGETS]
    assert _count(revoked, "projector_revocation_seconds") == len(TARGETS)

    gone = Metrics()  # the source deleted under onSourceDeleted Delete: not a revocation
    api, before = await fan_out(provider, gone)
    del api.objects[SECRETS.plural, "src", "s"]
    api.objects[GRANTS.plural, "", "g"]["spec"]["policy"] = {"onSourceDeleted": "Delete"}
    after = await _after(api, gone, before)
    assert await after.reconcile("g") is Result.OK
    assert not [k for k in api.objects if k[0] == SECRETS.plural and k[1] in TARGETS]
    assert _count(gone, "projector_revocation_seconds") == 0
