"""Request/response calls over keep-alive HTTP/1.1, at a third of aiohttp's client CPU.

Every copy write is one request, so a request's client cost is the controller's cost per copy.
Bare PUTs with the same TLS, bodies and concurrency against the same API server cost 0.32-0.45
ms of CPU each on aiohttp (request and response objects, header multidicts, URL handling,
tracing hooks) and 0.12-0.18 ms on llhttp (httptools, the parser uvicorn uses) with this
protocol; the whole controller went from 0.27-0.30 to 0.19-0.20 ms per copy write
(write-path-13-http1 in docs/benchmarks.md). Watches stay on aiohttp
(`projector.client.kube.Kube.stream`): a few long-lived streams, whose cost is per event, not per
request.

A connection carries one request at a time. A pool keeps at most `limit` in use; an idle one is
reused (most recent first) for `idle` seconds, then closed, so no request finds a connection
that died while parked. A connection is reused only after a whole response the server allows
to be followed by another (`Connection: keep-alive`); after any error it is closed, never
reused mid-response.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools

SocketFactory = Callable[[tuple[Any, ...]], socket.socket]


@dataclass(frozen=True, slots=True)
class Response:
    """A whole response: its status, its body and the one header a caller reads."""

    status: int
    body: bytearray
    retry_after: str | None


class ConnectionClosed(ConnectionError):
    """The connection ended (or broke HTTP) before the whole response arrived."""


class _Connection(asyncio.Protocol):
    """One socket to the server and llhttp reading its responses, one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Response] | None = None
        self._body = bytearray()
        self._retry_after: str | None = None
        self.closed = False
        self.reusable = False
        self.last_read = 0.0
        """`loop.time()` of the last bytes received: a request's read timeout counts from it."""
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionClosed("the server closed the connection"), exc)

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ConnectionClosed(f"not an HTTP/1.1 response: {e}"), e)
            self.close()

    # llhttp's callbacks, from inside feed_data:
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self._retry_after = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body += body  # grown in place: a page of 1 MiB Secrets is never held twice

    def on_message_complete(self) -> None:
        response = Response(self._parser.get_status_code(), self._body, self._retry_after)
        self._body, self._retry_after = bytearray(), None
        self.reusable = self._parser.should_keep_alive()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def send(self, data: bytes) -> asyncio.Future[Response]:
        """Write a whole request; the future is its response."""
        assert self._transport is not None and self._waiter is None
        self.reusable = False
        self.last_read = self._loop.time()
        self._waiter = self._loop.create_future()
        self._transport.write(data)
        return self._waiter

    def _fail(self, error: Exception, cause: BaseException | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            error.__cause__ = cause
            waiter.set_exception(error)

    def time_out(self, what: str) -> None:
        """Fail the request in flight with a TimeoutError, and close."""
        self._fail(TimeoutError(what), None)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Pool:
    """Keep-alive connections to one server; `request` sends one request on one of them."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
        limit: int,
        idle: float,
        socket_factory: SocketFactory,
    ) -> None:
        self._host, self._port = host, port
        self._tls = tls
        self._server_hostname = (server_hostname or host) if tls is not None else None
        self._slots = asyncio.Semaphore(limit)
        self._idle: deque[_Connection] = deque()
        self._idle_for = idle
        self._socket_factory = socket_factory
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(
        self, data: bytes, *, connect_timeout: float, read_timeout: float, total: float
    ) -> Response:
        """Send `data` (a whole request) and return the whole response.

        A free connection slot and, if none is idle, a new connection are had within
        `connect_timeout`; then the response must not pause for `read_timeout` nor take more
        than `total` from the start. Raises TimeoutError or OSError (ConnectionClosed, an
        `ssl.SSLError`, a refused connection).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self._slots.locked():
            async with asyncio.timeout(connect_timeout):
                await self._slots.acquire()
        else:
            await self._slots.acquire()  # returns at once: not a suspension point
        try:
            conn = self._reuse(started)
            if conn is None:
                remaining = connect_timeout - (loop.time() - started)
                async with asyncio.timeout(remaining):
                    conn = await self._connect(loop)
            response = await self._exchange(loop, conn, data, started + total, read_timeout)
            if conn.reusable and not conn.closed and not self._closed:
                conn.idle_since = loop.time()
                self._idle.append(conn)
                self._schedule_sweep(loop)
            else:
                conn.close()
            return response
        finally:
            self._slots.release()

    async def _exchange(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Connection,
        data: bytes,
        deadline: float,
        read_timeout: float,
    ) -> Response:
        """One request on `conn`, watched by one timer that re-arms itself (not one per read)."""
        response = conn.send(data)
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer
            now = loop.time()
            if now >= deadline:
                conn.time_out("no whole response within the request's total timeout")
            elif now >= conn.last_read + read_timeout:
                conn.time_out(f"nothing received for {read_timeout:g} s")
            else:
                timer = loop.call_at(min(deadline, conn.last_read + read_timeout), check)

        check()  # arms the first timer (or fails at once if the deadline passed waiting)
        try:
            return await response
        except BaseException:
            conn.close()  # never reused mid-response (a cancellation included)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _reuse(self, now: float) -> _Connection | None:
        """The most recently parked live connection, closing the ones idle too long."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self._idle_for:
                return conn
            conn.close()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        """A new connection: each resolved address in turn, the first that answers."""
        infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        error: OSError = ConnectionClosed(f"{self._host} resolved to no address")
        for info in infos:
            sock = self._socket_factory(info)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, info[4])
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
                    sock=sock,
                    ssl=self._tls,
                    server_hostname=self._server_hostname,
                )
            except OSError as e:
                sock.close()
                error = e
                continue
            except BaseException:
                sock.close()
                raise
            return conn
        raise error

    def _schedule_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close parked connections once idle too long, though no request comes to find them."""
        if self._sweep is None:
            self._sweep = loop.call_later(self._idle_for, self._swept, loop)

    def _swept(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep = None
        now = loop.time()
        while self._idle and (
            self._idle[0].closed or now - self._idle[0].idle_since >= self._idle_for
        ):
            self._idle.popleft().close()
        if self._idle:
            self._schedule_sweep(loop)

    def close(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._idle:
            self._idle.popleft().close()
