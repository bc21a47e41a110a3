"""The controller: workers take grant names from the queue and run the reconcile shell.

One work item is one grant name. A reconcile takes a snapshot from the store, asks the pure
core for a plan, lets the writer execute it, then writes the grant's status once (only if it
changed), records Events for what changed, and tells the queue whether to forget the key,
retry it with backoff, or look again later. Wiring (caches, informers, HTTP) is `app`'s job.

A status that could not be written fails the reconcile (retried with backoff), so the grant
never keeps a stale status behind a reconcile counted as a success. Every `resync_period`
(jittered), every grant is reconciled again from the caches: a missed event or a lost status
write is repaired without one, and a grant in sync writes nothing.

Safety: no reconcile runs, and so nothing is deleted, while any cache may be behind the
server (before its first list, while relisting, after a broken watch): such a key is retried
shortly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import structlog
from opentelemetry import trace

from projector.cache import probe
from projector.cache.caches import Kind
from projector.cache.store import Store
from projector.config import Config
from projector.control import hashkey
from projector.control.conflicts import ConflictWatches
from projector.control.exportstatus import ExportStatuses
from projector.control.notices import Notices
from projector.control.queue import WorkQueue
from projector.control.recorder import Recorder, timestamp
from projector.control.writer import Writer
from projector.core import plans, reconcile, status
from projector.core.desired import Desired, Echo
from projector.core.model import Copy, GrantRecord, HashKey
from projector.core.plans import Result, Verdict
from projector.errors import Fenced
from projector.telemetry.metrics import Metrics
from projector.telemetry.tracing import trace_id

log = structlog.get_logger("projector")

UNHEALTHY_RETRY_MAX = 5.0
"""Cap of the backoff of a key that found a cache behind the server: the cache, not the grant,
is what failed, so its grants must not wait minutes once it recovers."""


_DEBOUNCED = frozenset({Kind.SOURCE, Kind.COPY})
"""Changes that may come in bursts; grants and namespaces are rare and run at once."""

RESYNC_JITTER = 0.1
"""Each resync period is drawn from +-10% of --resync-period (controller-runtime's jitter)."""


class Wing(Protocol):
    """A part that works beside the workers on the same leadership term (the rollout wing).

    The wiring builds it and hands it over; the controller only runs, resyncs and stops it with
    its own term, so control never imports what sits above it.
    """

    async def run(self) -> None:
        """Work until `stop()`."""

    def resync(self) -> None:
        """Take up everything again: a new term began."""

    def stop(self) -> None:
        """Take no new work; `run` returns once the work under way is done."""


class Controller:
    """The work queue's consumers: one reconcile of one grant name at a time per worker."""

    def __init__(
        self,
        store: Store,
        *,
        config: Config,
        metrics: Metrics,
        queue: WorkQueue[str],
        writer: Writer,
        recorder: Recorder,
        tracer: trace.Tracer | None = None,
        wings: Sequence[Wing] = (),
        hash_key: HashKey | None = None,
        notices: Notices | None = None,
    ) -> None:
        self.store = store
        self.hash_key = hash_key
        """Signs the copies' content-hash annotation; None until `run` has read (or created)
        it: no grant is planned without it."""
        self.export_statuses = ExportStatuses(store, writer)
        self.notices = notices
        """Told of every reconcile's outcomes: a producer learns where consent was lost."""
        self.wings = tuple(wings)
        """Run beside the workers, on the same leadership term (none: --rollouts is off)."""
        self.config = config
        self.metrics = metrics
        self.queue = queue
        self.writer = writer
        self.recorder = recorder
        self.tracer = tracer or trace.get_tracer("projector")
        self._stopping = False
        self._stopped = asyncio.Event()
        self._ids = itertools.count(1)
        self._wanted: dict[str, Echo] = {}
        """Per grant, the copy its last plan wanted: events of copies holding it are echoes."""
        store.listen(self._enqueue, echo=self._is_echo)
        self.conflicts = ConflictWatches(
            store.api,
            lambda names: self._enqueue(Kind.COPY, names),  # a freed place, as a copy deleted
            recheck=config.conflict_recheck,
            timeout_seconds=config.watch_timeout,
            read_deadline=config.informer_stall_after / 2,
        )
        """Watches the places of Conflicts with uncached objects, on the same term."""

    def _is_echo(self, name: str, copy: Copy) -> bool:
        """The copy holds what grant `name` last planned: the echo of its own write."""
        wanted = self._wanted.get(name)
        return wanted is not None and wanted.in_sync(copy)

    def _want(self, name: str, desired: Desired | None) -> None:
        if desired is None:
            self._wanted.pop(name, None)
        else:
            self._wanted[name] = desired.echo()

    def _enqueue(self, kind: Kind, names: Iterable[str]) -> None:
        """Queue the grants a change affects.

        Source and copy changes are debounced (bursts collapse), the rest run at once; a copy
        event starts no latency clock (it is often our own write). Copy events must share the
        source's window: while a source keeps changing, the late echoes of one reconcile's
        writes differ from what the next one wants, and run at once they chained reconciles
        back to back, defeating the debounce (59 writes per copy in a 40 s burst).
        """
        if kind is not Kind.COPY:
            self.metrics.triggered(names)
        add = self.queue.add if kind in _DEBOUNCED else self.queue.add_now
        for name in names:
            add(name)

    def resync(self) -> None:
        """Queue every cached grant now, its backoff started over.

        A new term's caches are warm and its queue is not; and after an outage the failures
        that grew a grant's backoff were the server's, not the grant's.
        """
        names = self.store.grant_names()
        for name in names:
            self.queue.forget(name)
        self._enqueue(Kind.GRANT, names)
        for wing in self.wings:
            wing.resync()

    def stop(self) -> None:
        """Take no new work; reconciles under way finish (`run` returns once they have)."""
        self._stopping = True
        self._stopped.set()
        self.queue.shut_down()
        for wing in self.wings:
            wing.stop()
        self.conflicts.stop()

    async def run(self) -> None:
        """Run `config.workers` workers (and the periodic resync) until `stop()` or cancellation.

        The first term reads the hash key (creating it if absent) before any worker starts.
        """
        if self.hash_key is None and not await self._read_hash_key():
            return
        async with asyncio.TaskGroup() as tg:
            for i in range(self.config.workers):
                tg.create_task(self._worker(), name=f"worker-{i}")
            if self.config.resync_period > 0:
                tg.create_task(self._resync_periodically(), name="resync")
            for wing in self.wings:
                tg.create_task(wing.run(), name=type(wing).__name__.lower())
            tg.create_task(self.conflicts.run(), name="conflict-watches")

    async def _read_hash_key(self) -> bool:
        """Read or create the hash key, retried until it is had; False if stopped first."""
        api, namespace = self.store.api, self.config.namespace
        reading = asyncio.create_task(hashkey.ensure(api, self.writer, namespace))
        stopped = asyncio.create_task(self._stopped.wait())
        try:
            await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (reading, stopped):
                t.cancel()
        if not reading.done() or reading.cancelled():
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            return False
        self.hash_key = reading.result()
        return True

    def resync_idle(self) -> int:
        """Queue every cached grant that has nothing pending; return how many were queued.

        A grant already queued, waiting (debounce, backoff, recheck) or being reconciled runs
        anyway; queueing it now would cut short a failing grant's backoff.
        """
        return sum(self.queue.add_idle(name) for name in self.store.grant_names())

    async def _resync_periodically(self) -> None:
        """Every `resync_period`, jittered, reconcile every grant again from the caches."""
        period = self.config.resync_period
        while not self._stopping:
            delay = period * random.uniform(1 - RESYNC_JITTER, 1 + RESYNC_JITTER)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), delay)
            if self._stopping:
                return
            queued = self.resync_idle()
            log.info("resync", grants=len(self.store.grants), queued=queued)

    async def _worker(self) -> None:
        async for name in self.queue:
            if self._stopping:
                self.queue.done(name)
                return
            try:
                verdict = await self._reconcile(name)
            except Fenced:  # the lease ran out: app stops these workers; the replica campaigns
                log.warning("write refused: this replica no longer holds the lease", grant=name)
                verdict = Verdict(Result.ERROR)
            except Exception:
                log.exception("reconcile crashed", grant=name)
                verdict = Verdict(Result.ERROR)
            self._requeue(name, verdict)
            self.metrics.reconciled(verdict.result, name)
            log.debug("reconcile ended", grant=name, result=verdict.result.value)
            self.queue.done(name)
            await asyncio.sleep(0)  # a reconcile without I/O must not starve the informers

    def _requeue(self, name: str, verdict: Verdict) -> None:
        """Hand the verdict to the queue, which owns retry timing; export what it decided."""
        result = verdict.result
        if result is Result.ERROR:
            delay = self.queue.add_rate_limited(name, floor=verdict.retry_after)
            self.metrics.retrying(name, self.queue.num_requeues(name), delay)
            return
        if result is Result.UNHEALTHY:
            self.queue.add_rate_limited(name, cap=UNHEALTHY_RETRY_MAX)
            return
        self.queue.forget(name)
        self.metrics.recovered(name)
        if result is Result.RECHECK:
            self.queue.add_after(name, self.conflicts.recheck_after(name))

    async def reconcile(self, name: str) -> Result:
        """Reconcile one grant name, and say what the queue should do with it next."""
        return (await self._reconcile(name)).result

    async def _reconcile(self, name: str) -> Verdict:
        key = self.hash_key
        if key is None or not self.store.healthy():  # no plan without the key (`run` reads it)
            return Verdict(Result.UNHEALTHY)
        started = time.monotonic()
        since = self.metrics.started(name, started)
        rid = f"{next(self._ids)}"
        with (
            self.tracer.start_as_current_span(
                "reconcile", attributes={"grant": name, "reconcile_id": rid}
            ) as span,
            structlog.contextvars.bound_contextvars(
                grant=name, reconcile_id=rid, trace_id=trace_id()
            ),
        ):
            snap = await probe.snapshot(self.store, name)
            rec = snap.record
            if rec is not None and rec.grant is None:
                self.conflicts.forget(name)
                invalid = status.invalid(rec)
                if not await self._report(rec, invalid, status.events((), rec.status, invalid)):
                    return Verdict(Result.ERROR)
                return Verdict(Result.OK)
            plan = self.conflicts.foresee(reconcile.plan(snap, key))  # no create refused twice
            self._want(name, plan.desired)
            outcomes = await self.writer.execute(plan)
            self.conflicts.record(name, plan, outcomes)
            if self.notices is not None:
                self.notices.consent_lost(plan, outcomes)
            await self.export_statuses.after(plan, outcomes)
            self.metrics.observe(plan, outcomes, since, time.monotonic())
            verdict = plans.verdict(plan, outcomes)
            if rec is not None:
                new = status.compute(plan, outcomes)
                if not await self._report(rec, new, status.events(outcomes, rec.status, new)):
                    verdict = Verdict(Result.ERROR, verdict.retry_after)  # stale status
            else:
                self.metrics.grant_ready(name, None)  # the grant is gone: it no longer counts
            self.metrics.reconcile_took(time.monotonic() - started)
            written = Counter(o.step.action.value for o in outcomes if o.written)
            if written:
                log.info("reconciled", writes=dict(written), source=plan.source_state.value)
            span.set_attribute("result", verdict.result.metric)
            if verdict.result is Result.ERROR:
                span.set_status(trace.StatusCode.ERROR, "a write failed; retried with backoff")
            return verdict

    async def _report(
        self, rec: GrantRecord, new: dict[str, Any], events: list[status.Event]
    ) -> bool:
        """Write the status if it changed, and record the Events; False if it was not written.

        The Events are recorded either way: they tell what this reconcile did (its writes),
        which no retry would tell again.
        """
        self.metrics.grant_ready(rec.name, status.is_ready(new), new["conditions"])
        new = status.stamped(new, rec.status, timestamp())
        written = status.unchanged(new, rec.status) or await self.writer.write_status(rec.name, new)
        await self.recorder.record(rec, events)
        return written
