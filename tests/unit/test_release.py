"""The release's one version and its notes, without a registry (tests/bed/release).

`make release` packages the chart with pyproject.toml's version; these hold the checkout to it
too, so `helm install deploy/helm/projector` and `projector --version` say the same.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import projector
from tests.bed.controlplane.plane import REPO_ROOT
from tests.bed.helm import chart
from tests.bed.release import ReleaseError, notes, pin_image, previous, shallow, version_of


def test_the_version_has_one_place() -> None:
    version = version_of(REPO_ROOT)
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert meta["version"] == meta["appVersion"] == version == projector.__version__
    out = subprocess.run(
        [sys.executable, "-m", "projector", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"projector {version}"


def test_the_changelog_describes_the_version_and_refuses_an_undescribed_one() -> None:
    assert notes(version_of(REPO_ROOT)).startswith("### ")
    with pytest.raises(ReleaseError, match=r"no section for 9\.9\.9"):
        notes("9.9.9")


def test_the_previous_release_is_an_earlier_version_at_a_commit() -> None:
    if shallow():
        pytest.skip("a shallow clone: no history of the previous release")
    version, commit = previous()
    current = version_of(REPO_ROOT)
    assert tuple(map(int, version.split("."))) < tuple(map(int, current.split(".")))
    assert len(commit) == 40
    assert notes(version)  # every release the upgrade test installs is described


def test_pinning_the_image_rewrites_two_lines_and_keeps_every_comment(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    original = (chart.CHART / "values.yaml").read_text()
    values.write_text(original)
    pin_image(values, "127.0.0.1:5000/projector", "sha256:" + "a" * 64)
    pinned = values.read_text()
    parsed = yaml.safe_load(pinned)["image"]
    assert parsed["repository"] == "127.0.0.1:5000/projector"
    assert parsed["digest"] == "sha256:" + "a" * 64
    changed = [
        (a, b) for a, b in zip(original.splitlines(), pinned.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == 2, changed
