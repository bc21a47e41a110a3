"""The one write path: copies, grant statuses and Events all pass `Writer._send`.

`_send` is the choke point a leader-election fence guards: nothing else writes.

The writer executes a plan's steps and never decides what to write: when a create meets a
Secret the cache did not hold, `reconcile.may_write` (the one ownership rule) says whether it may
be written. Copy writes are concurrent up to a bound shared by every reconcile, carry
optimistic-concurrency preconditions (PUT with the cached resourceVersion; DELETE with uid and
resourceVersion), and retry transient failures (5xx, lost connections, 429 after its
Retry-After) a few times before reporting the step as failed, which makes the controller requeue
the grant. A write holds a write slot and its bytes of the in-flight budget only while a request
is under way, never while it sleeps before a retry: a grant whose writes are throttled (429) or
failing cannot slow another grant's copies.

How long a retry waits is `retries`' rule.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import structlog
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, StatusCode

from projector.client.api import Api, Precondition
from projector.client.retries import (
    COPY_RETRIES,
    STATUS_RETRIES,
    Retries,
    retry_after,
    retry_delay,
    status_retryable,
    status_retrying,
)
from projector.core.desired import Bodies
from projector.core.kinds import BY_KIND, EVENTS, EXPORTS, GRANTS, Obj, Resource
from projector.core.model import Copy, parse_copy
from projector.core.ownership import may_write
from projector.core.plans import Action, Outcome, Plan, Reason, Step, conflict_message
from projector.errors import ApiError, Conflict, Forbidden, NotFound
from projector.telemetry.metrics import Metrics
from projector.telemetry.metrictable import WriteResult

R = TypeVar("R")

log = structlog.get_logger("projector.writer")


MAX_MESSAGE = 200
"""Of the API server's message, kept in status.failures (it names quotas and policies)."""

_RESULTS = {Reason.WRITE_FAILED: WriteResult.ERROR, Reason.CONFLICT: WriteResult.CONFLICT}


WRITE_BYTES = 16 * 1024 * 1024
"""Copy data in flight at once, whatever the write concurrency: 11 writes of a 1 MiB Secret
(1.4 MiB as JSON, and as much again in the TLS send buffer), not 32; small copies are not
slowed."""


