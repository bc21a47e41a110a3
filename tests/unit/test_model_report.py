"""`make fuzz`'s section of docs/reliability.md: rendered from its summaries, spliced into the
page, and kept when `make reliability-docs` rewrites the rest."""

from __future__ import annotations

from pathlib import Path

from tests import reliability
from tests.model import report
from tests.model.driver import Stats


def summary() -> dict[str, object]:
    stats = Stats(runs=2, observations=10, place_checks=120, convergences=3)
    stats.ops.update({"GrantCreate": 4, "Kill": 1, "Converge": 3})
    stats.settled.update({"copy": 5, "absent": 31})
    return report.summary(stats, [1, 2], ["kill"], 40)


def test_the_section_is_spliced_in_and_replaced() -> None:
    section = report.render([summary()])
    assert "| runs (one seed each, a fresh universe and controller) | 2 |" in section
    assert "| operations that change the cluster | 5 |" in section
    page = report.splice("# Reliability\n\nrows\n", section)
    assert page.startswith("# Reliability\n\nrows\n\n" + report.BEGIN)
    again = report.splice(page + "after\n", report.render([summary(), summary()]))
    assert again.count(report.BEGIN) == 1 and again.endswith("after\n")
    assert "| runs (one seed each, a fresh universe and controller) | 4 |" in again


def test_make_reliability_docs_keeps_the_section(tmp_path: Path) -> None:
    doc = tmp_path / "reliability.md"
    doc.write_text(report.splice("old page\n", report.render([summary()])))
    reliability.write_doc([], doc)
    page = doc.read_text()
    assert "old page" not in page and page.startswith("# Reliability under faults")
    assert page.count(report.BEGIN) == 1 and page.rstrip().endswith(report.END)
