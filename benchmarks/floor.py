"""The floor: a bare asyncio writer on the fastest client here, in its own process, on uvloop.

Not projector's client (`projector.client.kube.Kube`, `projector.client.http1`): the floor is
what the API server allows a client that does nothing but the writes, so it must not inherit
projector's client costs. It speaks HTTPS with the admin kubeconfig's own credentials (client
certificate and key, CA), built into an `ssl.SSLContext`. Its PUTs go over `Lines`: kept-alive
connections, each carrying one request at a time, the responses read by llhttp (httptools) and
the JSON by orjson; no pool, no timeouts, no retries, so per write it costs a third of aiohttp's
CPU. Lists and watches, a few per run, use one aiohttp session.

It runs as a subprocess (`python -m benchmarks.floor KUBECONFIG`) driven by JSON lines on stdin,
one answer line on stdout per command, so that its CPU can be attributed: nothing else runs in
that process, and `time.process_time()` deltas around a batch of writes are the CPU those writes
cost the client (every thread of the process; the stdin reader thread is blocked meanwhile).
Times are `time.monotonic()` (CLOCK_MONOTONIC, shared by every process of the machine), so a t0
taken here compares with a watch event timed in the harness process.

Commands: - ``{"op": "load", "selector": S, "manager": M}``: list Secrets matching S; keep their
bodies to PUT, as field manager M (default "floor"; "projector" keeps a copy's managedFields as
projector's own writes leave them). - ``{"op": "fanout", "key": K, "value": V, "concurrency":
32}``: PUT every loaded body with data[K] = V (each with its last known resourceVersion), at
most `concurrency` in flight. Answers t0 (just before the first write is sent), t_done, cpu
(process seconds) and writes. - ``{"op": "watch", "selector": S}``: open a watch on Secrets
matching S (for round trips). - ``{"op": "roundtrips", "namespace": NS, "names": [A, B], "key":
K, "value": V}``: write A, wait for the watch event showing it, then B: two write+watch round
trips, the least a controller must do for one change and one copy. Answers t0, t1, cpu, and
marks (each write's response and watch event). - ``{"op": "quit"}``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote, urlsplit

import aiohttp
import httptools
import orjson
import uvloop
import yaml

from benchmarks.common import REPO

WRITE_CONCURRENCY = 32  # projector's default --write-concurrency
FLOOR_CLIENT = "raw HTTP/1.1 + llhttp (httptools) + orjson on uvloop, own process"
"""What the result files say the floor is (before session 13's results: aiohttp + orjson)."""


def _data(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    """A kubeconfig credential, inline (`<key>-data`, base64) or as a file path (`<key>`)."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        return (base / entry[key]).read_bytes()
    return None


def ssl_and_headers(kubeconfig: Path) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    """Server URL, an SSLContext with the CA and client certificate, and auth headers."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    ctx_name = cfg["current-context"]
    context = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == context["user"])
    base = kubeconfig.parent
    ctx = ssl.create_default_context()
    ca = _data(cluster, "certificate-authority", base)
    if ca:
        ctx.load_verify_locations(cadata=ca.decode())
    cert, key = _data(user, "client-certificate", base), _data(user, "client-key", base)
    if cert and key:
        # load_cert_chain reads files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="floor-") as d:
            cp, kp = Path(d) / "c.pem", Path(d) / "k.pem"
            for p, b in ((cp, cert), (kp, key)):
                p.touch(mode=0o600)
                p.write_bytes(b)
            ctx.load_cert_chain(cp, kp)
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    return cluster["server"].rstrip("/"), ctx, headers


class _Line(asyncio.Protocol):
    """One kept-alive connection: a request written whole, its response handed to a future."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[tuple[int, bytes]] | None = None
        self.parts: list[bytes] = []
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, part: bytes) -> None:
        self.parts.append(part)

    def on_message_complete(self) -> None:
        assert self.answer is not None
        self.answer.set_result((self.parser.get_status_code(), b"".join(self.parts)))
        self.parts = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError(f"the server hung up: {exc}"))

    def exchange(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.answer


class Lines:
    """At most `limit` `_Line`s, opened when first needed, each reused by the next request."""

    def __init__(self, server: str, ssl_ctx: ssl.SSLContext, headers: dict[str, str], limit: int):
        url = urlsplit(server)
        self.host, self.port, self.ssl = url.hostname or "", url.port or 443, ssl_ctx
        fields = {"Host": url.netloc, **headers}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode()
        self.free: asyncio.LifoQueue[_Line | None] = asyncio.LifoQueue()
        for _ in range(limit):
            self.free.put_nowait(None)

    async def put(self, path: str, body: bytes) -> tuple[int, bytes]:
        line = await self.free.get()
        try:
            if line is not None and line.lost:
                line = None  # the server closed it while idle: a write to it would be lost
            if line is None:
                _, line = await asyncio.get_running_loop().create_connection(
                    _Line, self.host, self.port, ssl=self.ssl
                )
            request = b"PUT %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
                path.encode(),
                self.head,
                len(body),
                body,
            )
            answer = await line.exchange(request)
        except BaseException:
            if line is not None and line.transport is not None:
                line.transport.close()
            self.free.put_nowait(None)
            raise
        self.free.put_nowait(line)
        return answer

    def close(self) -> None:
        while not self.free.empty():
            line = self.free.get_nowait()
            if line is not None and line.transport is not None:
                line.transport.close()


class FloorClient:
    """The least client: PUTs on `Lines`, GET/list and watch on one aiohttp session, orjson."""

    def __init__(self, kubeconfig: Path, limit: int = 64) -> None:
        self.server, ssl_ctx, headers = ssl_and_headers(kubeconfig)
        self.lines = Lines(self.server, ssl_ctx, headers, limit)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=limit),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )

    async def close(self) -> None:
        self.lines.close()
        await self.session.close()

    @staticmethod
    def secret_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{namespace}/secrets/{name}"

    async def list(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        url = f"{self.server}/api/v1/secrets?labelSelector={quote(selector)}"
        async with self.session.get(url) as r:
            body = orjson.loads(await r.read())
            if r.status != 200:
                raise RuntimeError(f"list {selector}: {r.status} {body}")
        return body["items"], body["metadata"]["resourceVersion"]

    async def put(self, body: dict[str, Any], manager: str = "floor") -> dict[str, Any]:
        m = body["metadata"]
        path = self.secret_path(m["namespace"], m["name"])
        status, raw = await self.lines.put(f"{path}?fieldManager={manager}", orjson.dumps(body))
        out: dict[str, Any] = orjson.loads(raw)
        if status != 200:
            raise RuntimeError(f"PUT {path}: {status} {out.get('message')}")
        return out

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        async with self.session.get(self.server + self.secret_path(namespace, name)) as r:
            out: dict[str, Any] = orjson.loads(await r.read())
            if r.status != 200:
                raise RuntimeError(f"GET {namespace}/{name}: {r.status} {out.get('message')}")
        return out

    async def watch(
        self, selector: str, rv: str, seconds: int = 3600
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        url = (
            f"{self.server}/api/v1/secrets?watch=1&allowWatchBookmarks=true"
            f"&labelSelector={quote(selector)}&resourceVersion={rv}&timeoutSeconds={seconds}"
        )
        async with self.session.get(url) as r:
            if r.status != 200:
                raise RuntimeError(f"watch {selector}: {r.status}")
            yield "OPEN", {}
            while line := await r.content.readline():
                ev = orjson.loads(line)
                yield ev["type"], ev["object"]


class Observer:
    """The harness's own client for triggering writes and for watching copies: the floor's.

    Every system is timed by the same observer, and a fast one, so neither the harness's
    trigger nor its watch depends on the client of the system under test. It offers the part
    of `projector.client.kube.Kube` that `harness.Watcher` and `harness.put_value` use, Secrets
    only.
    """

    def __init__(self, kubeconfig: Path) -> None:
        self.client = FloorClient(kubeconfig)

    async def list(
        self, res: object, *, label_selector: str | None = None, **_: Any
    ) -> tuple[list[dict[str, Any]], str]:
        return await self.client.list(label_selector or "")

    async def watch(
        self,
        res: object,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 600,
        **_: Any,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        async for ev in self.client.watch(label_selector or "", resource_version, timeout_seconds):
            yield ev

    async def get(self, res: object, name: str, *, namespace: str) -> dict[str, Any]:
        return await self.client.get(namespace, name)

    async def replace(
        self, res: object, body: dict[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        return await self.client.put(body)

    async def close(self) -> None:
        await self.client.close()


@contextlib.asynccontextmanager
async def observer(kubeconfig: Path) -> AsyncIterator[Observer]:
    obs = Observer(kubeconfig)
    try:
        yield obs
    finally:
        await obs.close()


class Floor:
    """The state of the floor process: loaded bodies, an optional watch."""

    def __init__(self, client: FloorClient) -> None:
        self.client = client
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.values: dict[tuple[str, str], str] = {}
        self.changed = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self.manager = "floor"

    async def load(self, selector: str, manager: str = "floor") -> dict[str, Any]:
        self.manager = manager
        items, _ = await self.client.list(selector)
        self.bodies = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}
        return {"n": len(self.bodies)}

    async def fanout(self, key: str, value: str, concurrency: int) -> dict[str, Any]:
        encoded = base64.b64encode(value.encode()).decode()
        sem = asyncio.Semaphore(concurrency)

        async def one(k: tuple[str, str]) -> None:
            async with sem:
                body = self.bodies[k]
                body["data"][key] = encoded
                self.bodies[k] = await self.client.put(body, self.manager)

        cpu0 = time.process_time()
        t0 = time.monotonic()
        await asyncio.gather(*(one(k) for k in list(self.bodies)))
        t_done = time.monotonic()
        cpu = time.process_time() - cpu0
        return {"t0": t0, "t_done": t_done, "cpu": cpu, "writes": len(self.bodies)}

    async def open_watch(self, selector: str) -> dict[str, Any]:
        items, rv = await self.client.list(selector)
        for o in items:
            self._see(o)
        opened = asyncio.Event()

        async def run() -> None:
            async for kind, o in self.client.watch(selector, rv):
                if kind == "OPEN":
                    opened.set()
                elif kind in ("ADDED", "MODIFIED"):
                    self._see(o)
                    self.changed.set()

        self._watch = asyncio.create_task(run())
        await opened.wait()
        return {"n": len(self.values)}

    def _see(self, o: dict[str, Any]) -> None:
        m = o["metadata"]
        k = (m["namespace"], m["name"])
        self.values[k] = base64.b64decode((o.get("data") or {}).get("token", "")).decode()
        self.bodies[k] = o

    async def _until(self, k: tuple[str, str], value: str) -> None:
        while self.values.get(k) != value:
            self.changed.clear()
            await self.changed.wait()

    async def roundtrips(
        self, namespace: str, names: list[str], key: str, value: str
    ) -> dict[str, Any]:
        encoded = base64.b64encode(value.encode()).decode()
        cpu0 = time.process_time()
        t0 = time.monotonic()
        marks = []  # per write: its response, then its watch event
        for name in names:
            k = (namespace, name)
            body = self.bodies[k]
            body["data"][key] = encoded
            await self.client.put(body)
            marks.append(time.monotonic())
            await self._until(k, value)
            marks.append(time.monotonic())
        t1 = time.monotonic()
        cpu = time.process_time() - cpu0
        return {"t0": t0, "t1": t1, "cpu": cpu, "writes": len(names), "marks": marks}

    async def close(self) -> None:
        if self._watch:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.client.close()


async def serve(kubeconfig: Path) -> None:
    floor = Floor(FloorClient(kubeconfig))
    try:
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                return
            cmd = orjson.loads(line)
            op = cmd.pop("op")
            if op == "quit":
                return
            if op == "load":
                out = await floor.load(cmd["selector"], cmd.get("manager", "floor"))
            elif op == "fanout":
                out = await floor.fanout(
                    cmd["key"], cmd["value"], cmd.get("concurrency", WRITE_CONCURRENCY)
                )
            elif op == "watch":
                out = await floor.open_watch(cmd["selector"])
            elif op == "roundtrips":
                out = await floor.roundtrips(
                    cmd["namespace"], cmd["names"], cmd["key"], cmd["value"]
                )
            else:
                out = {"error": f"unknown op {op}"}
            sys.stdout.write(orjson.dumps(out).decode() + "\n")
            sys.stdout.flush()
    finally:
        await floor.close()


class FloorProcess:
    """The harness side: start `python -m benchmarks.floor`, send commands, read answers."""

    def __init__(self, kubeconfig: Path, log: Path, module: str = "benchmarks.floor") -> None:
        """`module`: benchmarks.floor (aiohttp + orjson) or benchmarks.floor_sync (stdlib)."""
        self.kubeconfig, self.log, self.module = kubeconfig, log, module
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> FloorProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                self.module,
                str(self.kubeconfig),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                cwd=REPO,
                env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(orjson.dumps({"op": op, **args}) + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"floor process ended; see {self.log}: {self.log.read_text()[-2000:]}"
            )
        out: dict[str, Any] = orjson.loads(line)
        if "error" in out:
            raise RuntimeError(out["error"])
        return out

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.proc and self.proc.stdin
        with contextlib.suppress(OSError):
            self.proc.stdin.write(b'{"op": "quit"}\n')
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as projector runs
        runner.run(serve(Path(sys.argv[1])))
