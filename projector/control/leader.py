"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics, and the fence.

Every replica runs its informers; only the holder of the Lease `projector-leader` runs workers.

- Acquire: GET the Lease; create it if absent; take it over if its holder is empty (released)
  or has not renewed within `lease_duration` **as measured on the local monotonic clock from the
  last change of the Lease this replica observed** (never from the Lease's timestamps, which come
  from another machine's clock). Every write is an optimistic PUT with the resourceVersion just
  read, so two candidates cannot both win; `leaseTransitions` counts changes of holder.
- Renew: every `retry_period`; each attempt is a GET then a PUT, each bounded by a timeout
  shorter than the retry period (and the lease session's own connect and read timeouts are
  shorter still, so no attempt can wait on a dead connection past its turn).
- Fence: writes are allowed only before `valid_until` = (monotonic time at which the last
  successful renew was *sent*) + `renew_deadline`. Another replica can take over no earlier than
  `lease_duration` after it saw that renew, which is later than the time it was sent; since
  renew_deadline < lease_duration, a replica stops writing before anyone else may start. The
  writer and the transport ask `valid_for()` before every write they send (the transport also
  bounds the wait for a connection by it), so a replica that was frozen (SIGSTOP, a
  long GC pause, a partition) writes nothing when it wakes.
- Losing the lease (no renewal within the renew deadline, or another holder seen) is not an
  error and never ends the process: the fence is already closed, `following` is set so that
  `app` stops the workers (the caches stay warm), and the replica campaigns again. An API
  server outage therefore costs a leadership term, never a restart: back, the replica (or a
  standby) wins the Lease and reconciles every grant from its warm caches.
- Retries are tenacity's, their waits `retries.retry_delay`'s: the campaign retries for ever,
  every `retry_period` plus up to `JITTER` of it (candidates do not move in lockstep), or a
  429's Retry-After, on the error tree (`ApiError`, a
  timeout) and on "held by someone else"; a renewal retries on the error tree until the renew
  deadline. Every failed attempt is logged and counted. While the server is unreachable, a sign
  of life from it (`nudge`, called when an informer's watch or list succeeds again) ends the
  campaign's wait at once, so leadership resumes as soon as the server does.
- Release (SIGTERM): clear the holder, so a standby need not wait for the lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_never,
    wait_fixed,
)

from projector.client.api import Api
from projector.client.retries import retry_delay
from projector.config import Timings
from projector.core.kinds import LEASES, Obj
from projector.errors import ApiError, Conflict, Fenced, NotFound, ProjectorError
from projector.telemetry.metrics import Metrics

LEASE_NAME = "projector-leader"
JITTER = 0.2
"""Candidates retry after retry_period * (1 + up to JITTER), so they do not move in lockstep."""

log = structlog.get_logger("projector.leader")


class Held(ProjectorError):
    """The Lease is held by another replica whose term has not run out (as seen locally)."""


_RETRIED = (ApiError, TimeoutError, Held)
"""What a lease attempt may fail with and be tried again: the error tree, a request that ran
past its bound, the Lease held by someone else. Anything else is a bug and is not retried."""


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _unreachable(error: BaseException | None) -> bool:
    """The server did not answer at all (refused, reset, timed out): not a refusal by it."""
    return isinstance(error, TimeoutError) or (isinstance(error, ApiError) and error.status == 0)


