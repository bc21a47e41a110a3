"""The one launcher of `projector run` subprocesses: integration tests, the demo, benchmarks.

Each starts the real controller as a process on two free loopback ports, reads its /readyz
(plain HTTP) and /metrics, and stops it with a signal; OTEL_* variables are dropped so no test
exports spans unless it passes its own (`env`). Given a scraper's bearer token, the controller
serves /metrics as the chart ships it (HTTPS, reviewed tokens only) and the launcher reads it
with that token; without one, over plain HTTP (`--no-metrics-secure`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.bed.controlplane.plane import free_ports, proc_stat

REPO = Path(__file__).resolve().parents[2]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Every sample of a /metrics page, keyed by (name, sorted labels)."""


@dataclass
class ControllerProcess:
    """One `projector run` subprocess, with its log file and HTTP ports."""

    proc: subprocess.Popen[bytes]
    port: int
    """/healthz and /readyz, plain HTTP."""
    log: Path
    started: float
    """time.monotonic() just before the process was spawned."""
    answered: float | None = None
    """time.monotonic() when /readyz first answered, ready or not (`ready()` notes it): its
    probe port is open, so the process has started and its informers are listing."""
    stopped: bool = False
    """stop() was called: how the process ended is the caller's to check."""
    metrics_port: int = 0
    """/metrics: HTTPS if `metrics_token`, else plain HTTP."""
    metrics_token: str | None = None
    """A scraper's bearer token, allowed to read /metrics (None: the port is plain HTTP)."""

    @property
    def metrics_url(self) -> str:
        """The URL of its /metrics."""
        scheme = "http" if self.metrics_token is None else "https"
        return f"{scheme}://127.0.0.1:{self.metrics_port}/metrics"

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        """GET a path: (status, body); (0, "") if nothing answers.

        /metrics from the metrics port, with the scraper's token; the rest from the probes' port.
        """
        if path.startswith("/metrics"):
            url = self.metrics_url + path.removeprefix("/metrics")
            token = {"Authorization": f"Bearer {self.metrics_token}"} if self.metrics_token else {}
            headers = token | dict(headers or {})
        else:
            url = f"http://127.0.0.1:{self.port}{path}"
        request = urllib.request.Request(url, headers=dict(headers or {}))
        tls = unverified_tls() if url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=5, context=tls) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        """/readyz answers 200; raises, with the log's tail, if the process has exited."""
        if self.proc.poll() is not None:
            raise AssertionError(
                f"controller exited {self.proc.returncode}:\n{self.logs()[-3000:]}"
            )
        status = self.get("/readyz")[0]
        if status and self.answered is None:
            self.answered = time.monotonic()
        return status == 200

    def metrics(self) -> Samples:
        out: Samples = {}
        for fam in text_string_to_metric_families(self.get("/metrics")[1]):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        return sum(
            v
            for (n, ls), v in self.metrics().items()
            if n == name and all((k, val) in ls for k, val in labels.items())
        )

    def idle(self) -> bool:
        """Every change this controller has seen is acted on: no key ready, processing,
        debouncing or backing off (a conflict's periodic recheck may still be scheduled).

        Idle alone proves nothing about a given action; pair it with a sign that the action
        was seen or done (`reconciled`, a grant's observedGeneration, a metric that moved).
        """
        m = self.metrics()
        gauges = (
            "projector_queue_depth",
            "projector_queue_processing",
            "projector_queue_debouncing",
            "projector_queue_backoff_keys",
        )
        return all(m.get((g, ()), 1) == 0 for g in gauges)

    def reconciled(self, grant: str, result: str | None = None) -> int:
        """How many reconciles of `grant` (with `result`, e.g. "requeue") have ended, from the
        debug log line each one writes."""
        n = 0
        for line in self.logs().splitlines():
            if '"reconcile ended"' not in line:
                continue
            entry = json.loads(line)
            n += (
                entry.get("event") == "reconcile ended"
                and entry.get("grant") == grant
                and result in (None, entry.get("result"))
            )
        return n

    def writes(self) -> float:
        """Every write the controller made: copies and grant statuses."""
        ok = self.metric("projector_writes_total", result="ok")
        return ok + self.metric("projector_status_writes_total")

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def _status_mib(self, field: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def rss_mib(self) -> float:
        """Resident memory now."""
        return self._status_mib("VmRSS")

    def peak_rss_mib(self) -> float:
        """The highest resident memory since the process started (VmHWM): what an OOM kill
        of a container limit would have seen, however briefly it lasted."""
        return self._status_mib("VmHWM")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal it and wait; kill it if it does not exit in time. Returns the exit code."""
        self.stopped = True
        return stop_process(self.proc, sig, timeout)


@functools.cache
def unverified_tls() -> ssl.SSLContext:
    """TLS that accepts the controller's self-signed certificate, as the chart's ServiceMonitor
    does (`insecureSkipVerify`): what a scraper may read rests on its token."""
    return ssl._create_unverified_context()


def stop_process(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 20.0
) -> int:
    """Signal a child and reap it; SIGKILL if it does not exit in time (a test never leaves one
    behind). Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def launch(
    kubeconfig: Path,
    log: Path,
    *extra: str,
    python: str = sys.executable,
    leader_elect: bool = False,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
    metrics_token: str | None = None,
) -> ControllerProcess:
    """Start `projector run` against `kubeconfig` on free loopback ports, logging to `log`.

    One replica runs with `--no-leader-elect` unless `leader_elect` (then it is one of several).
    `env` is added to the environment (e.g. OTEL_EXPORTER_OTLP_ENDPOINT of a test's collector).
    `prefix` goes between the interpreter and `-m projector` (a profiler's `-m pyinstrument ...`).
    `metrics_token`: a scraper's token, and /metrics is served as shipped (HTTPS, reviewed
    tokens); None: `--no-metrics-secure`, plain HTTP.
    """
    port, metrics_port = free_ports(2)
    args = [
        python,
        *prefix,
        "-m",
        "projector",
        "run",
        f"--kubeconfig={kubeconfig}",
        f"--http-port={port}",
        f"--metrics-port={metrics_port}",
        "--http-host=127.0.0.1",
        *(["--no-metrics-secure"] if metrics_token is None else []),
        *([] if leader_elect else ["--no-leader-elect"]),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | dict(env or {})
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return ControllerProcess(
        proc, port, log, started, metrics_port=metrics_port, metrics_token=metrics_token
    )


def validate(*args: Path | str) -> subprocess.CompletedProcess[str]:
    """Run `projector validate ARGS...` from the repository; its output, exit code not checked."""
    return _cli("validate", *args)


def explain(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `projector explain ARGS...` against a cluster; its output, exit code not checked."""
    return _cli("explain", *args, f"--kubeconfig={kubeconfig}")


def _cli(*args: Path | str) -> subprocess.CompletedProcess[str]:
    return run_module("projector", *args)


def run_module(
    module: str, *args: Path | str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m MODULE ARGS...` from the repository, as a user would; its output, exit code
    not checked (the test says what it expects).

    Past `timeout` the module is killed with every process it started (a benchmark's
    controllers and peers, in sessions of their own too): none outlives it to write into the
    plane the next tests share.
    """
    argv = [sys.executable, "-m", module, *map(str, args)]
    with subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()  # not its pipes: one started since may hold them
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, read from /proc (children before their own)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        if (stat := proc_stat(int(entry.name))) is not None:
            parents.setdefault(stat.ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found
