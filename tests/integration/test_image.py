"""The image recipe's rules, read from the Dockerfile.

The image itself is built and run on a real node by the node tier (tests/node/test_image.py:
`make image` with buildah where no Docker or Podman engine runs). What is proven here: the
Dockerfile's rules (base pinned by digest, numeric non-root user that matches the chart, the
venv from uv.lock with no dev dependencies, no build tools in the final stage), and that the
very venv the build stage makes (`uv sync --frozen --no-dev --no-editable`) runs the CLI, CRD
included, without any dev package.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.bed.launcher import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def stages() -> list[str]:
    lines = [x for x in DOCKERFILE.splitlines() if not x.lstrip().startswith("#")]
    text = "\n".join(lines)
    return re.split(r"^FROM ", text, flags=re.M)[1:]


def test_the_base_is_pinned_by_digest_and_the_user_is_numeric_and_the_charts() -> None:
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert base and re.fullmatch(r"python:3\.11[-\w.]*@sha256:[0-9a-f]{64}", base.group(1))
    assert all(s.startswith("${PYTHON_IMAGE}") for s in stages())
    final = stages()[-1]
    user = re.search(r"^USER (\d+):(\d+)$", final, re.M)
    assert user and int(user.group(1)) > 0
    values = yaml.safe_load((REPO / "deploy/helm/projector/values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(user.group(1))


def test_the_final_stage_has_the_venv_and_no_build_tools() -> None:
    build, final = stages()[0], stages()[-1]
    assert "uv sync --frozen --no-dev --no-install-project --no-editable" in build
    assert "uv sync --frozen --no-dev --no-editable" in build
    assert "COPY --from=build /app/.venv /app/.venv" in final
    for tool in ("uv ", "pip install", "apt-get", "gcc", "build-essential"):
        assert tool not in final, tool
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert ignored[1] == "*" and "!projector/" in ignored and "!uv.lock" in ignored


def test_the_runtime_venv_from_the_lock_runs_the_cli_without_dev_packages(
    tmp_path: Path,
) -> None:
    uv = REPO / ".local" / "tools" / "bin" / "uv"
    if not uv.exists():
        pytest.skip("uv is not installed in .local/tools (run `make install`)")
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run(
        [str(uv), "sync", "--frozen", "--no-dev", "--no-editable", "--quiet"],
        cwd=REPO,
        env=env,
        check=True,
        timeout=300,
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "projector" / "crd.yaml").is_file()
    for dev in ("pytest", "mypy", "ruff", "kubernetes", "mkdocs"):
        assert not (site / dev).exists(), dev
    result = subprocess.run(
        [str(venv / "bin" / "projector"), "validate", str(REPO / "grants")],
        cwd=tmp_path,  # not the checkout: the CRD must come from the installed package
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
