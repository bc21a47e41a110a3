"""The client-side rate limit, on a clock the test moves."""

from __future__ import annotations

import asyncio

import pytest

from projector.client import connection
from projector.client.connection import TokenBucket


class Clock:
    """Fake time: a sleep records its length and moves the clock by it plus `overshoot`."""

    def __init__(self, overshoot: float = 0.0) -> None:
        self.now = 0.0
        self.overshoot = overshoot
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.overshoot


def bucket(clock: Clock, qps: float, burst: int) -> TokenBucket:
    return TokenBucket(qps, burst, clock=clock, sleep=clock.sleep)


async def test_a_burst_passes_at_once_and_the_rest_waits_its_turn() -> None:
    clock = Clock()
    limit = bucket(clock, qps=10, burst=2)
    for _ in range(5):  # all reserved at t = 0: the sleeps are the tokens' times
        await limit.acquire()
        clock.now = 0.0
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.3])


async def test_concurrent_callers_wait_in_parallel_and_wake_together_on_the_grid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tokens due at 10, 20 and 30 ms wake at 20, 20 and 40 ms: one loop wake-up for two."""
    monkeypatch.setattr(connection, "WAKE_GRID", 0.02)
    clock, started = Clock(), asyncio.Event()
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:  # every caller asleep at once, the clock still
        sleeps.append(seconds)
        if len(sleeps) == 3:
            started.set()
        await started.wait()

    limit = TokenBucket(100, 1, clock=clock, sleep=sleep)
    await asyncio.gather(*(limit.acquire() for _ in range(4)))
    assert sleeps == pytest.approx([0.02, 0.02, 0.04])


async def test_late_wake_ups_do_not_slow_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sleep overshoots by half a token's time, as on a busy event loop: 105 requests one
    after another, 5 of them the burst, still take 1 s of the clock at 100 per second (and at
    most one wake grid and one overshoot more), not 1.5 s."""
    monkeypatch.setattr(connection, "WAKE_GRID", 0.02)  # its and the overshoot's tokens fit
    clock = Clock(overshoot=0.005)  # the burst: a lone caller keeps what a late wake-up earns
    limit = bucket(clock, qps=100, burst=5)
    for _ in range(105):
        await limit.acquire()
    assert 1.0 <= clock.now <= 1.0 + connection.WAKE_GRID + clock.overshoot + 1e-9


async def test_zero_qps_never_waits() -> None:
    clock = Clock()
    limit = bucket(clock, qps=0, burst=1)
    for _ in range(1_000):
        await limit.acquire()
    assert clock.sleeps == []