class Elector:
    """Campaigns for, renews and releases the Lease for one replica, and fences its writes."""

    def __init__(
        self,
        api: Api,
        *,
        namespace: str,
        identity: str,
        metrics: Metrics,
        timings: Timings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self.identity = identity
        self._metrics = metrics
        self.timings = timings or Timings()
        self._clock = clock
        self._observed: Obj | None = None
        """The Lease's spec as last read or written."""
        self._observed_at = 0.0
        """Local monotonic time at which `_observed` last changed."""
        self._resource_version = ""
        self._valid_until = 0.0
        self.leading = asyncio.Event()
        """Set while this replica holds the Lease; cleared the moment it loses it."""
        self.following = asyncio.Event()
        """Set while this replica does not hold the Lease (the complement of `leading`)."""
        self.following.set()
        self.terms = 0
        """Leadership terms won so far."""
        self._nudged = asyncio.Event()
        self._outage = False
        """A campaign attempt found the server unreachable, and none since found the Lease held
        by another replica: the refusals and 5xx of a server warming up still count as it."""

    def valid_for(self) -> float:
        """The fence: seconds this replica's lease stays valid; `Fenced` if it holds none now."""
        left = self._valid_until - self._clock()
        if not self.leading.is_set() or left <= 0:
            raise Fenced(f"{self.identity} does not hold a valid lease; write refused")
        return left

    def nudge(self) -> None:
        """The API server answered again: a campaign waiting out an outage tries at once."""
        if not self.leading.is_set() and self._outage:
            self._nudged.set()

    async def run(self) -> None:
        """Campaign, lead until the Lease is lost, campaign again: until cancelled."""
        while True:
            await self._campaign()
            self._won()
            await self._hold()
            self._lost()

    async def _campaign(self) -> None:
        """Retry acquiring until it succeeds (tenacity: jittered fixed wait, never stops)."""
        async for attempt in AsyncRetrying(
            stop=stop_never,
            wait=self._campaign_wait,
            retry=retry_if_exception_type(_RETRIED),
            before_sleep=self._failed("campaign"),
            sleep=self._nudgeable_sleep,
            reraise=True,
        ):
            with attempt:
                await self._acquire_or_renew()

    def _campaign_wait(self, state: RetryCallState) -> float:
        """`retry_period` plus up to `JITTER` of it, or a 429's Retry-After (the one rule)."""
        period = self.timings.retry_period
        error = state.outcome.exception() if state.outcome is not None else None
        return retry_delay(error, 1, period, period * (1 + JITTER), jitter=period * JITTER)

    async def _hold(self) -> None:
        """Renew every retry period; return once a renewal cannot land before the deadline."""
        retry_period = self.timings.retry_period
        while True:
            await asyncio.sleep(retry_period)
            started = self._clock()
            try:
                async for attempt in AsyncRetrying(
                    stop=self._past_deadline,
                    wait=wait_fixed(retry_period / 2),
                    retry=retry_if_exception_type((ApiError, TimeoutError)),
                    before_sleep=self._failed("renew"),
                    reraise=True,
                ):
                    with attempt:
                        await self._acquire_or_renew()
            except Held as e:  # someone else holds it now: our term is over, whatever the clock
                log.warning("lease taken by another replica", identity=self.identity, error=str(e))
                return
            except (ApiError, TimeoutError) as e:
                self._metrics.lease_renew_failed()
                log.warning(
                    "lease not renewed within the renew deadline; stopping work, keeping caches",
                    identity=self.identity,
                    error=_describe(e),
                )
                return
            self._metrics.lease_renewed(self._clock() - started)

    def _past_deadline(self, state: RetryCallState) -> bool:
        """The stop condition of renewals: the next try could not land before the fence closes."""
        wait = self.timings.retry_period / 2
        return self._clock() + wait >= self._valid_until

    def _failed(self, what: str) -> Callable[[RetryCallState], None]:
        """The before-sleep hook of retries: log (and for renewals count) each failed attempt."""

        def hook(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            if _unreachable(error):
                self._outage = True
            elif isinstance(error, Held):
                self._outage = False
            if what == "renew":
                self._metrics.lease_renew_failed()
            if isinstance(error, Held):
                log.debug("lease held by another replica", attempt=state.attempt_number)
                return
            log.info(
                f"lease {what} attempt failed; retrying",
                attempt=state.attempt_number,
                error=_describe(error),
                retry_in=round(state.upcoming_sleep, 2),
            )

        return hook

    async def _nudgeable_sleep(self, seconds: float) -> None:
        """Sleep between campaign attempts; `nudge()` cuts it short."""
        self._nudged.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._nudged.wait()

    def _won(self) -> None:
        self._outage = False
        self.terms += 1
        self.following.clear()
        self.leading.set()
        self._metrics.leading(True)
        log.info(
            "leading",
            identity=self.identity,
            term=self.terms,
            valid_for=self.timings.renew_deadline,
        )

    def _step_down(self) -> None:
        """The fence closes now; `app` stops the workers."""
        self._valid_until = 0.0
        self.leading.clear()
        self.following.set()
        self._metrics.leading(False)

    def _lost(self) -> None:
        """The term is over (the fence already closed, by the clock)."""
        self._step_down()
        log.warning("lost the lease; campaigning again", identity=self.identity, term=self.terms)

    async def release(self) -> None:
        """Give the Lease up, if the record names this replica, so a standby takes over at once.

        It runs once the workers have stopped, so it does not ask the fence: on a loaded machine
        the last renewal may land late or be cancelled by the shutdown, and the Lease is still
        this replica's. The record says whose it is, and the PUT is optimistic: if another
        replica took it meanwhile, it refuses. A conflict (a cancelled renewal may still have
        landed, moving the resourceVersion) is read again once.
        """
        self._step_down()
        try:
            async with asyncio.timeout(self.timings.renew_deadline):
                released = await self._give_up()
        except (ApiError, TimeoutError) as e:
            log.warning("lease not released; a standby waits for it to expire", error=_describe(e))
            return
        if released:
            log.info("lease released", identity=self.identity)

    async def _give_up(self) -> bool:
        """Clear the holder if it is this replica: True if it did, False if it is not the holder."""
        try:
            return await self._clear_holder()
        except Conflict:
            await self._read()
            return await self._clear_holder()

    async def _clear_holder(self) -> bool:
        if (self._observed or {}).get("holderIdentity") != self.identity:
            return False
        spec = {**(self._observed or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
        self._observe(await self._put(spec))
        return True

    async def _bounded(self, call: Any) -> Any:
        """Every Lease request ends before the next retry is due."""
        async with asyncio.timeout(self.timings.retry_period * 0.75):
            return await call

    async def _attempt(self) -> bool:
        """One try to acquire or renew that never raises (for tests and tools)."""
        try:
            await self._acquire_or_renew()
        except _RETRIED as e:
            log.debug("lease attempt failed", error=_describe(e))
            return False
        return True

    async def _acquire_or_renew(self) -> None:
        """One try (client-go's tryAcquireOrRenew); on success the fence moves on.

        Raises:
            Held: another replica holds the Lease and its term has not run out.
            ApiError, TimeoutError: the attempt failed; it may be tried again.
        """
        sent = self._clock()  # before the read: the fence never outlasts what others see
        if not await self._try_acquire_or_renew():
            holder = (self._observed or {}).get("holderIdentity") or ""
            raise Held(f"the lease is held by {holder}")
        self._valid_until = sent + self.timings.renew_deadline

    async def _try_acquire_or_renew(self) -> bool:
        stamp = _micro_time()
        try:
            old = await self._bounded(self._read())
        except NotFound:
            spec = self._spec(stamp, stamp, transitions=0)
            body = {
                "apiVersion": LEASES.version,
                "kind": LEASES.kind,
                "metadata": {"name": LEASE_NAME, "namespace": self._namespace},
                "spec": spec,
            }
            created = await self._bounded(self._api.create(LEASES, body, namespace=self._namespace))
            self._observe(created)
            return True
        holder = old.get("holderIdentity") or ""
        mine = holder == self.identity
        expired = self._observed_at + self.timings.lease_duration <= self._clock()
        if holder and not mine and not expired:
            return False
        transitions = int(old.get("leaseTransitions") or 0)
        acquired = str(old.get("acquireTime") or stamp) if mine else stamp
        spec = self._spec(acquired, stamp, transitions=transitions if mine else transitions + 1)
        self._observe(await self._bounded(self._put(spec)))
        if not mine:
            log.info("lease taken", previous=holder or None, transitions=spec["leaseTransitions"])
        return True

    async def _read(self) -> dict[str, Any]:
        """The Lease's spec now, remembered with its resourceVersion."""
        lease = await self._api.get(LEASES, LEASE_NAME, namespace=self._namespace)
        old = dict(lease.get("spec") or {})
        if old != self._observed:  # seen now, after the read: expiry is never judged early
            self._observed, self._observed_at = old, self._clock()
        self._resource_version = str(lease["metadata"].get("resourceVersion", ""))
        return old

    def _spec(self, acquired: str, renewed: str, *, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timings.lease_duration)),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    async def _put(self, spec: dict[str, Any]) -> Obj:
        body = {
            "apiVersion": LEASES.version,
            "kind": LEASES.kind,
            "metadata": {
                "name": LEASE_NAME,
                "namespace": self._namespace,
                "resourceVersion": self._resource_version,
            },
            "spec": spec,
        }
        return await self._api.replace(LEASES, body, namespace=self._namespace)

    def _observe(self, lease: Obj) -> None:
        self._observed, self._observed_at = dict(lease.get("spec") or {}), self._clock()
        self._resource_version = str(lease["metadata"].get("resourceVersion", ""))


def _describe(error: BaseException | None) -> str:
    """An error for a log line: its message, or its type when it has none (a timeout)."""
    if error is None:
        return ""
    return str(error) or type(error).__name__
