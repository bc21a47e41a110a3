"""Metrics, logs, traces and the one HTTP port (/metrics, /healthz, /readyz).

Every metric is updated here, through `Metrics`' methods, and label values come from the enums
that name them (`Action`, `WriteResult`, `Reason`, `Result`), created at 0 up front. Metrics live
on a registry passed in (never the global one), so tests and benchmarks can run several
controllers in one process. Labels carry kinds and reason codes: never a Secret value.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from aiohttp import web
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

from projector import __version__
from projector.model import HASH_ANNOTATION
from projector.reconcile import Action, Outcome, Plan, Reason, WriteResult
from projector.status import Result

API_VERBS = ("LIST", "WATCH", "GET", "CREATE", "UPDATE", "PATCH", "DELETE")
"""The verbs `kube.Kube` reports (its request hook's first argument)."""

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Metrics:
    """Every projector_* metric, on one registry."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,  # a fake one for tests
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        r = self.registry
        self.projection_latency = Histogram(
            "projector_projection_latency_seconds",
            "From a source or grant change observed to the copy written (one sample per copy).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fanout_latency = Histogram(
            "projector_fanout_latency_seconds",
            "From a source or grant change observed to the last copy of its fan-out written "
            "(one sample per reconcile that wrote).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "projector_reconcile_duration_seconds",
            "Time to reconcile one grant (writes included).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.reconciles = Counter(
            "projector_reconcile_total", "Reconciles by result.", ["result"], registry=r
        )
        self.queue_depth = Gauge("projector_queue_depth", "Keys ready to be processed.", registry=r)
        self.queue_waiting = Gauge(
            "projector_queue_waiting", "Keys debouncing or backing off.", registry=r
        )
        self.queue_debouncing = Gauge(
            "projector_queue_debouncing",
            "Keys in a debounce window: changes seen and not yet acted on.",
            registry=r,
        )
        self.queue_processing = Gauge(
            "projector_queue_processing", "Keys being reconciled now.", registry=r
        )
        self.queue_backoff = Gauge(
            "projector_queue_backoff_keys",
            "Grants retrying with exponential backoff after a failed reconcile.",
            registry=r,
        )
        self.queue_events = Counter(
            "projector_queue_events_total",
            "Queue adds, coalesced adds and retries.",
            ["event"],
            registry=r,
        )
        self.queue_longest_running = Gauge(
            "projector_queue_longest_running_seconds",
            "Age of the longest reconcile under way (0 when none runs).",
            registry=r,
        )
        self.queue_wait = Histogram(
            "projector_queue_wait_seconds",
            "From first trigger to the start of processing.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.api_requests = Counter(
            "projector_api_requests_total",
            "API requests by verb, resource and status code.",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.api_request_duration = Histogram(
            "projector_api_request_duration_seconds",
            "Time of one API request, by verb (a watch: until its response headers).",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.writes = Counter(
            "projector_writes_total",
            "Writes of copies by action and result.",
            ["action", "result"],
            registry=r,
        )
        self.status_writes = Counter(
            "projector_status_writes_total", "Grant status writes.", registry=r
        )
        self.status_write_failures = Counter(
            "projector_status_write_failures_total",
            "Tries of a grant status write that failed, by status code (0: no response); each "
            "is retried, and a reconcile whose status could not be written fails and backs off.",
            ["code"],
            registry=r,
        )
        self.projections = Gauge(
            "projector_projections",
            "Namespaces per projection state (reason).",
            ["state"],
            registry=r,
        )
        self.grants = Gauge("projector_grants", "Grants by readiness.", ["ready"], registry=r)
        self.grant_condition = Gauge(
            "projector_grant_condition",
            "1 if the grant's status condition is True, 0 if False, by grant, condition type and "
            "reason: which grant is broken, and why (grants are few and admin-created).",
            ["grant", "condition", "reason"],
            registry=r,
        )
        self.leader = Gauge("projector_leader", "1 while this replica leads.", registry=r)
        self.leader_transitions = Counter(
            "projector_leader_transitions_total", "Times this replica became leader.", registry=r
        )
        self.lease_renew = Histogram(
            "projector_lease_renew_seconds",
            "Time of one successful Lease renewal (read and write).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.lease_renew_failures = Counter(
            "projector_lease_renew_failures_total",
            "Lease renewal attempts that failed (a leader failing until its deadline follows).",
            registry=r,
        )
        self.informer_events = Counter(
            "projector_informer_events_total",
            "Informer events by kind and type: watch events, BOOKMARK, OPEN (a watch accepted), "
            "RELIST, WATCH_RESTART (a watch ended normally and resumed), ERROR.",
            ["kind", "type"],
            registry=r,
        )
        self.informer_idle = Gauge(
            "projector_informer_seconds_since_activity",
            "Seconds since the informer last heard from the server (an event, a bookmark, a "
            "watch accepted, a list): a silently stalled watch makes it grow.",
            ["kind"],
            registry=r,
        )
        self.informer_stall_after = Gauge(
            "projector_informer_stall_threshold_seconds",
            "Silence after which an informer counts as stalled (--informer-stall-after); "
            "the alert ProjectorInformerStalled compares against it.",
            registry=r,
        )
        self.drift_corrections = Counter(
            "projector_drift_corrections_total",
            "Copies restored after someone changed them.",
            registry=r,
        )
        self.rollouts = Counter(
            "projector_rollouts_total",
            "Rollouts started on consumer workloads (--rollouts), by the grant of the copy "
            "whose content changed and the workload's namespace.",
            ["grant", "namespace"],
            registry=r,
        )
        self.spans_exported = Counter(
            "projector_spans_exported_total",
            "Spans the OTLP receiver accepted (0 unless OTEL_EXPORTER_OTLP_ENDPOINT is set).",
            registry=r,
        )
        self.spans_dropped = Counter(
            "projector_spans_dropped_total",
            "Spans given up on: queue_full (the export queue was full, the oldest went), "
            "export_failed (the receiver refused or never answered within the export timeout, "
            "or exporting was paused after such a failure), paused (a reconcile left untraced "
            "while exporting was paused; one per trace).",
            ["reason"],
            registry=r,
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        for verb in API_VERBS:
            self.api_request_duration.labels(verb)
        for result in Result:
            self.reconciles.labels(result.metric)
        for event in QUEUE_EVENTS:
            self.queue_events.labels(event)
        for action in Action:
            if action is not Action.NOOP:
                for outcome in WriteResult:
                    self.writes.labels(action.value, outcome.value)
        for reason in Reason:
            self.projections.labels(reason.value)
        for dropped in SPAN_DROPS:
            self.spans_dropped.labels(dropped)
        for ready in (True, False):
            self.grants.labels(_ready(ready))
        self._triggered: dict[str, float] = {}
        self._states: dict[str, Tally[str]] = {}
        self._ready: dict[str, bool] = {}
        self._conditions: dict[str, dict[str, str]] = {}
        """Per grant, the reason last exported for each condition type."""
        self._running: dict[str, float] = {}
        self._heard: dict[str, float] = {}
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._durations: dict[str, Any] = {}
        """Labelled children of the request metrics, looked up once (a request costs both)."""
        self.queue_longest_running.set_function(self._longest_running)

    def _longest_running(self) -> float:
        now = self._clock()
        return max((now - t for t in self._running.values()), default=0.0)

    def bind_informers(self, kinds: Iterable[str], stall_after: float) -> None:
        """Create the informers' label values at 0 and start their silence clocks now."""
        self.informer_stall_after.set(stall_after)
        now = self._clock()
        for kind in kinds:
            self._heard[kind] = now
            for type_ in INFORMER_EVENTS:
                self.informer_events.labels(kind, type_)
            self.informer_idle.labels(kind).set_function(functools.partial(self._silence, kind))

    def _silence(self, kind: str) -> float:
        return self._clock() - self._heard[kind]

    def triggered(self, names: Iterable[str], now: float | None = None) -> None:
        """A change was observed for these grants: their projection latency starts now."""
        t = time.monotonic() if now is None else now
        for name in names:
            self._triggered.setdefault(name, t)

    def started(self, name: str, now: float) -> float | None:
        """A reconcile of `name` starts: observe its queue wait; return when it was triggered."""
        since = self._triggered.pop(name, None)
        self._running[name] = now
        if since is not None:
            self.queue_wait.observe(now - since)
        return since

    def observe(
        self, plan: Plan, outcomes: Sequence[Outcome], since: float | None, done: float
    ) -> None:
        """After a plan ran: projection latency per copy written, drift corrected, states."""
        exemplar = _exemplar()
        projected = 0
        for o in outcomes:
            if not o.written:
                continue
            step = o.step
            if step.action in _PROJECTING and since is not None:
                projected += 1
                self.projection_latency.observe(done - since, exemplar=exemplar)
            if (
                step.action is Action.UPDATE
                and step.existing is not None
                and plan.desired is not None
                and step.existing.annotations.get(HASH_ANNOTATION) == plan.desired.hash
            ):
                self.drift_corrections.inc()  # our content hash, other content: someone edited
        if projected and since is not None:
            self.fanout_latency.observe(done - since, exemplar=exemplar)
        states = Tally(o.reason.value for o in outcomes)
        old = self._states.pop(plan.grant_name, Tally())
        if plan.grant is not None:
            self._states[plan.grant_name] = states
        for state in set(old) | set(states):
            self.projections.labels(state).inc(states[state] - old[state])

    def grant_ready(
        self,
        name: str,
        ready: bool | None,
        conditions: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Count grant `name` as ready or not, and export its conditions; None: it is gone."""
        was = self._ready.pop(name, None)
        if was is not None:
            self.grants.labels(_ready(was)).dec()
        if ready is not None:
            self._ready[name] = ready
            self.grants.labels(_ready(ready)).inc()
        old = self._conditions.pop(name, {})
        new = (
            {str(c["type"]): str(c.get("reason") or "") for c in conditions}
            if ready is not None
            else {}
        )
        for type_, reason in old.items():
            if new.get(type_) != reason:  # one series per grant and condition: drop the old reason
                self.grant_condition.remove(name, type_, reason)
        for c in conditions if ready is not None else ():
            type_ = str(c["type"])
            self.grant_condition.labels(name, type_, new[type_]).set(c.get("status") == "True")
        if new:
            self._conditions[name] = new

    def leading(self, leading: bool) -> None:
        """This replica became leader (counted as a transition) or stopped being one."""
        self.leader.set(1 if leading else 0)
        if leading:
            self.leader_transitions.inc()

    def lease_renewed(self, seconds: float) -> None:
        """A renewal of the Lease succeeded."""
        self.lease_renew.observe(seconds)

    def lease_renew_failed(self) -> None:
        """A renewal of the Lease failed (the leader keeps trying until its deadline)."""
        self.lease_renew_failures.inc()

    def reconciled(self, result: Result, name: str | None = None) -> None:
        """One reconcile (of grant `name`) ended with `result`."""
        self.reconciles.labels(result.metric).inc()
        if name is not None:
            self._running.pop(name, None)

    def reconcile_took(self, seconds: float) -> None:
        """The duration of one reconcile, with the trace id of its span as exemplar."""
        self.reconcile_duration.observe(seconds, exemplar=_exemplar())

    def write(self, action: Action, result: WriteResult) -> None:
        """One copy write ended with `result`."""
        self.writes.labels(action.value, result.value).inc()

    def status_write_failed(self, code: int) -> None:
        """One try of a status write failed with HTTP status `code` (0: no response)."""
        self.status_write_failures.labels(str(code)).inc()

    def bind_queue(self, queue: Any) -> None:
        """Read the queue's gauges at scrape time, so they are never stale."""
        self.queue_depth.set_function(lambda: len(queue))
        self.queue_waiting.set_function(queue.waiting)
        self.queue_debouncing.set_function(queue.debouncing)
        self.queue_processing.set_function(lambda: len(queue.processing))
        self.queue_backoff.set_function(queue.failing)

    def on_request(self, verb: str, resource: str, code: int, seconds: float) -> None:
        """Kube's request hook."""
        key = (verb, resource, code)
        if (counter := self._requests.get(key)) is None:  # .labels() costs more than .inc()
            counter = self._requests[key] = self.api_requests.labels(verb, resource, str(code))
        counter.inc()
        if (histogram := self._durations.get(verb)) is None:
            histogram = self._durations[verb] = self.api_request_duration.labels(verb)
        histogram.observe(seconds)

    def on_informer_event(self, kind: str, type_: str) -> None:
        """Informers' event hook; anything but an ERROR is a sign of life from the server."""
        self.informer_events.labels(kind, type_).inc()
        if type_ != "ERROR":
            self._heard[kind] = self._clock()

    def on_queue_event(self, event: str, _key: object) -> None:
        """The work queue's event hook."""
        self.queue_events.labels(event).inc()

    def on_spans(self, outcome: str, count: int) -> None:
        """The span processor's hook: `count` spans "exported", or dropped for a reason."""
        if outcome == "exported":
            self.spans_exported.inc(count)
        else:
            self.spans_dropped.labels(outcome).inc(count)


_PROJECTING = frozenset({Action.CREATE, Action.UPDATE, Action.REPLACE})

QUEUE_EVENTS = ("added", "coalesced", "dropped", "retried")
"""The work queue's event names (the `event` label of projector_queue_events_total)."""

SPAN_DROPS = ("queue_full", "export_failed", "paused")
"""Why spans were dropped (the `reason` label of projector_spans_dropped_total); `paused`
counts reconciles left untraced while exporting was paused, one per trace never made."""

INFORMER_EVENTS = (
    *("ADDED", "MODIFIED", "DELETED", "BOOKMARK"),
    *("OPEN", "RELIST", "WATCH_RESTART", "ERROR"),
)
"""The informers' event types (the `type` label of projector_informer_events_total)."""


def _exemplar() -> dict[str, str] | None:
    """The current trace id as an exemplar, so a slow sample links to its trace."""
    tid = trace_id()
    return {"trace_id": tid} if tid else None


def _ready(ready: bool) -> str:
    return "true" if ready else "false"


def log_processors(*, console: bool) -> list[Any]:
    """The structlog pipeline, JSON (on a pipe) or console rendering (on a terminal).

    Task-local context (grant, reconcile id, trace id) is merged into every line.
    """
    common: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if console:  # the console renderer formats exceptions itself
        return [*common, structlog.dev.ConsoleRenderer(colors=False)]
    return [*common, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]


def configure_logging(level: str = "info", stream: Any = None) -> None:
    """Logs via structlog: JSON on a pipe or file, console rendering on a terminal."""
    out = stream or sys.stdout
    isatty = getattr(out, "isatty", None)
    structlog.configure(
        processors=log_processors(console=bool(isatty and isatty())),
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


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


def configure_tracing(
    service: str = "projector", *, metrics: Metrics | None = None
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


def http_app(
    metrics: Metrics, *, alive: Callable[[], bool], ready: Callable[[], bool]
) -> web.Application:
    """The one HTTP port: liveness, readiness (every informer synced) and Prometheus metrics."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if alive() else web.Response(status=503, text="stalled\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n") if ready() else web.Response(status=503, text="syncing\n")

    async def metrics_handler(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(metrics.registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app
