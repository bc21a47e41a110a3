"""The hot path before and after an optimisation, measured side by side in one run.

Each version of `projector/` (a git commit, or the working tree) runs the same `plan()` timing
in its own subprocess; versions alternate round by round, so machine noise hits both alike.

    python -m benchmarks.before_after <before-commit> [<after-commit>]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, summary, write_result

SNIPPET = """
import json, statistics, time
from benchmarks.hotpath import world
from projector.core import reconcile

def once(snap):
    t = time.perf_counter()
    reconcile.plan(snap)
    return time.perf_counter() - t

out = {}
for n in (1000, 10000):
    for in_sync in (True, False):
        snap = world(n, in_sync=in_sync)
        once(snap)  # warm up
        sec = statistics.median(once(snap) for _ in range(7))
        out[("in_sync_" if in_sync else "create_") + str(n)] = sec / n * 1e6
print(json.dumps(out))
"""


def export(commit: str, dest: Path) -> Path:
    """The `projector/` package of a commit, as files under dest."""
    blob = subprocess.run(
        ["git", "archive", "--format=tar", commit, "projector"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def measure(pythonpath: Path) -> dict[str, float]:
    env = {"PYTHONPATH": f"{pythonpath}:{REPO}", "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [sys.executable, "-c", SNIPPET],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=pythonpath,
    )
    return dict(json.loads(res.stdout))


def run(before: str, after: str | None = None, rounds: int = 5) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        versions = {"before": export(before, Path(tmp) / "before")}
        versions["after"] = export(after, Path(tmp) / "after") if after else REPO
        samples: dict[str, dict[str, list[float]]] = {v: {} for v in versions}
        for _ in range(rounds):
            for version, path in versions.items():
                for key, value in measure(path).items():
                    samples[version].setdefault(key, []).append(value)
    systems: dict[str, Any] = {
        f"{v} ({before if v == 'before' else after or 'working tree'})": {
            f"plan_per_namespace_{k}": summary(s, "us") for k, s in m.items()
        }
        for v, m in samples.items()
    }
    b, a = samples["before"], samples["after"]
    ratios = {
        f"after/before {k}": summary(a[k], "us")["median"] / summary(b[k], "us")["median"]
        for k in b
    }
    return write_result(
        "hotpath-before-after",
        {"before": before, "after": after or "worktree", "rounds": rounds},
        systems,
        ratios,
        out=REPO / ".local/before-after",  # an experiment: git history keeps it, not results/
    )


if __name__ == "__main__":
    print(run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
