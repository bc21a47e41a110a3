"""Traces: the OpenTelemetry tracer, its bounded span export, and the current trace id.

Spans leave the process over OTLP only when an endpoint is set; otherwise only their trace ids
are used (in logs and exemplars). The export queue is bounded, a failing receiver pauses
exporting, and every span given up on is counted through a hook (`Metrics.on_spans`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from projector import __version__

SPAN_DROPS = ("queue_full", "export_failed", "paused")
"""Why spans were dropped (the `reason` label of projector_spans_dropped_total); `paused`
counts reconciles left untraced while exporting was paused, one per trace never made."""


def spans_exported() -> bool:
    """An OTLP endpoint is set: spans leave the process (else only their trace ids are used)."""
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


SPAN_QUEUE = 2048
"""Ended spans held for export at most (OTEL_BSP_MAX_QUEUE_SIZE overrides it). With the receiver
down or black-holed the queue fills, and each further span pushes out the oldest, counted as
`queue_full`: memory stays bounded whatever the receiver does."""

SPAN_BATCH = 512
"""Spans sent in one export request at most (OTEL_BSP_MAX_EXPORT_BATCH_SIZE overrides it); a
batch leaves when it is full or OTEL_BSP_SCHEDULE_DELAY (5 s) after the previous one."""

SPAN_SHUTDOWN_SECONDS = 2.0
"""The longest the process waits at exit for the last spans to leave. A live receiver takes
milliseconds; a dead or black-holed one would hold the exit for the export timeout
(OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default) and the SDK's own 30 s shutdown wait."""

SpanHook = Callable[[str, int], None]
"""Told ("exported" or a `SPAN_DROPS` reason, how many) for every batch; `Metrics.on_spans`."""


EXPORT_PAUSE = (1.0, 30.0)
"""After a failed export, the next batches are dropped without a try for 1 s, doubling with
each further failure up to 30 s: a receiver that is down costs no encoding, connection or
retry per batch, and the first batch after the pause tries again."""


class _CountingExporter(SpanExporter):
    """Wraps the OTLP exporter: every batch handed to it is counted as exported or failed.

    A failure pauses exporting (`EXPORT_PAUSE`); a batch that arrives meanwhile is dropped as
    failed without being encoded or sent.
    """

    def __init__(
        self,
        inner: SpanExporter,
        handed: Callable[[int], None],
        hook: SpanHook,
        *,
        clock: Callable[[], float] = time.monotonic,  # a fake one for tests
    ) -> None:
        self._inner = inner
        self._handed = handed
        self._hook = hook
        self._clock = clock
        self._failures = 0
        self._paused_until = 0.0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._handed(len(spans))
        if self.paused():
            self._hook("export_failed", len(spans))
            return SpanExportResult.FAILURE
        try:
            result = self._inner.export(spans)
        except Exception:
            self._account(SpanExportResult.FAILURE, len(spans))
            raise
        self._account(result, len(spans))
        return result

    def paused(self) -> bool:
        """A failure paused exporting, and the pause has not run out."""
        return self._clock() < self._paused_until

    def _account(self, result: SpanExportResult, count: int) -> None:
        if result is SpanExportResult.SUCCESS:
            self._failures = 0
            self._hook("exported", count)
            return
        first, cap = EXPORT_PAUSE
        self._paused_until = self._clock() + min(cap, first * 2 ** min(self._failures, 16))
        self._failures += 1
        self._hook("export_failed", count)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class BoundedSpanProcessor(BatchSpanProcessor):
    """The SDK's batch processor with its queue bounds made visible and its shutdown bounded.

    Spans wait in a queue of at most `max_queue_size` and leave in batches from a thread of the
    SDK, so the event loop never waits on the receiver. A span ended while the queue is full
    pushes out the oldest one; both are told to `hook` (the count follows the SDK's own drop
    rule, give or take the spans of the one batch being handed over at that instant).
    `shutdown()` returns within `shutdown_seconds`, flushed or not.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        hook: SpanHook,
        max_queue_size: int | None = None,
        max_export_batch_size: int | None = None,
        schedule_delay_millis: float | None = None,
        shutdown_seconds: float = SPAN_SHUTDOWN_SECONDS,
    ) -> None:
        if max_queue_size is None:
            max_queue_size = int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") or SPAN_QUEUE)
        if max_export_batch_size is None:
            batch = int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") or SPAN_BATCH)
            max_export_batch_size = min(batch, max_queue_size)
        self._capacity = max_queue_size
        self._pending = 0
        self._lock = threading.Lock()
        self._hook = hook
        self._shutdown_seconds = shutdown_seconds
        self._exporter = _CountingExporter(exporter, self._handed, hook)
        super().__init__(
            self._exporter,
            max_queue_size=max_queue_size,
            max_export_batch_size=max_export_batch_size,
            schedule_delay_millis=schedule_delay_millis,
        )

    def paused(self) -> bool:
        """Exporting is paused after a failure (`EXPORT_PAUSE`): spans made now would be lost."""
        return self._exporter.paused()

    def _handed(self, count: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - count)

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a sampled span for export, counting the one it pushes out if the queue is full."""
        if span.context is not None and span.context.trace_flags.sampled:
            with self._lock:
                full = self._pending >= self._capacity
                if not full:
                    self._pending += 1
            if full:
                self._hook("queue_full", 1)
        super().on_end(span)

    def shutdown(self) -> None:
        """Flush what the receiver takes within `shutdown_seconds`; give up on the rest."""
        closing = threading.Thread(target=super().shutdown, name="span-shutdown", daemon=True)
        closing.start()
        closing.join(self._shutdown_seconds)


