"""A real OpenTelemetry Collector for the tests, and a black hole to export to.

`binary()` runs ``tests/bed/otel/build.sh`` (a no-op once cached) under its lock and returns the
collector's path. `Collector` runs one on a loopback port: its OTLP/HTTP receiver feeds the file
exporter, which writes every batch it received as one OTLP/JSON line; `spans()` reads them back
as flat `Span`s, resource attributes included. `BlackHole` accepts connections and reads what
is sent, and never answers: a receiver that hangs, as a dead load balancer does.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.bed.controlplane.plane import free_port
from tests.bed.kube import eventually
from tests.bed.launcher import stop_process

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"

STATUS_ERROR = 2
"""OTLP's Status.code for an error (0 unset, 1 ok)."""


def binary() -> Path:
    """Build (or reuse) the collector; the script holds a lock while it builds."""
    out = subprocess.run([str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Span:
    """One span as the collector received it, with its resource's attributes."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    resource: dict[str, Any]


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON key-value list -> dict (each value is a one-key {"stringValue": ...} object)."""
    return {kv["key"]: next(iter(kv["value"].values()), None) for kv in items}


class Collector:
    """One collector on a loopback port; `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.file = workdir / "spans.jsonl"
        config = {
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{self.port}"}}}},
            "exporters": {
                "file": {"path": str(self.file), "format": "json", "flush_interval": "100ms"}
            },
            "service": {
                # no metrics port of its own: nothing listens but the receiver
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
            },
        }
        cfg = workdir / "otelcol.yaml"
        cfg.write_text(yaml.safe_dump(config))
        self.log = workdir / "otelcol.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(binary), f"--config={cfg}"], stdout=out, stderr=subprocess.STDOUT, cwd=workdir
            )
        eventually(self._listening, timeout=30, message="collector OTLP receiver listening")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"otelcol exited:\n{self.log.read_text()[-3000:]}")
        try:  # the OTLP/HTTP receiver answers 405 to a GET of its traces path
            urllib.request.urlopen(f"{self.endpoint}/v1/traces", timeout=2).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def text(self) -> str:
        """Everything the file exporter has written so far."""
        return self.file.read_text() if self.file.exists() else ""

    def spans(self) -> list[Span]:
        """Every span received so far, in the order the batches arrived."""
        out: list[Span] = []
        for line in self.text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                resource = _attributes(rs.get("resource", {}).get("attributes", []))
                for ss in rs.get("scopeSpans", []):
                    for s in ss.get("spans", []):
                        status = s.get("status", {})
                        out.append(
                            Span(
                                trace_id=s["traceId"],
                                span_id=s["spanId"],
                                parent_id=s.get("parentSpanId", ""),
                                name=s["name"],
                                attributes=_attributes(s.get("attributes", [])),
                                status_code=int(status.get("code", 0)),
                                status_message=status.get("message", ""),
                                resource=resource,
                            )
                        )
        return out

    def stop(self) -> None:
        """Terminate and reap the collector (it flushes its file on the way out)."""
        stop_process(self.proc, timeout=10)


class BlackHole:
    """A loopback port that accepts connections and reads every byte, and never answers."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.received = 0
        """Bytes swallowed so far (a test waits for some: an export is in flight)."""
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name="blackhole").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    def _swallow(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                with self._lock:
                    self.received += len(chunk)

    def close(self) -> None:
        """Close the listener and every connection it accepted."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
