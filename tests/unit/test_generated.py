"""The generated operator files are current: the metrics reference, dashboard and alert rules."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.bed.observability import __main__ as generate
from tests.bed.observability import dashboard, rules

REPO = generate.REPO


@pytest.mark.parametrize("rel", sorted(generate.ARTEFACTS))
def test_committed_file_is_what_the_code_renders(rel: str) -> None:
    path = REPO / rel
    assert path.exists(), f"{rel} is missing: run `make generate`"
    assert path.read_text() == generate.ARTEFACTS[rel](), f"{rel} is stale: run `make generate`"


def test_metrics_reference_lists_every_projector_metric_of_the_registry() -> None:
    from projector.telemetry.metrics import Metrics

    page = (REPO / "docs/metrics.md").read_text()
    names = {f.name for f in Metrics().registry.collect() if f.name.startswith("projector_")}
    assert len(names) > 20
    for name in names:
        assert f"`{name}" in page, name


def test_no_label_names_a_namespace_secret_or_grant() -> None:
    from projector.cache.caches import Kind
    from projector.telemetry.metrics import Metrics

    metrics = Metrics()
    metrics.bind_informers([k.value for k in Kind], 1.0)
    metrics.grant_ready("g", False, [{"type": "Ready", "status": "False", "reason": "Denied"}])
    labels = {
        k
        for f in metrics.registry.collect()
        for s in f.samples
        for k in s.labels
        # grants are few and admin-created: by name; rollouts are per grant and namespace
        if f.name not in ("projector_grant_condition", "projector_rollouts")
    }
    assert not labels & {"namespace", "name", "secret", "grant"}, labels


def test_dashboard_has_the_datasource_and_job_variables_and_every_panel_queries_by_job() -> None:
    model = json.loads((REPO / "deploy/grafana/projector.json").read_text())
    assert [v["name"] for v in model["templating"]["list"]] == ["datasource", "job"]
    assert len(model["panels"]) == len(dashboard.PANELS)
    for panel in model["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert '{job=~"$job"' in target["expr"], target["expr"]


def test_every_alert_has_a_runbook_section() -> None:
    runbook = (REPO / "docs/runbook.md").read_text()
    anchors = {
        line.lstrip("#").strip().lower().replace(" ", "-")
        for line in runbook.splitlines()
        if line.startswith("## ")
    }
    for alert in rules.ALERTS:
        assert alert.runbook in anchors, f"docs/runbook.md has no section for {alert.name}"
    prom_rule = yaml.safe_load((REPO / "deploy/prometheus/prometheusrule.yaml").read_text())
    plain = yaml.safe_load((REPO / "deploy/prometheus/rules.yaml").read_text())
    assert prom_rule["kind"] == "PrometheusRule"
    assert prom_rule["spec"]["groups"] == plain["groups"]
