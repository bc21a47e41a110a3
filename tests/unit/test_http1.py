"""`projector.client.http1` on a loopback server that answers as the test scripts it.

What the API server never does on demand (stall, answer garbage, drop a connection mid-body)
is scripted here; the transport's ordinary path is tested on the real API server
(tests/integration/test_kube.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from projector.client import http1
from projector.client.connection import tcp_socket

pytestmark = pytest.mark.both_loops  # the controller runs on uvloop, whose transports differ

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]
"""Writes the response to one request (its head and body as received)."""


def ok(body: bytes = b"{}", *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *extra))
    return f"HTTP/1.1 200 OK\r\n{head}\r\n".encode() + body


class Server:
    """Counts connections, keeps every request, answers each with `answer`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0
        self.received = asyncio.Event()
        self.hung_up = asyncio.Event()
        """Set when a client closes a connection."""
        self.handlers: set[asyncio.Task[Any]] = set()
        """One task per connection, each ending once its client is gone."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (task := asyncio.current_task()) is not None:
            self.handlers.add(task)
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                self.received.set()
                await self.answer(request, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(answer: Answer, **pool: Any) -> AsyncIterator[tuple[Server, http1.Pool]]:
    server = Server(answer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = server.port = listener.sockets[0].getsockname()[1]
    options: dict[str, Any] = {"limit": 4, "idle": 30.0, **pool}
    client = http1.Pool(
        "127.0.0.1", port, tls=None, server_hostname=None, socket_factory=tcp_socket, **options
    )
    try:
        yield server, client
    finally:
        client.close()
        listener.close()
        # The client's connections are closed: each handler ends on its own within a turn or
        # a paced write; none may outlive the test (tests/conftest.py fails a test that does).
        if server.handlers:
            await asyncio.wait(server.handlers, timeout=5)


def get(path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


async def call(
    pool: http1.Pool, data: bytes = b"", *, read: float = 5.0, total: float = 10.0
) -> http1.Response:
    return await pool.request(data or get(), connect_timeout=5.0, read_timeout=read, total=total)


async def answer_ok(request: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(ok(b'{"n": %d}' % len(request)))


async def test_a_kept_alive_connection_carries_the_next_request() -> None:
    async with serving(answer_ok) as (server, pool):
        first = await call(pool)
        second = await call(pool, b"PUT /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    assert (first.status, second.status) == (200, 200)
    assert server.connections == 1 and len(server.requests) == 2
    assert second.body.endswith(b"}") and server.requests[1].endswith(b"\r\n\r\n{}")


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    async def close_after(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(ok(b"{}", "Connection: close"))

    async with serving(close_after) as (server, pool):
        await call(pool)
        await call(pool)
    assert server.connections == 2


async def test_an_idle_connection_is_closed_though_no_request_comes() -> None:
    async with serving(answer_ok, idle=0.05) as (server, pool):
        await call(pool)
        await asyncio.wait_for(server.hung_up.wait(), 5)
        await call(pool)  # and the next request has a new one
    assert server.connections == 2


async def test_a_chunked_body_in_many_pieces_is_whole() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB

    async def chunked(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), 7000):
            piece = body[i : i + 7000]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async with serving(chunked) as (server, pool):
        response = await call(pool)
        again = await call(pool)
    assert response.body == body and again.body == body and server.connections == 1


async def test_retry_after_is_read_from_any_casing() -> None:
    async def throttled(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 429 Too Many Requests\r\nRETRY-after: 3\r\nContent-Length: 0\r\n\r\n"
        )

    async with serving(throttled) as (_, pool):
        response = await call(pool)
    assert (response.status, response.retry_after, bytes(response.body)) == (429, "3", b"")


async def test_a_silent_server_times_out_and_its_connection_is_not_reused() -> None:
    async def first_silent(request: bytes, writer: asyncio.StreamWriter) -> None:
        if b"/silent" in request:
            return
        writer.write(ok())

    async with serving(first_silent) as (server, pool):
        with pytest.raises(TimeoutError, match=r"nothing received for 0\.1 s"):
            await call(pool, get("/silent"), read=0.1)
        assert (await call(pool)).status == 200
    assert server.connections == 2


async def test_a_trickling_response_meets_its_total_deadline() -> None:
    """Bytes keep coming, so no read timeout: the total deadline ends it."""

    async def trickle(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.01)  # allowed-sleep: the scripted server's pace

    async with serving(trickle) as (_, pool):
        with pytest.raises(TimeoutError, match="total timeout"):
            await call(pool, read=0.5, total=0.3)


async def test_a_response_cut_off_mid_body_fails_and_the_next_request_gets_a_new_connection() -> (
    None
):
    async def cut(request: bytes, writer: asyncio.StreamWriter) -> None:
        if b"/cut" in request:
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"half')
            await writer.drain()
            raise ConnectionResetError  # the handler closes the socket
        writer.write(ok())

    async with serving(cut) as (server, pool):
        with pytest.raises(http1.ConnectionClosed, match="closed the connection"):
            await call(pool, get("/cut"))
        assert (await call(pool)).status == 200
    assert server.connections == 2


async def test_not_http_is_an_error_that_says_so() -> None:
    async def garbage(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")

    async with serving(garbage) as (_, pool):
        with pytest.raises(http1.ConnectionClosed, match=r"not an HTTP/1\.1 response"):
            await call(pool)


async def test_a_cancelled_request_closes_its_connection() -> None:
    """Its response may still come: a reused connection would hand it to the next request."""
    release = asyncio.Event()

    async def held(request: bytes, writer: asyncio.StreamWriter) -> None:
        if b"/held" in request:
            await release.wait()
        writer.write(ok(b'"%s"' % request.split(b" ")[1]))

    async with serving(held) as (server, pool):
        task = asyncio.create_task(call(pool, get("/held")))
        await server.received.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        assert (await call(pool, get("/next"))).body == b'"/next"'
    assert server.connections == 2


async def test_no_free_slot_within_the_connect_timeout_is_a_timeout() -> None:
    release = asyncio.Event()

    async def held(request: bytes, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(ok())

    async with serving(held, limit=1) as (server, pool):
        busy = asyncio.create_task(call(pool))
        await server.received.wait()
        with pytest.raises(TimeoutError):
            await pool.request(get(), connect_timeout=0.05, read_timeout=5, total=5)
        release.set()
        assert (await busy).status == 200


async def test_a_refused_connection_is_an_oserror() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        pool = http1.Pool(
            "127.0.0.1",
            port,
            tls=None,
            server_hostname=None,
            limit=1,
            idle=1,
            socket_factory=tcp_socket,
        )
        with pytest.raises(ConnectionRefusedError):
            await call(pool)
        pool.close()


async def test_a_server_that_does_not_speak_tls_is_an_ssl_error() -> None:
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(ok())
        writer.close()

    listener = await asyncio.start_server(plain, "127.0.0.1", 0)
    pool = http1.Pool(
        "127.0.0.1",
        listener.sockets[0].getsockname()[1],
        tls=ssl.create_default_context(),
        server_hostname=None,
        limit=1,
        idle=1,
        socket_factory=tcp_socket,
    )
    try:
        with pytest.raises(ssl.SSLError):
            await call(pool)
    finally:
        pool.close()
        listener.close()
