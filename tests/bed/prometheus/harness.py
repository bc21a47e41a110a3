"""A real Prometheus for the tests, and a TCP proxy that can stall the controller's watches.

`binaries()` runs ``tests/bed/prometheus/build.sh`` (a no-op once cached) under its lock and returns
the directory holding ``prometheus`` and ``promtool``. `Prometheus` runs one server on loopback
with exemplar storage, scraping given targets and evaluating the project's rules every second
(or every `interval` seconds); its HTTP API is the only interface used. Given a bearer token, it
scrapes as the chart's ServiceMonitor does: HTTPS without verifying the controller's
self-signed certificate, the token read from a file (`bearerTokenFile`). `StallProxy` forwards
TCP to the API server and, when frozen, stops moving bytes without closing anything: a
silently stalled watch, as a broken middlebox produces it.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.bed.controlplane.plane import free_port
from tests.bed.kube import eventually
from tests.bed.launcher import stop_process

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"


def binaries() -> Path:
    """Build (or reuse) prometheus and promtool; the script holds a lock while it builds."""
    out = subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


class Prometheus:
    """One Prometheus server on a loopback port; stop() ends it."""

    def __init__(
        self,
        bin_dir: Path,
        workdir: Path,
        targets: Sequence[str],
        rule_files: Sequence[Path],
        interval: float = 1.0,
        token: str | None = None,
    ) -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        job: dict[str, Any] = {
            "job_name": "projector",
            "static_configs": [{"targets": list(targets)}],
        }
        if token is not None:
            token_file = workdir / "token"
            token_file.touch(mode=0o600)
            token_file.write_text(token)
            job |= {
                "scheme": "https",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "tls_config": {"insecure_skip_verify": True},
            }
        config = {
            "global": {
                "scrape_interval": f"{interval:g}s",
                "evaluation_interval": f"{interval:g}s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [job],
        }
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    str(bin_dir / "prometheus"),
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--enable-feature=exemplar-storage",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=workdir,
            )
        eventually(self._ready, timeout=60, message="prometheus /-/ready")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def api(self, path: str, **params: str | float) -> Any:
        """GET /api/v1/<path>; returns `data`, raises with Prometheus' error otherwise."""
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (or a scalar as a one-element vector)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        """A range query's matrix."""
        return list(self.api("query_range", query=expr, start=start, end=end, step=step)["result"])

    def firing(self, alert: str) -> list[dict[str, Any]]:
        """The alerts of that name in state firing."""
        return [
            a
            for a in self.api("alerts")["alerts"]
            if a["labels"].get("alertname") == alert and a["state"] == "firing"
        ]

    def stop(self) -> None:
        """Terminate and reap the server."""
        stop_process(self.proc, timeout=20)


class StallProxy:
    """Forwards 127.0.0.1:<port> to an upstream; `freeze()` stops all traffic, `thaw()` resumes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._spawn(self._accept)

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._server], [], [], 0.2)
            if not ready:
                continue
            try:
                down, _ = self._server.accept()
                up = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                continue
            with self._lock:
                self._sockets += [down, up]
            self._spawn(self._pump, down, up)
            self._spawn(self._pump, up, down)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                self._flowing.wait(0.2)
                if not self._flowing.is_set():
                    continue  # frozen: read nothing, write nothing, close nothing
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready or not self._flowing.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def freeze(self) -> None:
        """Stop moving bytes; connections stay open and silent."""
        self._flowing.clear()

    def thaw(self) -> None:
        """Move bytes again."""
        self._flowing.set()

    def close(self) -> None:
        """Close every connection and join every thread."""
        self._closed.set()
        self._flowing.set()
        deadline = time.monotonic() + 5
        with self._lock:
            threads, sockets = list(self._threads), list(self._sockets)
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        for s in [*sockets, self._server]:
            s.close()
