"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics, and the fence.

Every replica runs its informers; only the holder of the Lease `projector-leader` runs workers.

- Acquire: GET the Lease; create it if absent; take it over if its holder is empty (released)
  or has not renewed within `lease_duration` **as measured on the local monotonic clock from the
  last change of the Lease this replica observed** (never from the Lease's timestamps, which come
  from another machine's clock). Every write is an optimistic PUT with the resourceVersion just
  read, so two candidates cannot both win; `leaseTransitions` counts changes of holder.
- Renew: every `retry_period`; each attempt is a GET then a PUT, each bounded by a timeout
  shorter than the retry period.
- Fence: writes are allowed only before `valid_until` = (monotonic time at which the last
  successful renew was *sent*) + `renew_deadline`. Another replica can take over no earlier than
  `lease_duration` after it saw that renew, which is later than the time it was sent; since
  renew_deadline < lease_duration, a replica stops writing before anyone else may start. The
  writer and the transport ask `valid_for()` before every write they send (the transport also
  bounds the wait for a connection by it), so a replica that was frozen (SIGSTOP, a
  long GC pause, a partition) writes nothing when it wakes. Missing the deadline raises `Lost`:
  the process exits non-zero and its pod restarts clean.
- Release (SIGTERM): clear the holder, so a standby need not wait for the lease to expire.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from projector.api import LEASES, Api, Obj
from projector.config import Timings
from projector.errors import ApiError, Fenced, NotFound, ProjectorError
from projector.telemetry import Metrics

LEASE_NAME = "projector-leader"
JITTER = 0.2
"""Candidates retry after retry_period * (1 + up to JITTER), so they do not move in lockstep."""

log = structlog.get_logger("projector.leader")


class Lost(ProjectorError):
    """This replica could not renew the Lease in time; it must stop and exit."""


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """Acquires, renews and releases the Lease for one replica, and fences its writes."""

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
        """Set once this replica holds the Lease; never cleared (losing it ends the process)."""

    def valid_for(self) -> float:
        """The fence: seconds this replica's lease stays valid; `Fenced` if it holds none now."""
        left = self._valid_until - self._clock()
        if not self.leading.is_set() or left <= 0:
            raise Fenced(f"{self.identity} does not hold a valid lease; write refused")
        return left

    async def run(self) -> None:
        """Acquire the Lease, then keep renewing it; raise `Lost` when it cannot be renewed."""
        while not await self._attempt():  # noqa: ASYNC110 - each turn is a request, not a poll
            await asyncio.sleep(self.timings.retry_period * (1 + random.random() * JITTER))
        self.leading.set()
        self._metrics.leading(True)
        log.info("leading", identity=self.identity, valid_for=self.timings.renew_deadline)
        while True:
            await asyncio.sleep(self.timings.retry_period)
            started = self._clock()
            if await self._attempt():
                self._metrics.lease_renewed(self._clock() - started)
                continue
            self._metrics.lease_renew_failed()
            if self._clock() >= self._valid_until:
                self._metrics.leading(False)
                raise Lost(f"{self.identity} could not renew the lease within the renew deadline")

    async def release(self) -> None:
        """Give the Lease up, if still held and valid, so a standby takes over at once."""
        if not self.leading.is_set() or self._clock() >= self._valid_until:
            return
        spec = {**(self._observed or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
        try:
            await self._bounded(self._put(spec))
        except (ApiError, TimeoutError) as e:
            log.warning("lease not released; a standby waits for it to expire", error=str(e))
            return
        finally:
            self._valid_until = 0.0
            self._metrics.leading(False)
        log.info("lease released", identity=self.identity)

    async def _bounded(self, call: Any) -> Any:
        """Every Lease request ends before the next retry is due."""
        async with asyncio.timeout(self.timings.retry_period * 0.75):
            return await call

    async def _attempt(self) -> bool:
        """One try to acquire or renew (client-go's tryAcquireOrRenew); never raises."""
        sent = self._clock()  # before the read: the fence never outlasts what others see
        try:
            ok = await self._try_acquire_or_renew()
        except (ApiError, TimeoutError) as e:
            log.debug("lease attempt failed", error=str(e) or type(e).__name__)
            return False
        if ok:
            self._valid_until = sent + self.timings.renew_deadline
        return ok

    async def _try_acquire_or_renew(self) -> bool:
        stamp = _micro_time()
        try:
            lease = await self._bounded(
                self._api.get(LEASES, LEASE_NAME, namespace=self._namespace)
            )
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
        old = dict(lease.get("spec") or {})
        if old != self._observed:  # seen now, after the read: expiry is never judged early
            self._observed, self._observed_at = old, self._clock()
        self._resource_version = str(lease["metadata"].get("resourceVersion", ""))
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
