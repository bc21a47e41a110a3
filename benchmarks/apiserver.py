"""What a sample costs the API server itself: its process CPU and the requests it served.

The kube-apiserver of the plane is found by its `--secure-port` (the kubeconfig's port) in
/proc; its CPU is read from /proc (user + system, every thread), its requests from its own
`apiserver_request_total` (every verb but WATCH, read through its /metrics with the admin's
credentials). A sample reads the counters before its CPU window opens and after it closes, so
the scrape itself (megabytes of text) is never counted; the API server's idle CPU rate (its
other clients: the controller manager, the watches' bookmarks), measured over `IDLE` seconds
just before each sample, once the system under test has gone quiet, is subtracted for the
window's length. (Measured once per block instead, it caught a peer's start-up still settling
and made its copies look cheaper than the floor's.)
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import aiohttp

from benchmarks.common import process_cpu
from benchmarks.floor import ssl_and_headers

IDLE = 0.5
_REQUEST = re.compile(rb"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$", re.M)


def find_pid(kubeconfig: Path) -> int | None:
    """The kube-apiserver serving this kubeconfig's port on this machine, if any."""
    server, _, _ = ssl_and_headers(kubeconfig)
    port = urlparse(server).port
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"kube-apiserver")
            and f"--secure-port={port}".encode() in argv
        ):
            return int(proc.name)
    return None


@dataclass
class Cost:
    """One sample's cost to the API server."""

    cpu: float
    """Seconds of its CPU, its idle rate subtracted."""
    requests: float
    """Requests it served (every verb but WATCH)."""


class ApiServer:
    """The plane's API server, read around a sample (`start`, then `stop`)."""

    def __init__(self, kubeconfig: Path, pid: int) -> None:
        self.pid = pid
        self._server, self._ssl, self._headers = ssl_and_headers(kubeconfig)
        self.idle_rate = 0.0
        self._cpu0 = self._t0 = self._req0 = 0.0

    @classmethod
    def find(cls, kubeconfig: Path) -> ApiServer | None:
        pid = find_pid(kubeconfig)
        return None if pid is None else cls(kubeconfig, pid)

    async def requests(self) -> float:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl)) as s,
            s.get(f"{self._server}/metrics", headers=self._headers) as r,
        ):
            body = await r.read()
        return sum(
            float(value)
            for labels, value in _REQUEST.findall(body)
            if b'verb="WATCH"' not in labels
        )

    async def start(self) -> None:
        """Open a sample's window, first measuring the API server's idle CPU rate."""
        c0, t0 = process_cpu(self.pid), time.monotonic()
        await asyncio.sleep(IDLE)
        self.idle_rate = (process_cpu(self.pid) - c0) / (time.monotonic() - t0)
        self._req0 = await self.requests()
        self._cpu0, self._t0 = process_cpu(self.pid), time.monotonic()

    async def stop(self) -> Cost:
        cpu = process_cpu(self.pid) - self._cpu0 - self.idle_rate * (time.monotonic() - self._t0)
        return Cost(max(0.0, cpu), await self.requests() - self._req0)