class _Budget:
    """A weighted semaphore: bytes of request bodies in flight.

    Plain counters and one future per waiter, not an `asyncio.Condition`: every copy write
    holds it, and the condition's lock was taken twice per write even with nobody waiting.
    As with the condition, a body that fits goes at once, and each release wakes, in order,
    every waiter that fits then.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int) -> int:
        """Wait until `size` more bytes fit (a body over the limit waits to be alone).

        Returns the bytes taken, to give back with `release` once the request is done.
        """
        size = min(size, self._limit)
        if self._used + size <= self._limit:
            self._used += size
            return size
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((size, fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():  # granted, then cancelled: hand it back
                self._used -= size
            else:
                with contextlib.suppress(ValueError):  # a cancelled future may be dropped
                    self._waiters.remove((size, fut))
            self._wake()
            raise
        return size

    def release(self, size: int) -> None:
        """Give back what `acquire` took; wake the waiters that fit now."""
        self._used -= size
        self._wake()

    def _wake(self) -> None:
        """Grant their bytes to the waiters that fit now, in the order they came."""
        if not self._waiters:
            return
        left: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        for size, fut in self._waiters:
            if fut.done():
                continue
            if self._used + size <= self._limit:
                self._used += size
                fut.set_result(None)
            else:
                left.append((size, fut))
        self._waiters = left


class Writer:
    """Executes plans, writes statuses and records Events; the only code that writes."""

    def __init__(
        self,
        api: Api,
        *,
        metrics: Metrics,
        concurrency: int = 32,
        retries: Retries = COPY_RETRIES,
        status_retries: Retries = STATUS_RETRIES,
        fence: Callable[[], float] | None = None,
        tracer: trace.Tracer | None = None,
        write_bytes: int = WRITE_BYTES,
    ) -> None:
        self._api = api
        self._fence = fence
        self._tracer = tracer
        """Where the spans of writes go; None: no spans, as when nothing exports them (a span
        per write costs a tenth of the controller's CPU per write)."""
        self._metrics = metrics
        self._slots = asyncio.Semaphore(concurrency)
        self._bytes = _Budget(write_bytes)
        self._retries = retries
        self._status_retries = status_retries

    async def _send(self, write: Callable[[Api], Awaitable[R]]) -> R:
        """The choke point: every write passes here, and nowhere else.

        The fence (`leader.Elector.valid_for`) is asked first, so a replica whose lease has run
        out raises `Fenced` instead of writing; the transport asks it again once the request has
        passed the rate limit, right before it is sent.
        """
        if self._fence is not None:
            self._fence()
        return await write(self._api)

    def _span(self, name: str, attributes: Mapping[str, str]) -> AbstractContextManager[Span]:
        if self._tracer is None:
            return nullcontext(INVALID_SPAN)
        return self._tracer.start_as_current_span(name, attributes=attributes)

    # --- copies ---------------------------------------------------------------------------------

    async def execute(self, plan: Plan) -> list[Outcome]:
        """Run every write of the plan; NoOp steps pass through as outcomes unchanged."""
        outcomes: list[Outcome] = [
            Outcome(s, s.reason, s.message) for s in plan.steps if s.action is Action.NOOP
        ]
        writes = plan.writes
        if writes:
            # One Bodies per copy content, serialized once however many namespaces hold it: a
            # grant meets one key scope almost always, two when exports differ by namespace.
            bodies: dict[int, Bodies] = {}
            for d in (s.desired for s in writes if s.desired is not None):
                bodies.setdefault(id(d), Bodies(d))
            runs = [self._run(plan, s, bodies.get(id(s.desired))) for s in writes]
            outcomes.extend(await _together(runs))
        return outcomes

    async def _run(self, plan: Plan, step: Step, bodies: Bodies | None) -> Outcome:
        # One child span per copy write: names and codes only, never content.
        attributes = {
            "grant": plan.grant_name,
            "namespace": step.namespace,
            "action": step.action.value,
        }
        with self._span("write", attributes) as span:
            outcome = await self._run_step(plan, step, bodies)
            span.set_attribute("result", outcome.reason.value)
            if outcome.reason is Reason.WRITE_FAILED:  # the server's words, as in the status
                span.set_status(StatusCode.ERROR, outcome.message)
            return outcome

    async def _run_step(self, plan: Plan, step: Step, bodies: Bodies | None) -> Outcome:
        size = len(bodies.data) if bodies is not None and step.action is not Action.DELETE else 0
        try:
            outcome = await self._retrying(plan, step, bodies, size)
        except ApiError as e:  # the server's own words (quota, admission), never a value
            said = f": {e.message[:MAX_MESSAGE]}" if e.message else ""
            outcome = Outcome(
                step,
                Reason.WRITE_FAILED,
                f"{step.action.value}: {e.status} {e.reason}{said}",
                retry_after=retry_after(e),
            )
        result = WriteResult.OK if outcome.written else WriteResult.SKIPPED
        self._metrics.write(step.action, _RESULTS.get(outcome.reason, result))
        return outcome

    async def _retrying(self, plan: Plan, step: Step, bodies: Bodies | None, size: int) -> Outcome:
        """`_write`, retried while it fails transiently, up to `attempts` tries in all.

        Written out, not a tenacity policy: it runs once per copy write, and tenacity's
        per-call `inspect` work measured about 15% of the controller's CPU per write (1 -> 1,000
        fan-out, cProfile on process time: ~2.0 ms of CPU per write with tenacity and per-write
        spans, ~1.3 ms without; commit 94176f6, docs/benchmarks.md). Each try takes a write
        slot and its bytes for the request alone; the sleep before a retry (a 429's
        Retry-After, or backoff) holds neither, so other grants' writes go on meanwhile.
        """
        for attempt in range(1, self._retries.attempts):
            try:
                return await self._attempt(plan, step, bodies, size)
            except ApiError as e:
                if not e.transient:
                    raise
                await asyncio.sleep(retry_delay(e, attempt, *self._retries.backoff))
        return await self._attempt(plan, step, bodies, size)

    async def _attempt(self, plan: Plan, step: Step, bodies: Bodies | None, size: int) -> Outcome:
        """One try of a step, holding a write slot and `size` bytes of the budget."""
        async with self._slots:
            taken = await self._bytes.acquire(size)
            try:
                return await self._write(plan, step, bodies)
            finally:
                self._bytes.release(taken)

    async def _write(self, plan: Plan, step: Step, bodies: Bodies | None) -> Outcome:
        ns, name = step.namespace, step.name
        if step.action is Action.DELETE:
            return await self._delete(step)
        assert bodies is not None, "a create/update plan always has desired content"
        if step.action is Action.REPLACE:
            deleted = await self._delete(step)
            if deleted.reason is Reason.WRITE_FAILED:
                return deleted
            return await self._create(plan, step, bodies)
        if step.action is Action.UPDATE and step.existing is not None:
            body = bodies.body(ns, step.existing.resource_version, keep=step.existing)
            try:
                await self._send(
                    lambda api: api.replace(
                        bodies.resource, body, namespace=ns, name=name, metadata_only=True
                    )
                )
            except NotFound:
                return await self._create(plan, step, bodies)
            return Outcome(step, Reason.PROJECTED, written=True)
        return await self._create(plan, step, bodies)

    async def _create(self, plan: Plan, step: Step, bodies: Bodies) -> Outcome:
        ns, name = step.namespace, step.name
        body = bodies.body(ns)
        try:
            await self._send(
                lambda api: api.create(bodies.resource, body, namespace=ns, metadata_only=True)
            )
            return Outcome(step, Reason.PROJECTED, written=True)
        except Conflict as e:
            if not e.already_exists:
                raise
        except NotFound:
            return Outcome(step, Reason.NAMESPACE_MISSING, "namespace not found")
        except Forbidden as e:
            if e.namespace_terminating:
                return Outcome(step, Reason.TERMINATING)
            raise
        # The name is taken by an object the cache does not hold: someone else's, or our own
        # write whose watch event is late (a big copy on a busy server). Its metadata first:
        # the ownership rule decides, and a foreign object's data is never read. Ours is read
        # whole, so that a copy that already holds what we want is not rewritten.
        head = await self._api.get(bodies.resource, name, namespace=ns, metadata_only=True)
        place = plan.snapshot.namespaces.get(ns)
        if place is None or not may_write(plan.snapshot, _stored(head, ns, name, bodies), place):
            return Outcome(step, Reason.CONFLICT, conflict_message(bodies.kind))
        stored = _stored(await self._api.get(bodies.resource, name, namespace=ns), ns, name, bodies)
        if not may_write(plan.snapshot, stored, place):  # changed hands between the two reads
            return Outcome(step, Reason.CONFLICT, conflict_message(bodies.kind))
        if bodies.desired.in_sync(stored):
            return Outcome(step, Reason.PROJECTED)
        update = bodies.body(ns, stored.resource_version, keep=stored)
        await self._send(
            lambda api: api.replace(
                bodies.resource, update, namespace=ns, name=name, metadata_only=True
            )
        )
        return Outcome(step, Reason.PROJECTED, written=True)

    async def _delete(self, step: Step) -> Outcome:
        copy = step.existing
        assert copy is not None, "a delete always names the copy it deletes"
        try:
            await self._send(
                lambda api: api.delete(
                    BY_KIND[copy.key.kind],
                    copy.key.name,
                    namespace=copy.key.namespace,
                    only_if=Precondition(copy.uid, copy.resource_version),
                )
            )
        except NotFound:
            pass  # already gone: the goal is reached
        except Conflict:
            # The copy changed since we decided: decide again on fresh state.
            return Outcome(step, Reason.WRITE_FAILED, "copy changed since planned; will retry")
        return Outcome(step, step.reason, written=True)

    # --- grant status and Events ----------------------------------------------------------------

    async def write_status(self, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch a grant's status, retried (`status_retrying`); tell whether it landed.

        A grant deleted meanwhile needs none (True). A status that could not be written returns
        False, so the caller fails the reconcile and the queue retries it with backoff: a
        stale status is never left behind a reconcile reported as a success. Every failed try
        is counted (projector_status_write_failures_total).
        """
        attributes = {"grant": name, "action": "status"}
        body = dict(status)
        with self._span("write_status", attributes) as span:
            try:
                async for attempt in status_retrying(self._status_retries):
                    with attempt:
                        try:
                            await self._send(lambda api: api.patch_status(GRANTS, name, body))
                        except ApiError as e:
                            if not isinstance(e, NotFound):
                                self._metrics.status_write_failed(e.status)
                            raise
            except NotFound:
                span.set_attribute("result", "not_found")
                return True  # deleted meanwhile: its copies are handled on the delete event
            except ApiError as e:
                span.set_attribute("result", "error")
                span.set_status(StatusCode.ERROR, f"{e.status} {e.reason}")
                log.warning(
                    "status write failed; the grant is retried with backoff",
                    status=e.status,
                    reason=e.reason,
                    attempts=self._status_retries.attempts if status_retryable(e) else 1,
                )
                return False
            span.set_attribute("result", "ok")
            self._metrics.status_writes.inc()
            return True

    async def write_export_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch a ProjectionExport's status, once (best effort; tell whether it landed).

        Not retried here: the next reconcile of a grant of its source writes it again, and a
        producer's status must never hold a grant's reconcile back. Gone meanwhile: True.
        """
        body = dict(status)
        try:
            await self._send(lambda api: api.patch_status(EXPORTS, name, body, namespace=namespace))
        except NotFound:
            return True
        except ApiError as e:
            self._metrics.status_write_failed(e.status)
            log.warning("export status write failed", export=f"{namespace}/{name}", status=e.status)
            return False
        self._metrics.status_writes.inc()
        return True

    async def apply(self, res: Resource, body: Obj, *, namespace: str, field_manager: str) -> Obj:
        """Server-side apply one object as `field_manager`; the caller retries on failure."""
        return await self._send(
            lambda api: api.apply(res, body, namespace=namespace, field_manager=field_manager)
        )

    async def create(self, res: Resource, body: Obj, *, namespace: str) -> Obj:
        """Create one object of projector's own (its hash key); the caller handles a 409."""
        return await self._send(
            lambda api: api.create(res, body, namespace=namespace, metadata_only=True)
        )

    async def create_event(self, event: Obj, namespace: str) -> bool:
        """Create an Event; best effort, so a refused Event never fails a reconcile.

        Tells whether it was created.
        """
        try:
            await self._send(lambda api: api.create(EVENTS, event, namespace=namespace))
        except ApiError as e:
            log.warning("event not recorded", status=e.status, reason=e.reason, error=e.message)
            return False
        return True

    async def patch_event(self, name: str, namespace: str, patch: Obj) -> bool:
        """Merge-patch an Event recorded before (its count); best effort as well.

        False only if it is gone (the server expired it): the caller records it anew.
        """
        try:
            await self._send(lambda api: api.patch(EVENTS, name, patch, namespace=namespace))
        except NotFound:
            return False
        except ApiError as e:
            log.warning("event not counted", status=e.status, reason=e.reason, error=e.message)
        return True


def _stored(obj: Obj, namespace: str, name: str, bodies: Bodies) -> Copy:
    """An object read back at a copy's place, as a cached copy (its data reduced to a hash)."""
    meta = {**(obj.get("metadata") or {}), "namespace": namespace, "name": name}
    return parse_copy({**obj, "metadata": meta}, bodies.kind)


async def _together(writes: list[Coroutine[Any, Any, Outcome]]) -> list[Outcome]:
    """Run `writes` at once; the first to fail unexpectedly (a fence, a bug) cancels the rest.

    The error is raised, unless this task was cancelled meanwhile: a cancellation always wins.

    Not an `asyncio.TaskGroup`: it raises its children's errors over its own cancellation, so a
    term's worker, cancelled just as its fence closed, got `Fenced`, took it for a refused
    write and went on as a zombie of the old term (after an outage, the next change then waited
    out the backoff that the refusals grew: about 42 s). A lone write is awaited in this task:
    its cancellation is this task's, and its error is raised as it is.
    """
    if len(writes) == 1:  # one copy: no task to start and wait for (two loop turns fewer)
        return [await writes[0]]
    tasks = [asyncio.create_task(w) for w in writes]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
        if not all(t.done() for t in tasks):  # asyncio.wait on done tasks still turns the loop
            await asyncio.wait(tasks)
        errors = [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None]
    if errors:
        raise errors[0]
    return [t.result() for t in tasks]
