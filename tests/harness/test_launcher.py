"""`run_module` past its timeout leaves nothing running: a benchmark killed there once left its
controller writing into the plane the next tests shared, and five of them failed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.bed.controlplane.plane import proc_stat
from tests.bed.kube import eventually
from tests.bed.launcher import run_module


def test_a_module_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("tests.harness.hung", pidfile, timeout=5)
    pid = int(pidfile.read_text())  # written within the 5 s, or the test says so here
    eventually(
        lambda: (stat := proc_stat(pid)) is None or stat.state in ("Z", "X"),
        timeout=10,
        message=f"process {pid} outlived the module that started it",
    )
