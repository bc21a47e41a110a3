"""`make demo` tells its story on the session's control plane and exits 0 only if every step
was observed, so the README's first command cannot rot."""

from __future__ import annotations

from pathlib import Path

from tests.bed.controlplane.plane import ControlPlane
from tests.bed.demo import NODE_STEPS
from tests.bed.launcher import run_module


def test_demo_story_is_observed_end_to_end(control_plane: ControlPlane, tmp_path: Path) -> None:
    result = run_module(
        "tests.bed.demo",
        "--root",
        control_plane.root,
        "--kubeconfig",
        tmp_path / "kubeconfig",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # Where a node can start (tests/node) the pod steps run too; where not, the demo says why.
    steps = 9 if "no node can start here" in result.stdout else 9 + NODE_STEPS
    assert f"all {steps} steps observed" in result.stdout, result.stdout[-3000:]
    assert "\033[" not in result.stdout  # no terminal: no colour codes
