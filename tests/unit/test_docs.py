"""The docs keep up with the code: every metric is documented, every alert has a runbook entry."""

from __future__ import annotations

import re
from pathlib import Path

from projector.telemetry import Metrics

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_every_metric_is_in_the_metrics_reference() -> None:
    page = (DOCS / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(projector_[a-z_]+)` \|", page, re.M))
    served = set()
    for family in Metrics().registry.collect():
        if family.name.startswith("projector_"):  # the process_* ones are the client library's
            served.add(family.name + ("_total" if family.type == "counter" else ""))
    assert served and documented == served


def test_every_alert_has_a_runbook_section() -> None:
    rules = (REPO / "deploy/helm/projector/templates/prometheusrule.yaml").read_text()
    runbook = (DOCS / "operations.md").read_text()
    sections = set(re.findall(r"^### (.+)$", runbook, re.M))
    named = re.findall(r'runbook: Operations runbook, "([^"]+)"', rules)
    assert len(named) == len(re.findall(r"- alert: ", rules))
    assert set(named) <= sections, set(named) - sections


def test_every_page_of_the_docs_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages and all(f": {p}" in nav for p in pages), pages
