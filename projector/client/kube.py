"""The only module that talks HTTP to the API server: its requests, its watches, orjson bodies.

kr8s gives what it is good at, configuration and authentication (kubeconfig, in-cluster
config, exec and OIDC token refresh); its credentials (server, SSL context, bearer token) are
handed to two bounded pools of keep-alive connections: `projector.client.http1`'s for requests (a
third of aiohttp's CPU per copy write) and one aiohttp session for the watches. The
requests themselves (watches with bookmarks, metadata-only reads, PUT with optimistic
concurrency, deletes with preconditions) are shaped by `projector.client.api.Api`; this module
carries
them, adding what a controller needs: timeouts and a watch's read deadline, a client-side rate
limit (qps/burst), and status codes mapped to `projector.errors` by this module itself, so that
nothing above it knows aiohttp or kr8s exist.

An error answers one request and nothing else: it never closes the session, so other requests
and every watch carry on; the error it raises chains the transport's own (`raise ... from`).
Only a 401 re-authenticates (once: a fresh token from kr8s, e.g. a rotated ServiceAccount token),
then the request is sent again. A re-authentication that fails raises `AuthenticationFailed`
(not transient), is logged, and is not tried again before a backoff (1 s doubling to 60 s):
until then a 401 fails at once, so a broken credential never hot-loops on the token source.

No request waits long on a dead connection. A connection is opened within `connect_timeout`
(5 s); a request that receives nothing for `read_timeout` (10 s; a watch has its own read
deadline) fails as a transport error, which the writer and the informers retry on a fresh
connection; an idle pooled connection is closed after `IDLE_RECYCLE` seconds rather than kept
for a later request to find dead; and every socket has TCP keepalive and TCP_USER_TIMEOUT, so
the kernel itself drops a connection whose peer stopped acknowledging (a partition, a vanished
load balancer). The Lease's session is built with timeouts a fraction of the retry period.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import ssl as tls
import sys
import time
from collections.abc import AsyncGenerator, Callable
from types import ModuleType
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import orjson
import structlog
from yarl import URL

from projector import __version__
from projector.client import http1, wire
from projector.client.api import Api, Request
from projector.client.connection import IDLE_RECYCLE, POOL, TokenBucket, tcp_socket
from projector.client.retries import backoff
from projector.core.kinds import Obj, Resource
from projector.errors import (
    AuthenticationFailed,
    ProjectorError,
    ServerError,
)

log = structlog.get_logger("projector.kube")


def _kr8s_auth() -> ModuleType:
    """`kr8s._auth` without running kr8s's package `__init__`.

    That `__init__` imports all of kr8s (httpx, rich, cryptography, its object API): 15 MiB of
    RSS in a controller that uses one class of it. `kr8s._auth` needs only `_config`,
    `_async_utils`, `_types` and `_data_utils` (anyio, yaml, jsonpath), so it is imported under
    a bare package module; then that module and the submodules loaded under it are taken out
    of `sys.modules` again (this module keeps its own reference), so a later `import kr8s` (a
    test, a tool) loads the real package whole, never a half of it.
    """
    if "kr8s" in sys.modules:  # the real package is already loaded: nothing to save
        return importlib.import_module("kr8s._auth")
    spec = importlib.util.find_spec("kr8s")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("kr8s is not installed")
    sys.modules["kr8s"] = importlib.util.module_from_spec(spec)
    try:
        return importlib.import_module("kr8s._auth")
    finally:
        for name in [m for m in sys.modules if m == "kr8s" or m.startswith("kr8s.")]:
            del sys.modules[name]


KubeAuth: Any = _kr8s_auth().KubeAuth

REAUTH_BACKOFF = (1.0, 60.0)
"""After a failed re-authentication, seconds before the next may be tried: doubling, capped."""

RequestHook = Callable[[str, str, int, float], None]
"""Called after each request with (verb, resource plural, status code (0 = no response),
seconds it took; a watch's seconds are those until its response headers)."""


def _tls(scheme: str, ssl: Any) -> tls.SSLContext | None:
    """The TLS context of an https server: kr8s's, else the system's CAs, none for http.

    kr8s gives `True` when the kubeconfig names no certificate.
    """
    if scheme != "https":
        return None
    if isinstance(ssl, tls.SSLContext):
        return ssl
    return tls.create_default_context()


class Kube(Api):
    """`projector.client.api.Api`'s requests, carried over `http1` (and aiohttp for watches)."""

    def __init__(
        self,
        auth: Any,
        ssl: Any,
        *,
        qps: float = 0.0,
        burst: int = 100,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        on_request: RequestHook | None = None,
        identity: str = "",
        fence: Callable[[], float] | None = None,
    ) -> None:
        self._auth = auth
        self._fence = fence
        """For writes: seconds the lease stays valid (raises `Fenced` when none)."""
        self._server = str(auth.server).rstrip("/")
        self._server_name = getattr(auth, "tls_server_name", None) or None
        self._limit = TokenBucket(qps, burst)
        self._header_cache: dict[tuple[str, str, str | None], bytes] = {}
        self._connect_timeout = min(connect_timeout, timeout)
        self._read_timeout = min(read_timeout, timeout)
        self._total_timeout = timeout
        self._on_request = on_request
        self._reauth_failures = 0
        self._reauth_not_before = 0.0
        """Monotonic time before which no re-authentication is tried (after failures)."""
        self._user_agent = f"projector/{__version__} ({identity})" if identity else "projector"
        """Names the replica in the API server's audit log: who wrote what, after which lease."""
        url = urlsplit(self._server)
        self._prefix = url.path
        self._host_header = url.netloc
        self._pool = http1.Pool(
            url.hostname or "",
            url.port or (443 if url.scheme == "https" else 80),
            tls=_tls(url.scheme, ssl),
            server_hostname=self._server_name,
            limit=POOL,
            idle=IDLE_RECYCLE,
            socket_factory=tcp_socket,
        )
        """Every request but the watches (`http1`: a third of aiohttp's CPU per request)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=POOL, ssl=ssl, keepalive_timeout=IDLE_RECYCLE, socket_factory=tcp_socket
            ),
            headers={"User-Agent": self._user_agent},
            skip_auto_headers=("Accept-Encoding",),
            # The API server sets no cookies: a real jar filtered its (empty) cookies for every
            # request and parsed every response's headers for new ones.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, **kw: Any) -> Kube:
        """Build from a kubeconfig path, or in-cluster config, or $KUBECONFIG (kr8s' order)."""
        try:
            # kr8s' credentials alone: `kr8s.asyncio.api()` would also open an httpx session
            # and send a version request that nothing here needs (kr8s is pinned below 0.21).
            auth = await KubeAuth(kubeconfig=kubeconfig)
            ssl = await auth.ssl_context()
        except Exception as e:  # kr8s reports a bad kubeconfig as anything from KeyError up
            raise ProjectorError(
                f"cannot load credentials or reach the API server: {type(e).__name__}: {e}"
            ) from e
        return cls(auth, ssl, **kw)

    def _record(self, verb: str, res: Resource, code: int, started: float) -> None:
        if self._on_request is not None:
            self._on_request(verb, res.plural, code, time.monotonic() - started)

    def _path(self, req: Request) -> str:
        """The request's path under the server's URL.

        Already encoded: every part is a validated DNS name, a plural, a version or a
        subresource.
        """
        res = req.res
        scope = f"/namespaces/{req.namespace}" if res.namespaced and req.namespace else ""
        return f"{res.root}{scope}/{res.url(req.name, req.subresource)}"

    def _target(self, req: Request) -> str:
        """The request line's target: the server's path prefix, the path, the query."""
        target = self._prefix + self._path(req)
        return f"{target}?{urlencode(req.query, quote_via=quote)}" if req.query else target

    def _head(self, req: Request, target: str, length: int) -> bytes:
        """The request line and headers.

        All but the first and last line are built once per (content type, accept, token).
        """
        key = (req.content_type, req.accept, self._auth.token)
        headers = self._header_cache.get(key)
        if headers is None:
            fields = {"Host": self._host_header, "User-Agent": self._user_agent}
            fields.update(self._fields(req))
            if any("\r" in v or "\n" in v for v in fields.values()):
                raise ProjectorError("a request header (a token?) holds a line break: not sent")
            headers = "".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode("latin-1")
            if len(self._header_cache) > 16:  # rotated tokens: keep only current ones
                self._header_cache.clear()
            self._header_cache[key] = headers
        end = f"Content-Length: {length}\r\n\r\n" if length or req.method != "GET" else "\r\n"
        return f"{req.method} {target} HTTP/1.1\r\n".encode() + headers + end.encode()

    def _fields(self, req: Request) -> dict[str, str]:
        """The headers a request names: its media types and the current token.

        A watch sends these alone: aiohttp, which carries it, adds Host and User-Agent.
        """
        fields = {"Content-Type": req.content_type, "Accept": req.accept}
        if self._auth.token:
            fields["Authorization"] = f"Bearer {self._auth.token}"
        return fields

    async def send(self, req: Request) -> Obj:
        """Send one request: rate-limited, fenced if a write, re-authenticated once on a 401."""
        await self._limit.acquire()
        target = self._target(req)
        body = req.body
        data = b"" if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
        for attempt in (1, 2):
            connect = self._connect_timeout
            if self._fence is not None and req.method != "GET":
                # Checked again here, after the rate limit, and no connection may be waited
                # for past the lease: a write is sent while the lease is valid, or never.
                connect = min(connect, self._fence())
            started = time.monotonic()
            try:
                response = await self._pool.request(
                    self._head(req, target, len(data)) + data,
                    connect_timeout=connect,
                    read_timeout=self._read_timeout,
                    total=self._total_timeout,
                )
            except (TimeoutError, OSError) as e:
                self._record(req.verb, req.res, 0, started)
                raise ServerError(0, type(e).__name__, str(e) or "no response") from e
            status, raw = response.status, response.body
            self._record(req.verb, req.res, status, started)
            if status == 401 and attempt == 1:
                await self._reauthenticate()
                continue
            if status >= 400:
                raise wire.from_body(status, raw, response.retry_after)
            try:
                return orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError as e:
                raise ServerError(0, "BadResponse", "undecodable response body") from e
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _reauthenticate(self) -> None:
        """A 401: ask kr8s for fresh credentials (a rotated or refreshed token), once.

        Raises `AuthenticationFailed` if that fails, or if an earlier failure's backoff has
        not run out yet (then kr8s is not asked at all).
        """
        now = time.monotonic()
        if now < self._reauth_not_before:
            raise AuthenticationFailed(
                f"re-authentication failed {self._reauth_failures} time(s); "
                f"next try in {self._reauth_not_before - now:.1f} s"
            )
        try:
            await self._auth.reauthenticate()
        except Exception as e:  # kr8s raises anything from ValueError up
            self._reauth_failures += 1
            wait = backoff(self._reauth_failures, *REAUTH_BACKOFF)
            self._reauth_not_before = time.monotonic() + wait
            log.error(
                "re-authentication failed",
                error=type(e).__name__,
                failures=self._reauth_failures,
                next_try_in=wait,
            )
            raise AuthenticationFailed(f"re-authentication failed: {type(e).__name__}") from e
        self._reauth_failures = 0
        self._reauth_not_before = 0.0

    async def stream(
        self, req: Request, read_deadline: float
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """Yield a watch's events as its lines arrive, after ("OPEN", {}) once it is accepted.

        A 401 re-authenticates and raises: the informer retries with the new token. Events are
        split on newlines here, so an event of any size (a 1 MiB Secret) is read.
        """
        timeout = aiohttp.ClientTimeout(sock_connect=self._connect_timeout, sock_read=read_deadline)
        await self._limit.acquire()
        started = time.monotonic()
        try:
            async with self._session.get(
                URL(self._server + self._path(req), encoded=True),
                params=req.query,
                headers=self._fields(req),
                timeout=timeout,
                server_hostname=self._server_name,
            ) as response:
                self._record(req.verb, req.res, response.status, started)
                if response.status >= 400:
                    raw = await response.read()
                    if response.status == 401:
                        await self._reauthenticate()  # the informer retries with the new token
                    raise wire.from_body(response.status, raw, response.headers.get("Retry-After"))
                yield "OPEN", {}
                async for event in wire.watch_lines(response.content):
                    yield event
                    del event  # not alive while the next event is read
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self._record(req.verb, req.res, 0, started)
            raise ServerError(0, type(e).__name__, str(e) or "watch connection lost") from e

    async def close(self) -> None:
        """Close the connections: the requests' pool and the watches' session."""
        self._pool.close()
        await self._session.close()
        # A transport's socket closes on the loop's next turn: give it that turn, or a loop
        # closed right after (a test's, a CLI's) leaves the socket to the garbage collector.
        await asyncio.sleep(0)
