"""The docs keep up with the code: every metric is documented, every alert has a runbook entry."""

from __future__ import annotations

import re
from pathlib import Path

from projector.telemetry.metrics import Metrics
from projector.telemetry.metrictable import METRICS

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


def test_the_metrics_reference_has_each_row_of_the_table_and_the_table_is_the_registry() -> None:
    """docs/metrics.md says of each metric what `metrictable.METRICS` declares (name, type, label
    names, meaning), and the registry serves exactly the table's metrics, no more."""
    page = (DOCS / "metrics.md").read_text()
    rows = dict(re.findall(r"^\| `(projector_[a-z_]+)` \| (.*) \|$", page, re.M))
    assert set(rows) == {m.name for m in METRICS}
    for metric in METRICS:
        type_, labels, meaning = rows[metric.name].split(" | ", 2)
        assert type_ == metric.type, metric.name
        assert re.findall(r"`([a-z_]+)`", labels) == sorted(metric.labels), metric.name
        assert meaning == metric.help.replace("|", "\\|"), metric.name
    families = {f.name for f in Metrics().registry.collect() if f.name.startswith("projector_")}
    assert families == {m.family for m in METRICS}


def test_the_metrics_reference_names_every_metric_that_carries_a_grant_or_a_namespace() -> None:
    """The page's cardinality note lists exactly the metrics with a `grant` or `namespace` label."""
    head = (DOCS / "metrics.md").read_text().split("| metric |", 1)[0]
    for label in ("grant", "namespace"):
        sentence = re.search(rf"A {label}[^:]* is a label only of ([^:]*?)(?::|, for)", head)
        assert sentence, label
        named = set(re.findall(r"`(projector_[a-z_]+)`", sentence.group(1)))
        assert named == {m.name for m in METRICS if label in m.labels}, label


def test_the_chart_ships_the_generated_rules_and_dashboard_and_one_runbook() -> None:
    """No hand-written copies: the chart's PrometheusRule and dashboard read the files that
    observability/ generates (tests/unit/test_generated.py keeps them current), and alerts are
    explained in one place, docs/runbook.md (tests/unit/test_generated.py: one section each)."""
    chart = REPO / "deploy/helm/projector"
    template = (chart / "templates/prometheusrule.yaml").read_text()
    assert '.Files.Get "files/prometheus-rules.yaml"' in template
    assert "alert:" not in template and "expr:" not in template
    dashboard = (chart / "templates/dashboard.yaml").read_text()
    assert '.Files.Get "dashboards/projector.json"' in dashboard
    assert (chart / "dashboards/projector.json").read_text() == (
        REPO / "deploy/grafana/projector.json"
    ).read_text()
    operations = (DOCS / "operations.md").read_text()
    assert "Projector" not in "".join(re.findall(r"^#+ .*$", operations, re.M))


def test_every_page_of_the_docs_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages and all(f": {p}" in nav for p in pages), pages
