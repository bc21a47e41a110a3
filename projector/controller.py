"""The controller: informers feed the queue; workers snapshot, plan, write, and report.

One work item is one grant name. A worker takes a snapshot of the caches, asks the pure core
for a plan, lets the writer execute it, then writes the grant's status once (only if it
changed), records Events for what changed, and tells the queue whether to forget the key,
retry it with backoff, or look again later.

Safety: no reconcile runs, and so nothing is deleted, while any informer may be behind the
server (before its first list, while relisting, after a broken watch): such a key is retried
shortly. Sources absent from the cache are read once to tell "deleted" (404, authoritative)
from "not exported" and from "unknown" (an error, on which nothing is deleted).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import structlog
from opentelemetry import trace

from projector import reconcile, status
from projector.config import Config
from projector.errors import ApiError, NotFound
from projector.informer import Informer
from projector.kube import EVENTS, GRANTS, NAMESPACES, SECRETS, Kube, Obj
from projector.model import (
    EXPORT_LABEL,
    GRANT_LABEL,
    HASH_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    Copy,
    GrantRecord,
    Namespace,
    ObjectKey,
    Source,
    parse_copy,
    parse_grant_record,
    parse_namespace,
    parse_source,
)
from projector.queue import QueueShutDown, WorkQueue
from projector.reconcile import Action, Outcome, Plan, Reason, Snapshot, SourceState
from projector.telemetry import Metrics, trace_id
from projector.triggers import Triggers
from projector.writer import Writer

log = structlog.get_logger("projector")

EVENTS_NS = "default"
"""Events about a cluster-scoped object must live here (API server validation)."""


class Result(StrEnum):
    """What a reconcile tells the queue (controller-runtime's Result, as data)."""

    OK = "success"
    """Done: forget the key's failures."""
    RECHECK = "recheck"
    """Done, but look again later: a conflicting object is not cached, so no event will come."""
    ERROR = "error"
    """Retry with per-key exponential backoff."""
    UNHEALTHY = "requeue"
    """A cache may be behind the server: nothing was done; retry shortly."""

    @property
    def metric(self) -> str:
        """The `result` label of projector_reconcile_total."""
        return "success" if self is Result.RECHECK else self.value


def _key(obj: Obj) -> ObjectKey:
    meta = obj["metadata"]
    return ObjectKey(meta["namespace"], meta["name"])


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
    """Owns the informers, the indexes and the workers of one projector replica."""

    def __init__(
        self,
        kube: Kube,
        *,
        config: Config,
        metrics: Metrics,
        queue: WorkQueue[str],
        writer: Writer,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.metrics = metrics
        self.queue = queue
        self.writer = writer
        self.tracer = tracer or trace.get_tracer("projector")
        self.triggers = Triggers()
        metrics.bind_queue(queue)
        self._copies_by_label: defaultdict[str, set[ObjectKey]] = defaultdict(set)
        self._copies_by_uid: defaultdict[str, set[ObjectKey]] = defaultdict(set)
        self._pending_since: dict[str, float] = {}
        self._states: dict[str, Counter[str]] = {}
        self._ready: dict[str, bool] = {}
        hook = metrics.on_informer_event
        self.grants: Informer[str, GrantRecord] = Informer(
            kube,
            GRANTS,
            parse=parse_grant_record,
            key=_name,
            on_change=self._on_grant,
            on_event=hook,
        )
        self.sources: Informer[ObjectKey, Source] = Informer(
            kube,
            SECRETS,
            parse=parse_source,
            key=_key,
            label_selector=f"{EXPORT_LABEL}=true",
            on_change=self._on_source,
            on_event=hook,
        )
        self.namespaces: Informer[str, Namespace] = Informer(
            kube,
            NAMESPACES,
            parse=parse_namespace,
            key=_name,
            on_change=self._on_namespace,
            on_event=hook,
        )
        self.copies: Informer[ObjectKey, Copy] = Informer(
            kube,
            SECRETS,
            parse=parse_copy,
            key=_key,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
            on_change=self._on_copy,
            on_event=hook,
        )
        self.informers = (self.grants, self.sources, self.namespaces, self.copies)

    # --- event handlers: map a change to grant names, never act on the event itself ------------

    def _enqueue(self, names: Iterable[str], *, now: bool = False, observed: bool = True) -> None:
        t = time.monotonic()
        for name in names:
            if observed:
                self._pending_since.setdefault(name, t)
            if now:
                self.queue.add_now(name)
            else:
                self.queue.add(name)

    def _on_grant(self, old: GrantRecord | None, new: GrantRecord | None) -> None:
        names = self.triggers.grant_changed(old, new)
        # A status-only change (our own write) needs no reconcile.
        if old is not None and new is not None and old == new:
            return
        self._enqueue(names, now=True)

    def _on_source(self, old: Source | None, new: Source | None) -> None:
        self._enqueue(self.triggers.source_changed(old, new))

    def _on_namespace(self, old: Namespace | None, new: Namespace | None) -> None:
        self._enqueue(self.triggers.namespace_changed(old, new), now=True)

    def _on_copy(self, old: Copy | None, new: Copy | None) -> None:
        for c, index in ((old, False), (new, True)):
            if c is None:
                continue
            for table, k in (
                (self._copies_by_label, c.labels.get(GRANT_LABEL)),
                (self._copies_by_uid, c.grant_uid),
            ):
                if not k:
                    continue
                if index:
                    table[k].add(c.key)
                else:
                    table[k].discard(c.key)
                    if not table[k]:
                        del table[k]
        self._enqueue(self.triggers.copy_changed(old, new), now=True, observed=False)

    # --- lifecycle ------------------------------------------------------------------------------

    def synced(self) -> bool:
        """Every informer has listed at least once (readiness)."""
        return all(i.synced.is_set() for i in self.informers)

    def healthy(self) -> bool:
        """Every informer is known to follow the server right now (deletes are allowed)."""
        return all(i.healthy.is_set() for i in self.informers)

    async def run(self, leading: asyncio.Event) -> None:
        """Run informers always; run workers once synced and `leading` is set. Until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for inf in self.informers:
                tg.create_task(inf.run(), name=f"informer-{inf.name}")
            await asyncio.gather(*(i.synced.wait() for i in self.informers))
            log.info(
                "caches synced",
                grants=len(self.grants),
                sources=len(self.sources),
                namespaces=len(self.namespaces),
                copies=len(self.copies),
            )
            await leading.wait()
            for i in range(self.config.workers):
                tg.create_task(self._worker(), name=f"worker-{i}")

    async def _worker(self) -> None:
        while True:
            try:
                name = await self.queue.get()
            except QueueShutDown:
                return
            try:
                result = await self.reconcile(name)
            except Exception:
                log.exception("reconcile crashed", grant=name)
                result = Result.ERROR
            if result is Result.ERROR:
                self.queue.add_rate_limited(name)
            elif result is Result.RECHECK:
                self.queue.forget(name)
                self.queue.add_after(name, self.config.conflict_recheck)
            elif result is Result.UNHEALTHY:
                self.queue.add_after(name, 0.5)
            else:
                self.queue.forget(name)
            self.metrics.reconciles.labels(result.metric).inc()
            self.queue.done(name)
            await asyncio.sleep(0)  # a reconcile without I/O must not starve the informers

    # --- one reconcile --------------------------------------------------------------------------

    async def reconcile(self, name: str) -> Result:
        """Reconcile one grant name, and say what the queue should do with it next."""
        if not self.healthy():
            return Result.UNHEALTHY
        started = time.monotonic()
        since = self._pending_since.pop(name, None)
        if since is not None:
            self.metrics.queue_wait.observe(started - since)
        with (
            self.tracer.start_as_current_span("reconcile", attributes={"grant": name}),
            structlog.contextvars.bound_contextvars(grant=name, trace_id=trace_id()),
        ):
            rec = self.grants.get(name)
            if rec is not None and rec.grant is None:
                await self._write_status(rec, self._invalid_status(rec), [])
                return Result.OK
            plan = self.plan(name, await self._source_state(rec))
            outcomes = await self.writer.execute(plan)
            done = time.monotonic()
            self._observe(plan, outcomes, since, done)
            if rec is not None:
                new = status.compute(plan, outcomes)
                await self._write_status(rec, new, status.events(outcomes, rec.status))
            elif name in self._ready:  # the grant is gone: it no longer counts
                self.metrics.grants.labels(str(self._ready.pop(name)).lower()).dec()
            self.metrics.reconcile_duration.observe(time.monotonic() - started)
            written = Counter(o.step.action.value for o in outcomes if o.written)
            if written:
                log.info("reconciled", writes=dict(written), source=plan.source_state.value)
            if any(o.reason is Reason.WRITE_FAILED for o in outcomes) or (
                plan.grant is not None and plan.source_state is SourceState.UNKNOWN
            ):
                return Result.ERROR
            if any(o.reason is Reason.CONFLICT for o in outcomes):
                return Result.RECHECK
            return Result.OK

    def plan(self, name: str, source: tuple[Source | None, SourceState]) -> Plan:
        """Snapshot the caches and run the pure planner."""
        rec = self.grants.get(name)
        grant = rec.grant if rec else None
        keys = set(self._copies_by_label.get(name, ()))
        if grant is not None:
            keys |= self._copies_by_uid.get(grant.uid, set())
        copies = [c for c in (self.copies.get(k) for k in keys) if c is not None]
        rivals = self.triggers.rivals(grant) if grant is not None else ()
        rival_sources = {
            r.source: s for r in rivals if (s := self.sources.get(r.source)) is not None
        }
        snap = Snapshot(
            grant_name=name,
            grant=grant,
            source=source[0],
            source_state=source[1],
            namespaces=self.namespaces.items,
            copies=copies,
            live_grant_uids=self.triggers.live_uids(),
            rivals=rivals,
            rival_sources=rival_sources,
            copies_at=self.copies.items,
        )
        return reconcile.plan(snap)

    async def _source_state(self, rec: GrantRecord | None) -> tuple[Source | None, SourceState]:
        if rec is None or rec.grant is None:
            return None, SourceState.UNKNOWN
        key = rec.grant.source
        cached = self.sources.get(key)
        if cached is not None:
            return cached, SourceState.AVAILABLE
        try:
            obj = await self.kube.get(
                SECRETS, key.name, namespace=key.namespace, metadata_only=True
            )
        except NotFound:
            return None, SourceState.MISSING
        except ApiError as e:
            log.warning("source read failed", source=str(key), status=e.status)
            return None, SourceState.UNKNOWN
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if labels.get(EXPORT_LABEL) == "true":
            return None, SourceState.UNKNOWN  # exported but not cached yet: the watch is behind
        return None, SourceState.NOT_EXPORTED

    def _observe(
        self, plan: Plan, outcomes: list[Outcome], since: float | None, done: float
    ) -> None:
        tid = trace_id()
        exemplar = {"trace_id": tid} if tid else None
        for o in outcomes:
            if not o.written:
                continue
            step = o.step
            if step.action in (Action.CREATE, Action.UPDATE, Action.REPLACE) and since is not None:
                self.metrics.projection_latency.observe(done - since, exemplar=exemplar)
            if (
                step.action is Action.UPDATE
                and step.existing is not None
                and plan.desired is not None
                and step.existing.annotations.get(HASH_ANNOTATION) == plan.desired.hash
            ):
                self.metrics.drift_corrections.inc()
        states = Counter(o.reason.value for o in outcomes)
        old = self._states.pop(plan.grant_name, Counter())
        if plan.grant is not None:
            self._states[plan.grant_name] = states
        for state in set(old) | set(states):
            self.metrics.projections.labels(state).inc(states[state] - old[state])

    def _invalid_status(self, rec: GrantRecord) -> dict[str, Any]:
        cond = {
            "type": "Ready",
            "status": "False",
            "reason": "InvalidSpec",
            "message": rec.invalid or "",
            "observedGeneration": rec.generation,
        }
        return {
            "observedGeneration": rec.generation,
            "conditions": [cond],
            "targets": {"matched": 0, "projected": 0, "conflicted": 0, "denied": 0},
            "failures": [],
        }

    async def _write_status(
        self, rec: GrantRecord, new: dict[str, Any], events: list[status.Event]
    ) -> None:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in new["conditions"])
        if self._ready.get(rec.name) != ready:
            if rec.name in self._ready:
                self.metrics.grants.labels(str(self._ready[rec.name]).lower()).dec()
            self._ready[rec.name] = ready
            self.metrics.grants.labels(str(ready).lower()).inc()
        status.merge_transition_times(new, rec.status, _now())
        if not status.unchanged(new, rec.status):
            try:
                await self.kube.patch_status(GRANTS, rec.name, new)
                self.metrics.status_writes.inc()
            except NotFound:
                return  # deleted meanwhile: its copies are handled on the delete event
            except ApiError as e:
                log.warning("status write failed", status=e.status, reason=e.reason)
        for ev in events:
            await self._record_event(rec, ev)

    async def _record_event(self, rec: GrantRecord, ev: status.Event) -> None:
        now = _now()
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{rec.name}.{uuid.uuid4().hex[:16]}",
                "namespace": EVENTS_NS,
            },
            "involvedObject": {
                "apiVersion": GRANTS.version,
                "kind": GRANTS.kind,
                "name": rec.name,
                "uid": rec.uid,
            },
            "type": ev.type,
            "reason": ev.reason,
            "message": ev.message[:1024],
            "source": {"component": "projector"},
            "reportingComponent": "projector.nebari.dev/projector",
            "reportingInstance": self.config.id,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create(EVENTS, body, namespace=EVENTS_NS)
        except ApiError as e:  # Events are best effort: never fail a reconcile on them
            log.warning("event not recorded", status=e.status, reason=e.reason, error=e.message)
