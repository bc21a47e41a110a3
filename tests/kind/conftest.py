"""The kind cluster for tests marked ``kind`` (tests/conftest.py skips them without Docker)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bed.controlplane.plane import REPO_ROOT

KIND_SH = REPO_ROOT / "tests" / "bed" / "kind" / "kind.sh"
KIND_KUBECONFIG = REPO_ROOT / ".local" / "kind-kubeconfig"
CLUSTER = "projector"


@pytest.fixture(scope="session")
def kind_kubeconfig() -> Iterator[Path]:
    """Reuse the developer's `make kind-up` cluster if there is one, else create and delete one."""
    build = subprocess.run(
        ["bash", str(KIND_SH), "build"], stdout=subprocess.PIPE, text=True, check=True
    )
    kind = build.stdout.strip().splitlines()[-1]
    clusters = subprocess.run(
        [kind, "get", "clusters"], stdout=subprocess.PIPE, text=True, check=True
    ).stdout.split()
    existed = CLUSTER in clusters
    subprocess.run(["bash", str(KIND_SH), "up"], check=True)
    yield KIND_KUBECONFIG
    if not existed:
        subprocess.run(["bash", str(KIND_SH), "down"], check=True)
