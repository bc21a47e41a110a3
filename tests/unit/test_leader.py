"""Leader election's decisions on the in-memory API double, with a clock moved by hand."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from projector.config import Timings
from projector.control.leader import LEASE_NAME, Elector
from projector.core.kinds import LEASES
from projector.errors import Fenced, ServerError
from projector.telemetry.metrics import Metrics
from tests.unit.fakeapi import FakeApi

NS = "projector-system"
T = Timings(lease_duration=15, renew_deadline=10, retry_period=2)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(
    api: FakeApi, identity: str, clock: Callable[[], float] = time.monotonic, timings: Timings = T
) -> Elector:
    return Elector(
        api, namespace=NS, identity=identity, metrics=Metrics(), timings=timings, clock=clock
    )


def fail_gets(api: FakeApi, failing: Callable[[], bool]) -> None:
    """The api's GETs fail as a lost connection does whenever `failing()` says so."""
    original = api.get

    async def get(*args: Any, **kw: Any) -> Any:
        if failing():
            raise ServerError(0, "ClientConnectorError")
        return await original(*args, **kw)

    api.get = get  # type: ignore[method-assign]


async def a_leads_b_waits() -> tuple[FakeApi, Clock, Elector, Elector]:
    """Two candidates on one Lease and one clock: a has just taken it, b not tried yet."""
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert await a._attempt()
    return api, clock, a, b


