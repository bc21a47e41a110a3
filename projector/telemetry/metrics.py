"""Metrics: every update to the projector_* metrics of `metrictable.METRICS`.

Every metric is updated here, through `Metrics`' methods. Metrics live on a registry passed in
(never the global one), so tests and benchmarks can run several controllers in one process.
Labels carry kinds and reason codes: never a Secret value.
"""

from __future__ import annotations

import functools
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from projector.core.model import HASH_ANNOTATION
from projector.core.plans import Action, Outcome, Plan, Reason, Result, Step
from projector.telemetry.metrictable import (
    INFORMER_EVENTS,
    METRICS,
    ScrapedGauge,
    WriteResult,
    ready_label,
)
from projector.telemetry.tracing import trace_id


class Metrics:
    """Every projector_* metric of `METRICS`, on one registry."""

    projection_latency: Histogram
    fanout_latency: Histogram
    revocation_latency: Histogram
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
    grant_condition: ScrapedGauge
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
        self._conditions: dict[str, tuple[tuple[str, str, str], ...]] = {}
        """Per grant, the projector_grant_condition series it exports."""
        self._running: dict[str, float] = {}
        self._retrying: set[str] = set()
        self._heard: dict[str, float] = {}
        self._requests: dict[tuple[str, str, int], Any] = {}
        self._durations: dict[str, Any] = {}
        """Labelled children of the request metrics, looked up once (a request costs both)."""
        self._children: dict[tuple[object, ...], Any] = {}
        """Labelled children of the per-write and per-event counters, looked up once each:
        `.labels()` builds a tuple, checks it and takes a lock, and costs more than `.inc()`.
        Only for metrics whose series are never removed."""
        self.queue_longest_running.set_function(self._longest_running)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached (for series never removed)."""
        key = (id(metric), *labels)
        if (child := self._children.get(key)) is None:
            child = self._children[key] = metric.labels(*labels)
        return child

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
        """After a plan ran: latency per copy written or revoked, drift corrected, states."""
        exemplar = _exemplar()
        projected = 0
        for o in outcomes:
            if not o.written:
                continue
            step = o.step
            if step.action in _PROJECTING and since is not None:
                projected += 1
                self.projection_latency.observe(done - since, exemplar=exemplar)
            elif step.action is Action.DELETE and since is not None and _revokes(step):
                self.revocation_latency.observe(done - since, exemplar=exemplar)
            if (
                step.action is Action.UPDATE
                and step.existing is not None
                and step.desired is not None
                and step.desired.stamped(step.existing.annotations.get(HASH_ANNOTATION))
            ):
                self.drift_corrections.inc()  # our content hash, other content: someone edited
        if projected and since is not None:
            self.fanout_latency.observe(done - since, exemplar=exemplar)
        states = Tally(o.reason.value for o in outcomes)
        old = self._states.pop(plan.grant_name, Tally())
        if plan.grant is not None:
            self._states[plan.grant_name] = states
        for state in set(old) | set(states):
            self._child(self.projections, state).inc(states[state] - old[state])

    def grant_ready(
        self,
        name: str,
        ready: bool | None,
        conditions: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Count grant `name` as ready or not, and export its conditions; None: it is gone."""
        was = self._ready.pop(name, None)
        if was is not None:
            self.grants.labels(ready_label(was)).dec()
        if ready is not None:
            self._ready[name] = ready
            self.grants.labels(ready_label(ready)).inc()
        series = self.grant_condition.series
        for key in self._conditions.pop(name, ()):  # one series per condition: the old reason goes
            series.pop(key, None)
        if ready is None:
            return
        keys = []
        for c in conditions:
            key = (name, str(c["type"]), str(c.get("reason") or ""))
            series[key] = float(c.get("status") == "True")
            keys.append(key)
        if keys:
            self._conditions[name] = tuple(keys)

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
        self._child(self.reconciles, result.metric).inc()
        if name is not None:
            self._running.pop(name, None)

    def reconcile_took(self, seconds: float) -> None:
        """The duration of one reconcile, with the trace id of its span as exemplar."""
        self.reconcile_duration.observe(seconds, exemplar=_exemplar())

    def write(self, action: Action, result: WriteResult) -> None:
        """One copy write ended with `result`."""
        self._child(self.writes, action.value, result.value).inc()

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
        self._child(self.informer_events, kind, type_).inc()
        if type_ != "ERROR":
            self._heard[kind] = self._clock()

    def on_queue_event(self, event: str, _key: object) -> None:
        """The work queue's event hook."""
        self._child(self.queue_events, event).inc()

    def on_spans(self, outcome: str, count: int) -> None:
        """The span processor's hook: `count` spans "exported", or dropped for a reason."""
        if outcome == "exported":
            self.spans_exported.inc(count)
        else:
            self.spans_dropped.labels(outcome).inc(count)


_PROJECTING = frozenset({Action.CREATE, Action.UPDATE, Action.REPLACE})


def _revokes(step: Step) -> bool:
    """A delete revokes unless its source was deleted (onSourceDeleted's, not onRevoke's)."""
    return step.reason is not Reason.SOURCE_MISSING


def _exemplar() -> dict[str, str] | None:
    """The current trace id as an exemplar, so a slow sample links to its trace."""
    tid = trace_id()
    return {"trace_id": tid} if tid else None
