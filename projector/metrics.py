"""Metrics: every projector_* metric, declared in one table, and every update to them.

`METRICS` is the table: the registry is built from it, and `docs/metrics.md` is rendered from
it (`observability/metricsdoc.py`), so the page cannot drift from the code. Every metric is
updated here, through `Metrics`' methods, and label values come from the enums that name them
(`Action`, `WriteResult`, `Reason`, `Result`), created at 0 up front. Metrics live on a registry
passed in (never the global one), so tests and benchmarks can run several controllers in one
process. Labels carry kinds and reason codes: never a Secret value.
"""

from __future__ import annotations

import functools
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics import MetricWrapperBase

from projector.model import HASH_ANNOTATION
from projector.reconcile import Action, Outcome, Plan, Reason, WriteResult
from projector.status import Result
from projector.tracing import SPAN_DROPS, trace_id

API_VERBS = ("LIST", "WATCH", "GET", "CREATE", "UPDATE", "PATCH", "DELETE")
"""The verbs `kube.Kube` reports (its request hook's first argument)."""

QUEUE_EVENTS = ("added", "coalesced", "dropped", "retried")
"""The work queue's event names (the `event` label of projector_queue_events_total)."""

INFORMER_EVENTS = (
    *("ADDED", "MODIFIED", "DELETED", "BOOKMARK"),
    *("OPEN", "RELIST", "WATCH_RESTART", "ERROR"),
)
"""The informers' event types (the `type` label of projector_informer_events_total)."""

_LATENCY_BUCKETS = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0),
)