@contextlib.asynccontextmanager
async def campaigning(elector: Elector) -> AsyncIterator[asyncio.Task[None]]:
    """`elector.run()` as a task for the block, cancelled after it."""
    task = asyncio.create_task(elector.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def lease(api: FakeApi) -> dict[str, Any]:
    obj = api.get_object(LEASES, NS, LEASE_NAME)
    assert obj is not None
    return dict(obj["spec"])


async def test_the_first_candidate_creates_the_lease_and_may_write() -> None:
    api, clock = FakeApi(), Clock()
    a = elector(api, "a", clock)
    assert await a._attempt()
    a.leading.set()
    a.valid_for()
    assert lease(api)["holderIdentity"] == "a"
    assert lease(api)["leaseTransitions"] == 0


async def test_a_held_lease_is_taken_only_after_it_went_unrenewed_locally() -> None:
    api, clock, _a, b = await a_leads_b_waits()
    assert not await b._attempt()  # held, and b has just seen it change
    clock.t += T.lease_duration - 0.1
    assert not await b._attempt()
    clock.t += 0.2  # a stopped renewing lease_duration ago, as b measures it
    assert await b._attempt()
    assert lease(api)["holderIdentity"] == "b"
    assert lease(api)["leaseTransitions"] == 1


async def test_a_renewal_seen_restarts_the_standby_s_count() -> None:
    _api, clock, a, b = await a_leads_b_waits()
    assert not await b._attempt()
    clock.t += 10
    assert await a._attempt()  # renewed: the Lease changed
    clock.t += 6
    assert not await b._attempt()  # 16 s since b first saw it, but it changed 6 s ago
    clock.t += 15
    assert await b._attempt()


async def test_a_released_lease_is_taken_at_once() -> None:
    api, _clock, a, b = await a_leads_b_waits()
    a.leading.set()
    assert not await b._attempt()
    await a.release()
    assert lease(api)["holderIdentity"] == ""
    with pytest.raises(Fenced):
        a.valid_for()
    assert await b._attempt()


async def fence_lapsed(a: Elector, clock: Clock) -> None:
    """A loaded machine delayed the last renewal past the renew deadline."""
    clock.t += T.renew_deadline + 0.5


async def renewal_unseen(a: Elector, clock: Clock) -> None:
    """The shutdown cancelled a renewal after the server applied it: a's resourceVersion is old."""
    stale = a._resource_version
    assert await a._attempt()
    a._resource_version = stale


@pytest.mark.parametrize("before_shutdown", [fence_lapsed, renewal_unseen])
async def test_a_lease_still_on_record_as_the_leader_s_is_released_at_shutdown(
    before_shutdown: Callable[[Elector, Clock], Any],
) -> None:
    # The record, not the fence, says whose the Lease is: the standby takes it at once.
    api, clock, a, b = await a_leads_b_waits()
    a.leading.set()
    await before_shutdown(a, clock)
    await a.release()
    assert lease(api)["holderIdentity"] == ""
    assert await b._attempt()


async def test_a_replica_never_releases_a_lease_another_took() -> None:
    api, clock, a, b = await a_leads_b_waits()
    a.leading.set()
    clock.t += T.lease_duration + 1  # a stopped renewing; b takes it, a has not looked since
    assert not await b._attempt()
    clock.t += T.lease_duration + 1
    assert await b._attempt()
    await a.release()
    assert lease(api)["holderIdentity"] == "b"


async def test_the_fence_closes_at_the_renew_deadline_from_the_last_renewal_sent() -> None:
    api, clock = FakeApi(), Clock()
    a = elector(api, "a", clock)
    with pytest.raises(Fenced):
        a.valid_for()  # not leading yet
    assert await a._attempt()
    a.leading.set()
    clock.t += T.renew_deadline - 0.01
    a.valid_for()
    clock.t += 0.02
    with pytest.raises(Fenced):
        a.valid_for()


async def test_a_takeover_loses_to_a_renewal_that_lands_between_its_read_and_write() -> None:
    api, clock, a, b = await a_leads_b_waits()
    assert not await b._attempt()
    clock.t += T.lease_duration + 1  # b now judges the lease expired
    original = api.replace

    async def racing(res: Any, body: Any, **kw: Any) -> Any:
        if body["spec"]["holderIdentity"] == "b":
            api.replace = original  # type: ignore[method-assign]
            assert await a._attempt()  # a's renewal lands first
        return await original(res, body, **kw)

    api.replace = racing  # type: ignore[method-assign]
    assert not await b._attempt()  # its PUT carried the version it read: 409, no second leader
    assert lease(api)["holderIdentity"] == "a"
    assert lease(api)["leaseTransitions"] == 0


async def test_a_nudge_counts_while_a_server_back_from_an_outage_still_answers_5xx() -> None:
    """A server just back answers, but with 5xx (or refusals) while it warms up; the campaign
    failed on one of those last, and a nudge must still end its wait: the outage began it."""
    api = FakeApi()
    timings = Timings(lease_duration=300, renew_deadline=200, retry_period=100)
    a = elector(api, "a", timings=timings)
    errors = [ServerError(0, "ClientConnectorError"), ServerError(503, "ServiceUnavailable")]
    original = api.get
    failed = asyncio.Event()

    async def get(*args: Any, **kw: Any) -> Any:
        if errors:
            failed.set()
            raise errors.pop(0)
        return await original(*args, **kw)

    api.get = get  # type: ignore[method-assign]
    async with campaigning(a), asyncio.timeout(5):
        for _ in range(2):  # each failed attempt is followed by a 100 s wait, then a nudge
            await failed.wait()
            failed.clear()
            for _ in range(10):  # let tenacity record the failure and start its wait
                await asyncio.sleep(0)
            assert not a.leading.is_set()
            a.nudge()  # an informer heard from the server
        await a.leading.wait()


async def test_a_leader_that_cannot_renew_stops_leading_at_its_deadline_and_leads_again() -> None:
    """An outage ends a term, never the elector: fenced at the deadline, it campaigns again and,
    once the server answers, leads a second term (it still holds the Lease: no wait)."""
    api = FakeApi()
    timings = Timings(lease_duration=0.3, renew_deadline=0.2, retry_period=0.01)
    real = elector(api, "a", timings=timings)
    down = asyncio.Event()
    fail_gets(api, down.is_set)
    async with campaigning(real) as task:
        await asyncio.wait_for(real.leading.wait(), 5)
        down.set()
        await asyncio.wait_for(real.following.wait(), 5)
        assert not real.leading.is_set()
        with pytest.raises(Fenced):
            real.valid_for()
        assert not task.done()  # still campaigning
        down.clear()
        await asyncio.wait_for(real.leading.wait(), 5)
        assert real.terms == 2
        real.valid_for()


async def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    api, clock = FakeApi(), Clock()
    timings = Timings(lease_duration=15, renew_deadline=10, retry_period=0.01)
    a = elector(api, "a", clock, timings)
    async with campaigning(a):
        await asyncio.wait_for(a.leading.wait(), 5)
        spec = dict(lease(api), holderIdentity="b")  # an admin handed it over, say
        obj = api.get_object(LEASES, NS, LEASE_NAME)
        assert obj is not None
        await api.replace(LEASES, {**obj, "spec": spec}, namespace=NS)
        await asyncio.wait_for(a.following.wait(), 5)  # long before its renew deadline
        with pytest.raises(Fenced):
            a.valid_for()


async def test_a_nudge_ends_the_wait_of_a_campaign_the_outage_held_back() -> None:
    api = FakeApi()
    timings = Timings(lease_duration=300, renew_deadline=200, retry_period=100)
    a = elector(api, "a", timings=timings)
    failed = asyncio.Event()

    def once() -> bool:
        first = not failed.is_set()
        failed.set()
        return first

    fail_gets(api, once)
    async with campaigning(a):
        await asyncio.wait_for(failed.wait(), 5)  # the next attempt is 100 s away
        for _ in range(10):  # let tenacity record the failure and start its wait
            await asyncio.sleep(0)
        assert not a.leading.is_set()
        a.nudge()  # an informer heard from the server
        await asyncio.wait_for(a.leading.wait(), 5)
