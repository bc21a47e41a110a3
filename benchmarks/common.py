"""Shared benchmark plumbing: timing statistics, machine facts, and the result file format.

Every benchmark writes `<out>/<name>.json`, where out is `benchmarks/results/` for the full
size (the committed numbers of docs/benchmarks.md), `benchmarks/results-quick/` for quick, and
any folder given with --out (tiny requires one):
{name, parameters, systems: {system: {metric: {value, unit, samples, ...}}}, ratios, machine,
commit, date}. Statistics are medians and percentiles over repeated samples (this machine is
shared and noisy), never single runs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

FLOOR_SAME = "floor (projector's copy bodies)"
"""The fan-out floor that PUTs projector's own copies (`benchmarks.e2e.FloorRun`): judged."""
SAME_RATIO = "projector/floor (same bodies) p50"
"""Projector's ratio to `FLOOR_SAME`, as a fan-out result file names it."""
MARKS_RATIO = "floor (same bodies)/floor p50"
"""`FLOOR_SAME` over the floor on minimal Secrets: what the copies' ownership marks cost."""


def process_cpu(pid: int) -> float:
    """Process CPU seconds (user + system, every thread) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; the sample itself if only one."""
    s = sorted(samples)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(samples: Sequence[float], unit: str) -> dict[str, Any]:
    """Median, p99, IQR, min, max and count of a set of samples."""
    return {
        "unit": unit,
        "samples": len(samples),
        "median": statistics.median(samples) if samples else float("nan"),
        "p99": percentile(samples, 99),
        "p25": percentile(samples, 25),
        "p75": percentile(samples, 75),
        "min": min(samples) if samples else float("nan"),
        "max": max(samples) if samples else float("nan"),
    }


def machine() -> dict[str, Any]:
    """Facts about where the numbers were measured."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_at_start": os.getloadavg(),
    }


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_result(
    name: str,
    parameters: dict[str, Any],
    systems: dict[str, Any],
    ratios: dict[str, Any] | None = None,
    out: Path = RESULTS,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write one benchmark's JSON result and return its path (`extra`: more top-level keys)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": name,
        "size": os.environ.get("PROJECTOR_BENCH_SIZE", ""),
        "parameters": parameters,
        "systems": systems,
        "ratios": ratios or {},
        "machine": machine(),
        "commit": commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path
