"""Every benchmark's code path runs at tiny sizes, so `make bench` never rots. The numbers
of this run mean nothing and are not checked; the result files' shape is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.controlplane.plane import ControlPlane
from tests.launcher import REPO

EXPECTED = {"hotpath", "fanout-5", "latency", "burst", "failover", "restart", "memory"}


def test_benchmarks_run_at_tiny_sizes(control_plane: ControlPlane, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "tiny",
            "--out",
            str(tmp_path),
            "--kubeconfig",
            str(control_plane.kubeconfig),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {p.stem for p in tmp_path.glob("*.json")} == EXPECTED
    for path in tmp_path.glob("*.json"):
        doc = json.loads(path.read_text())
        assert {"name", "parameters", "systems", "ratios", "machine", "commit", "date"} <= set(doc)
        assert doc["systems"], path
    burst = json.loads((tmp_path / "burst.json").read_text())
    assert burst["systems"]["projector"]["final_state_exact"]["value"] is True
    restart = json.loads((tmp_path / "restart.json").read_text())
    assert restart["systems"]["projector"]["writes_after_restart"]["value"] == 0
