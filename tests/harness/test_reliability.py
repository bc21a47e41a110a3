"""The fault recorder (tests/reliability.py): what it refuses, what it writes, what it renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import reliability

OBSERVED = {"deletes": 0, "missed_updates": 1, "converge_seconds": 2.25, "relists_seconds": 0.5}


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results dir of its own, and a session list of its own (never rendered into docs/)."""
    monkeypatch.setenv("PROJECTOR_RELIABILITY_RESULTS", str(tmp_path))
    monkeypatch.setattr(reliability, "session", [])
    return tmp_path


def test_a_record_without_the_three_required_measures_is_refused(results: Path) -> None:
    with pytest.raises(ValueError, match="converge_seconds"):
        reliability.record("x", injected="y", observed={"deletes": 0, "missed_updates": 0})
    with pytest.raises(ValueError, match="deletes must be an int"):
        reliability.record("x", injected="y", observed={**OBSERVED, "deletes": "none"})
    assert list(results.iterdir()) == [] and reliability.session == []


def test_records_round_trip_and_render_a_row_and_a_section_each(results: Path) -> None:
    path = reliability.record("Disk (full) at 99%", injected="dd", observed=OBSERVED)
    reliability.record("Another fault", injected="kill", observed={**OBSERVED, "deletes": 3})
    assert path.parent == results
    loaded = reliability.load(results)
    assert [r.fault for r in loaded] == ["Another fault", "Disk (full) at 99%"]
    assert loaded == sorted(reliability.session, key=lambda r: r.fault)
    assert loaded[1].test.endswith("test_records_round_trip_and_render_a_row_and_a_section_each")
    page = reliability.render(loaded)
    assert "| [Disk (full) at 99%](#disk-full-at-99) | 0 | 1 | 2.2 s |" in page
    assert "| [Another fault](#another-fault) | 3 | 1 | 2.2 s |" in page
    assert "## Disk (full) at 99%" in page and "**Injected:** dd" in page
    assert "- time to converge: 2.2 s" in page and "- relists: 0.5 s" in page