class SpanCounter(Protocol):
    """What counts spans exported and dropped (`metrics.Metrics`)."""

    def on_spans(self, outcome: str, count: int) -> None:
        """`count` spans "exported", or dropped for a `SPAN_DROPS` reason."""


def configure_tracing(
    service: str = "projector", *, metrics: SpanCounter | None = None
) -> trace.Tracer:
    """An OpenTelemetry tracer; spans are exported over OTLP only when an endpoint is set.

    The resource names the service and its version. Sampling follows OTEL_TRACES_SAMPLER and
    OTEL_TRACES_SAMPLER_ARG (default: every reconcile); the OTLP exporter reads the other
    OTEL_EXPORTER_OTLP_* variables (HTTP/protobuf). Dropped and exported spans are counted on
    `metrics`; the SDK's own warning per dropped span is silenced, since the counter says it,
    and its other warnings become log lines of ours (event "tracing sdk"). While a failed
    export pauses exporting, no new trace is started (`WhileExporting`).
    """
    resource = Resource.create({"service.name": service, "service.version": __version__})
    if not spans_exported():
        return TracerProvider(resource=resource).get_tracer("projector")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    hook = metrics.on_spans if metrics is not None else _ignore
    logging.getLogger("opentelemetry.sdk._shared_internal").addFilter(_not_queue_full)
    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(h, _SdkLogs) for h in sdk.handlers):
        sdk.addHandler(_SdkLogs(logging.WARNING))
        sdk.propagate = False
    processor = BoundedSpanProcessor(OTLPSpanExporter(), hook=hook)
    configured = TracerProvider(shutdown_on_exit=False).sampler  # from OTEL_TRACES_SAMPLER*
    sampler = WhileExporting(configured, paused=processor.paused, hook=hook)
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(processor)
    return provider.get_tracer("projector")


class WhileExporting(Sampler):
    """The configured sampler, except that no new trace is started while exporting is paused.

    With the receiver down, the spans of a reconcile would only be made, queued and dropped:
    an untraced reconcile costs the controller nothing. Each one is told to `hook` as
    ("paused", 1). Such a reconcile has no trace id in its logs or exemplars, as no trace of it
    exists; spans under a trace already started follow their parent as usual.
    """

    def __init__(self, inner: Sampler, *, paused: Callable[[], bool], hook: SpanHook) -> None:
        self._inner = inner
        self._paused = paused
        self._hook = hook

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        """DROP a new trace while paused; otherwise whatever the configured sampler says."""
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid and self._paused():
            self._hook("paused", 1)
            return SamplingResult(Decision.DROP)
        return self._inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        """The configured sampler's description, wrapped."""
        return f"WhileExporting{{{self._inner.get_description()}}}"


class _SdkLogs(logging.Handler):
    """The SDK's own warnings (an export retried or given up) as projector's log lines.

    Without it they would be bare text on stderr, amid the JSON lines.
    """

    def emit(self, record: logging.LogRecord) -> None:
        log = structlog.get_logger()
        say = log.error if record.levelno >= logging.ERROR else log.warning
        say("tracing sdk", logger=record.name, message=record.getMessage())


def _ignore(_outcome: str, _count: int) -> None:
    pass


def _not_queue_full(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Queue full")


def trace_id() -> str:
    """The current span's trace id in hex, or '' outside a sampled span.

    An unsampled trace is never exported, so neither a log line nor an exemplar points at it.
    """
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid and ctx.trace_flags.sampled else ""
