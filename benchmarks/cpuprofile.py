"""Where a running controller's CPU goes: py-spy samples of a window, summed by component.

pyinstrument (`benchmarks.profile --profile`) times the whole run on the wall clock, start-up
included; this samples only the measured rounds and only while the process runs (py-spy leaves
out threads that wait), so the shares are shares of the CPU a copy write costs. The samples
are attributed to the innermost frame (self time) and grouped into components: each of
projector's modules, aiohttp, TLS, the event loop, metrics, JSON, and the rest. The samples of
the benchmark's own /metrics scrapes (between the rounds) are left out.
"""

from __future__ import annotations

import collections
import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RATE = 250
"""Samples per second. py-spy reads the process from outside without pausing it, which still
costs it some: 0.90 ms of CPU per copy write sampled, 0.81 unsampled (cpu-per-write)."""

_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*):\d+\)$")
_COMPONENTS = (
    ("aiohttp (HTTP client)", ("aiohttp/", "yarl/", "multidict/", "propcache/")),
    ("TLS", ("/ssl.py", "asyncio/sslproto.py")),  # asyncio's loop; uvloop's TLS is native
    ("event loop", ("asyncio/", "selectors.py", "uvloop/")),
    ("prometheus-client", ("prometheus_client/",)),
    ("JSON (orjson, json)", ("orjson", "json/")),
    ("structlog", ("structlog/",)),
)


_ENTRY_POINTS = frozenset({"<module>", "main"})
"""Frames under which the whole process runs: in every sample, so they say nothing."""


def py_spy() -> str:
    """The py-spy of this interpreter's venv (a dev dependency)."""
    found = Path(sys.executable).parent / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy") or "py-spy"


@contextlib.contextmanager
def sampled(pid: int, out: Path) -> Iterator[None]:
    """py-spy samples process `pid` into `out` (collapsed stacks) while the block runs."""
    args = ["--pid", str(pid), "--format", "raw", "--output", str(out), "--rate", str(RATE)]
    spy = subprocess.Popen(
        [py_spy(), "record", *args, "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        _, err = spy.communicate(timeout=60)
        if not out.exists():
            raise RuntimeError(f"py-spy wrote no samples: {err.decode()[-500:]}")


def component(path: str) -> str:
    """The component a source file belongs to: `projector/<module>`, a library, or other.

    A module is named without its room (`projector/control/writer.py` is `projector/writer`):
    module names are unique across the package.
    """
    if (m := re.search(r"projector/(?:\w+/)?(\w+)\.py$", path)) is not None:
        return f"projector/{m[1]}"
    for name, parts in _COMPONENTS:
        if any(p in path for p in parts):
            return name
    return "other (interpreter, libraries)"


def summarize(collapsed: str, top: int = 15) -> dict[str, Any]:
    """Self-time shares by component, and the inclusive shares of projector's functions."""
    by_component: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [m for f in stack.split(";") if (m := _FRAME.match(f))]
        if any(f["path"].endswith("projector/telemetry/endpoints.py") for f in frames):
            continue  # the benchmark's own /metrics scrapes, between the rounds
        n = int(count)
        total += n
        by_component[component(frames[-1]["path"]) if frames else "other (native)"] += n
        ours = {
            f"{f['func']} ({c})"
            for f in frames
            if (c := component(f["path"])).startswith("projector/")
            and f["func"] not in _ENTRY_POINTS
        }
        inclusive.update(dict.fromkeys(ours, n))
    if not total:
        raise ValueError("no samples")
    return {
        "samples": total,
        "rate_per_s": RATE,
        "self_by_component": [
            [name, round(100 * n / total, 1)] for name, n in by_component.most_common()
        ],
        "projector_inclusive": [
            [name, round(100 * n / total, 1)] for name, n in inclusive.most_common(top)
        ],
    }
