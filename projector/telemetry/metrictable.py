"""The table of every projector_* metric: its name, type, labels, meaning, values at 0.

`metrics.Metrics` builds its registry from `METRICS`, and `observability/metricsdoc.py` renders
docs/metrics.md from it, so the page cannot drift from the code. Label values come from the
enums that name them (`Action`, `WriteResult`, `Reason`, `Result`), created at 0 up front.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase

from projector.core.plans import Action, Reason, Result
from projector.telemetry.tracing import SPAN_DROPS


class WriteResult(StrEnum):
    """How one write ended (the `result` label of projector_writes_total)."""

    OK = "ok"
    ERROR = "error"
    CONFLICT = "conflict"
    SKIPPED = "skipped"
    """Not written and nothing to retry: the server said the namespace is gone or terminating."""


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
    scraped: bool = False
    """A gauge whose series live in a plain dict until a scrape (`ScrapedGauge`)."""

    @property
    def family(self) -> str:
        """The metric family's name, as the registry collects it (a counter's without _total)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name

    def build(self, registry: CollectorRegistry) -> MetricWrapperBase | ScrapedGauge:
        """The metric on `registry`, with its `values` created at 0."""
        if self.scraped:
            return ScrapedGauge(self, registry)
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


class ScrapedGauge:
    """A gauge whose series are a dict from label values to value, sampled at scrape time.

    For series kept per grant: a labelled `Gauge` child holds a lock, a value object and its
    label dict, a key here a tuple and a float (RSS 1.25 KB less per grant, three series each:
    memory-before-after-2-grant-condition in docs/benchmarks.md's history).
    """

    def __init__(self, metric: Metric, registry: CollectorRegistry) -> None:
        self._metric = metric
        self.series: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def _family(self) -> GaugeMetricFamily:
        m = self._metric
        return GaugeMetricFamily(m.name, m.help, labels=m.labels)

    def describe(self) -> list[GaugeMetricFamily]:
        """The family without samples: registering does not collect."""
        return [self._family()]

    def collect(self) -> list[GaugeMetricFamily]:
        """The family with one sample per series, as a scrape sees them now."""
        family = self._family()
        for labels, value in list(self.series.items()):
            family.add_metric(labels, value)
        return [family]


def ready_label(ready: bool) -> str:
    """The `ready` label value of projector_grants."""
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
        "revocation_latency",
        "projector_revocation_seconds",
        "histogram",
        "From a withdrawal of consent observed (grant deleted or retargeted, export or label "
        "withdrawn, namespace relabelled) to a copy it revoked deleted, under onRevoke: Delete "
        "(one sample per copy).",
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
        _each(map(ready_label, (True, False))),
    ),
    Metric(
        "grant_condition",
        "projector_grant_condition",
        "gauge",
        "1 if the grant's status condition is True, 0 if False, by grant, condition type and "
        "reason: which grant is broken, and why (grants are few and admin-created).",
        ("grant", "condition", "reason"),
        scraped=True,
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
        "content changed (the cached grant that owns it, never the copy's label; empty if none) "
        "and the workload's namespace.",
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