Type = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Metric:
    """One row of the table: a metric's attribute on `Metrics`, name, type, labels and meaning.

    `values` are the label values created at 0 up front (the informers' kinds are added when
    they are bound); a counter's `name` is the exposed one, with its `_total`.
    """

    attr: str
    name: str
    type: Type
    help: str
    labels: tuple[str, ...] = ()
    values: tuple[tuple[str, ...], ...] = ()

    @property
    def family(self) -> str:
        """The metric family's name, as the registry collects it (a counter's without _total)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name

    def build(self, registry: CollectorRegistry) -> MetricWrapperBase:
        """The metric on `registry`, with its `values` created at 0."""
        if self.type == "histogram":
            made: MetricWrapperBase = Histogram(
                self.name, self.help, self.labels, buckets=_LATENCY_BUCKETS, registry=registry
            )
        else:
            kind = Counter if self.type == "counter" else Gauge
            made = kind(self.name, self.help, self.labels, registry=registry)
        for value in self.values:
            made.labels(*value)
        return made


def _ready(ready: bool) -> str:
    return "true" if ready else "false"


def _each(*values: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    return tuple((v,) for vs in values for v in vs)


METRICS = (
    Metric(
        "projection_latency",
        "projector_projection_latency_seconds",
        "histogram",
        "From a source or grant change observed to the copy written (one sample per copy).",
    ),
    Metric(
        "fanout_latency",
        "projector_fanout_latency_seconds",
        "histogram",
        "From a source or grant change observed to the last copy of its fan-out written "
        "(one sample per reconcile that wrote).",
    ),
    Metric(
        "reconcile_duration",
        "projector_reconcile_duration_seconds",
        "histogram",
        "Time to reconcile one grant (writes included).",
    ),
    Metric(
        "reconciles",
        "projector_reconcile_total",
        "counter",
        "Reconciles by result.",
        ("result",),
        _each(r.metric for r in Result),
    ),
    Metric("queue_depth", "projector_queue_depth", "gauge", "Keys ready to be processed."),
    Metric("queue_waiting", "projector_queue_waiting", "gauge", "Keys debouncing or backing off."),
    Metric(
        "queue_debouncing",
        "projector_queue_debouncing",
        "gauge",
        "Keys in a debounce window: changes seen and not yet acted on.",
    ),
    Metric("queue_processing", "projector_queue_processing", "gauge", "Keys being reconciled now."),
    Metric(
        "queue_backoff",
        "projector_queue_backoff_keys",
        "gauge",
        "Grants retrying with exponential backoff after a failed reconcile.",
    ),
    Metric(
        "queue_events",
        "projector_queue_events_total",
        "counter",
        "Queue adds, coalesced adds and retries.",
        ("event",),
        _each(QUEUE_EVENTS),
    ),
    Metric(
        "queue_longest_running",
        "projector_queue_longest_running_seconds",
        "gauge",
        "Age of the longest reconcile under way (0 when none runs).",
    ),
    Metric(
        "queue_wait",
        "projector_queue_wait_seconds",
        "histogram",
        "From first trigger to the start of processing.",
    ),
    Metric(
        "api_requests",
        "projector_api_requests_total",
        "counter",
        "API requests by verb, resource and status code.",
        ("verb", "resource", "code"),
    ),
    Metric(
        "api_request_duration",
        "projector_api_request_duration_seconds",
        "histogram",
        "Time of one API request, by verb (a watch: until its response headers).",
        ("verb",),
        _each(API_VERBS),
    ),
    Metric(
        "writes",
        "projector_writes_total",
        "counter",
        "Writes of copies by action and result.",
        ("action", "result"),
        tuple((a.value, w.value) for a in Action if a is not Action.NOOP for w in WriteResult),
    ),
    Metric("status_writes", "projector_status_writes_total", "counter", "Grant status writes."),
    Metric(
        "status_write_failures",
        "projector_status_write_failures_total",
        "counter",
        "Tries of a grant status write that failed, by status code (0: no response); each "
        "is retried, and a reconcile whose status could not be written fails and backs off.",
        ("code",),
    ),
    Metric(
        "projections",
        "projector_projections",
        "gauge",
        "Namespaces per projection state (reason).",
        ("state",),
        _each(r.value for r in Reason),
    ),
    Metric(
        "grants",
        "projector_grants",
        "gauge",
        "Grants by readiness.",
        ("ready",),
        _each(map(_ready, (True, False))),
    ),
    Metric(
        "grant_condition",
        "projector_grant_condition",
        "gauge",
        "1 if the grant's status condition is True, 0 if False, by grant, condition type and "
        "reason: which grant is broken, and why (grants are few and admin-created).",
        ("grant", "condition", "reason"),
    ),
    Metric(
        "grant_retries",
        "projector_grant_retries",
        "gauge",
        "Failed reconciles in a row of a grant the work queue retries with backoff, by grant "
        "(the series goes when the grant succeeds; Ready's lastTransitionTime says since when).",
        ("grant",),
    ),
    Metric(
        "grant_retry_delay",
        "projector_grant_retry_delay_seconds",
        "gauge",
        "The wait the work queue chose before a failing grant's next try, by grant (its "
        "backoff, never shorter than the server's Retry-After).",
        ("grant",),
    ),
    Metric("leader", "projector_leader", "gauge", "1 while this replica leads."),
    Metric(
        "leader_transitions",
        "projector_leader_transitions_total",
        "counter",
        "Times this replica became leader.",
    ),
    Metric(
        "lease_renew",
        "projector_lease_renew_seconds",
        "histogram",
        "Time of one successful Lease renewal (read and write).",
    ),
    Metric(
        "lease_renew_failures",
        "projector_lease_renew_failures_total",
        "counter",
        "Lease renewal attempts that failed (a leader failing until its deadline follows).",
    ),
    Metric(
        "informer_events",
        "projector_informer_events_total",
        "counter",
        "Informer events by kind and type: watch events, BOOKMARK, OPEN (a watch accepted), "
        "RELIST, WATCH_RESTART (a watch ended normally and resumed), ERROR.",
        ("kind", "type"),
    ),
    Metric(
        "informer_idle",
        "projector_informer_seconds_since_activity",
        "gauge",
        "Seconds since the informer last heard from the server (an event, a bookmark, a "
        "watch accepted, a list): a silently stalled watch makes it grow.",
        ("kind",),
    ),
    Metric(
        "informer_stall_after",
        "projector_informer_stall_threshold_seconds",
        "gauge",
        "Silence after which an informer counts as stalled (--informer-stall-after); "
        "the alert ProjectorInformerStalled compares against it.",
    ),
    Metric(
        "drift_corrections",
        "projector_drift_corrections_total",
        "counter",
        "Copies restored after someone changed them.",
    ),
    Metric(
        "rollouts",
        "projector_rollouts_total",
        "counter",
        "Rollouts started on consumer workloads (--rollouts), by the grant of the copy whose "
        "content changed and the workload's namespace.",
        ("grant", "namespace"),
    ),
    Metric(
        "spans_exported",
        "projector_spans_exported_total",
        "counter",
        "Spans the OTLP receiver accepted (0 unless OTEL_EXPORTER_OTLP_ENDPOINT is set).",
    ),
    Metric(
        "spans_dropped",
        "projector_spans_dropped_total",
        "counter",
        "Spans given up on: queue_full (the export queue was full, the oldest went), "
        "export_failed (the receiver refused or never answered within the export timeout, "
        "or exporting was paused after such a failure), paused (a reconcile left untraced "
        "while exporting was paused; one per trace).",
        ("reason",),
        _each(SPAN_DROPS),
    ),
)
"""Every projector_* metric: `Metrics` builds its registry from this table, and
`observability/metricsdoc.py` renders docs/metrics.md from it."""


class Metrics:
    """Every projector_* metric of `METRICS`, on one registry."""

    projection_latency: Histogram
    fanout_latency: Histogram
    reconcile_duration: Histogram
    reconciles: Counter
    queue_depth: Gauge
    queue_waiting: Gauge
    queue_debouncing: Gauge
    queue_processing: Gauge
    queue_backoff: Gauge
    queue_events: Counter
    queue_longest_running: Gauge
    queue_wait: Histogram
    api_requests: Counter
    api_request_duration: Histogram
    writes: Counter
    status_writes: Counter
    status_write_failures: Counter
    projections: Gauge
    grants: Gauge
    grant_condition: Gauge
    grant_retries: Gauge
    grant_retry_delay: Gauge
    leader: Gauge
    leader_transitions: Counter
    lease_renew: Histogram
    lease_renew_failures: Counter
    informer_events: Counter
    informer_idle: Gauge
    informer_stall_after: Gauge
    drift_corrections: Counter
    rollouts: Counter
    spans_exported: Counter
    spans_dropped: Counter

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,  # a fake one for tests
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        for metric in METRICS:
            setattr(self, metric.attr, metric.build(self.registry))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._triggered: dict[str, float] = {}
        self._states: dict[str, Tally[str]] = {}
        self._ready: dict[str, bool] = {}
        self._conditions: dict[str, dict[str, str]] = {}
        """Per grant, the reason last exported for each condition type."""
        self._running: dict[str, float] = {}
        self._retrying: set[str] = set()
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

    def retrying(self, name: str, attempts: int, delay: float) -> None:
        """Grant `name` failed `attempts` times in a row; the queue tries again in `delay` s."""
        self._retrying.add(name)
        self.grant_retries.labels(name).set(attempts)
        self.grant_retry_delay.labels(name).set(delay)

    def recovered(self, name: str) -> None:
        """Grant `name` is no longer retried with backoff (it succeeded, or it is gone)."""
        if name in self._retrying:
            self._retrying.discard(name)
            self.grant_retries.remove(name)
            self.grant_retry_delay.remove(name)

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


def _exemplar() -> dict[str, str] | None:
    """The current trace id as an exemplar, so a slow sample links to its trace."""
    tid = trace_id()
    return {"trace_id": tid} if tid else None
