"""The connection to the API server: pooled sockets that notice a silent peer, a rate limit.

The limit is client-go's qps/burst, so one controller cannot flood the server.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

POOL = 100
"""Connections kept to the API server (HTTP/1.1: one per request in flight, one per watch)."""
IDLE_RECYCLE = 2.0
"""Seconds an idle pooled connection is kept for reuse. A busy controller reuses connections
within milliseconds; one idle longer may have died behind a network fault, and a new connection
costs a TLS handshake (a few ms on loopback), not a request stuck until its read timeout."""
KEEPALIVE = (5, 2, 3)
"""TCP keepalive: first probe after 5 s idle, then every 2 s, dropped after 3 unanswered."""
USER_TIMEOUT_MS = 10_000
"""TCP_USER_TIMEOUT: data unacknowledged this long closes the connection (Linux)."""


def tcp_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """The socket factory given to aiohttp: a TCP socket that notices a peer gone silent."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has all four; others keep the kernel's defaults
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return sock


WAKE_GRID = 0.1
"""Seconds: a rate-limited request wakes at the first multiple of this at or after its token's
time, so the waiters wake 20 at a time at 200/s, not one event-loop wake-up each. Measured at
1 -> 1,000 and --qps 200 (write-path-7/8/9 in docs/benchmarks.md): CPU per copy write 1.74 ms
with none, 1.35 at 20 ms, 1.16 at 50, 1.05 at 100, the fan-out's end unchanged; what it costs
is a throttled request's wait, 50 ms more on average."""


class TokenBucket:
    """Client-side rate limit (client-go's qps/burst), so one controller cannot flood the server.

    A caller reserves the next token at once, into debt when the bucket is empty, and sleeps
    until that token's time, as golang.org/x/time/rate (client-go's limiter) does. No lock is
    held across the sleep, so a sleep that a busy event loop lets overshoot delays only its own
    request: the rate stays qps. (Taking tokens one sleeper at a time under a lock, and counting
    from the late wake-up, had made it 1 / (1/qps + overshoot) whenever the loop was busy.)
    The wake-up is rounded up to `WAKE_GRID`, which batches the event loop's work and never
    raises the rate. A request cancelled while it waits keeps its token spent.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(self.burst)
        self._last = clock()

    async def acquire(self) -> None:
        """Wait for a token; qps <= 0 means unlimited."""
        if self.qps <= 0:
            return
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps) - 1
        self._last = now
        if self._tokens < 0:
            due = now - self._tokens / self.qps
            await self._sleep(math.ceil(due / WAKE_GRID - 1e-9) * WAKE_GRID - now)
