"""``deploy/grafana/projector.json``: the operators' dashboard, as code (grafana-foundation-sdk).

The panels are data (`PANELS`): the integration test evaluates every query of every panel on a
real Prometheus scraping a real controller, and renders the main ones for docs/observability.md.
Queries use the template variables ``$datasource`` and ``$job``, and Grafana's
``$__rate_interval``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import heatmap, prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import prometheus as prom_models
from grafana_foundation_sdk.models.dashboard import DataSourceRef

J = '{job=~"$job"}'
"""The job selector every query carries."""
RI = "$__rate_interval"


def _quantile(q: str, metric: str) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{J}[{RI}])))"


def _rate(metric: str, by: str = "") -> str:
    """A counter's per-second rate over the selected jobs, summed (by the labels `by` names)."""
    rate = f"rate({metric}{J}[{RI}])"
    return f"sum by ({by}) ({rate})" if by else f"sum({rate})"


@dataclass(frozen=True)
class Query:
    """One PromQL expression and its legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """One panel: title, unit, queries; `heatmap` panels read bucket increases."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    heatmap: bool = False
    description: str = ""
    table: bool = False
    """An instant-query table (one row per series) instead of a time series."""


LATENCY = "projector_projection_latency_seconds"
FANOUT = "projector_fanout_latency_seconds"

PANELS: tuple[Panel, ...] = (
    Panel(
        "Projection latency (change observed -> copy written)",
        "s",
        (
            Query(_quantile("0.5", LATENCY), "p50"),
            Query(_quantile("0.9", LATENCY), "p90"),
            Query(_quantile("0.99", LATENCY), "p99"),
            Query(_quantile("0.99", FANOUT), "p99 last copy of a fan-out"),
        ),
        description="Points carry exemplars: a slow one links to the trace of its reconcile.",
    ),
    Panel(
        "Projection latency heatmap",
        "s",
        (Query(f"sum by (le) (increase({LATENCY}_bucket{J}[{RI}]))", "{{le}}"),),
        heatmap=True,
    ),
    Panel(
        "Projections per second",
        "ops",
        (Query(_rate(f"{LATENCY}_count"), "copies written/s"),),
    ),
    Panel(
        "Writes by action and result",
        "ops",
        (
            Query(
                _rate("projector_writes_total", "action, result"),
                "{{action}} {{result}}",
            ),
            Query(_rate("projector_status_writes_total"), "status"),
        ),
    ),
    Panel(
        "Errors: failed writes and reconciles",
        "ops",
        (
            Query(
                f'sum(rate(projector_writes_total{{job=~"$job",result="error"}}[{RI}]))',
                "failed writes/s",
            ),
            Query(
                "sum by (result) (rate(projector_reconcile_total"
                f'{{job=~"$job",result!="success"}}[{RI}]))',
                "reconciles {{result}}/s",
            ),
        ),
    ),
    Panel(
        "Reconcile duration",
        "s",
        (Query(_quantile("0.99", "projector_reconcile_duration_seconds"), "p99"),),
    ),
    Panel(
        "Queue depth",
        "short",
        (
            Query(f"sum(projector_queue_depth{J})", "ready"),
            Query(f"sum(projector_queue_waiting{J})", "debouncing or backing off"),
            Query(f"sum(projector_queue_processing{J})", "processing"),
        ),
    ),
    Panel(
        "Queue wait and longest running",
        "s",
        (
            Query(_quantile("0.99", "projector_queue_wait_seconds"), "wait p99"),
            Query(f"max(projector_queue_longest_running_seconds{J})", "longest running"),
        ),
    ),
    Panel(
        "Queue adds, coalesced, retries",
        "ops",
        (Query(_rate("projector_queue_events_total", "event"), "{{event}}"),),
    ),
    Panel(
        "Conflicts and denied namespaces",
        "short",
        (
            Query(
                "sum by (state) (projector_projections"
                '{job=~"$job",state=~"Conflict|GrantConflict|Denied"})',
                "{{state}}",
            ),
        ),
    ),
    Panel(
        "Projections by state",
        "short",
        (Query(f"sum by (state) (projector_projections{J})", "{{state}}"),),
    ),
    Panel(
        "Grants by readiness",
        "short",
        (Query(f"sum by (ready) (projector_grants{J})", "ready={{ready}}"),),
    ),
    Panel(
        "Leader and transitions",
        "short",
        (
            Query(f"sum(projector_leader{J})", "leaders"),
            Query(f"sum(increase(projector_leader_transitions_total{J}[1h]))", "transitions/1h"),
        ),
    ),
    Panel(
        "Informer freshness (seconds since the server was last heard)",
        "s",
        (
            Query(f"max by (kind) (projector_informer_seconds_since_activity{J})", "{{kind}}"),
            Query(f"max(projector_informer_stall_threshold_seconds{J})", "stall threshold"),
        ),
    ),
    Panel(
        "Informer events, relists, watch restarts",
        "ops",
        (
            Query(
                _rate("projector_informer_events_total", "kind, type"),
                "{{kind}} {{type}}",
            ),
        ),
    ),
    Panel(
        "API requests by verb and code",
        "reqps",
        (
            Query(
                _rate("projector_api_requests_total", "verb, code"),
                "{{verb}} {{code}}",
            ),
        ),
    ),
    Panel(
        "Grants not Ready, by name and reason",
        "short",
        (
            Query(
                'max by (grant, reason) (projector_grant_condition{job=~"$job",condition="Ready"})'
                " == 0",
                "{{grant}}: {{reason}}",
            ),
        ),
        description="Each grant whose Ready condition is False, with its reason (e.g. Conflict, "
        "Denied, SourceMissing); `projector explain GRANT` says why per namespace.",
        table=True,
    ),
    Panel(
        "Drift corrected",
        "short",
        (Query(f"sum(increase(projector_drift_corrections_total{J}[1h]))", "copies/1h"),),
    ),
    Panel(
        "Process CPU",
        "percentunit",
        (Query(_rate("process_cpu_seconds_total", "instance"), "{{instance}}"),),
    ),
    Panel(
        "Process memory (RSS)",
        "bytes",
        (Query(f"sum by (instance) (process_resident_memory_bytes{J})", "{{instance}}"),),
    ),
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _target(q: Query, ref: str, panel: Panel) -> prometheus.Dataquery:
    t = prometheus.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(ref)
    if panel.heatmap:
        return t.format(prom_models.PromQueryFormat.HEATMAP)
    if panel.table:
        return t.format(prom_models.PromQueryFormat.TABLE).instant()
    return t.exemplar(True)


def build() -> dict[str, Any]:
    """The dashboard model, as Grafana imports it."""
    d = (
        gd.Dashboard("projector")
        .uid("projector")
        .tags(["projector", "kubernetes"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            gd.QueryVariable("job")
            .label("Job")
            .datasource(DATASOURCE)
            .query("label_values(projector_reconcile_total, job)")
            .include_all(True)
            .multi(True)
            .all_value(".*")
        )
    )
    for i, p in enumerate(PANELS):
        builder: Any = (
            heatmap.Panel() if p.heatmap else table.Panel() if p.table else timeseries.Panel()
        )
        builder = builder.title(p.title).unit(p.unit).datasource(DATASOURCE).height(8).span(12)
        if p.description:
            builder = builder.description(p.description)
        for n, q in enumerate(p.queries):
            builder = builder.with_target(_target(q, chr(ord("A") + n), p))
        builder = builder.grid_pos(_grid(i))
        d = d.with_panel(builder)
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def _grid(i: int) -> Any:
    from grafana_foundation_sdk.models.dashboard import GridPos

    return GridPos(h=8, w=12, x=12 * (i % 2), y=8 * (i // 2))


def render() -> str:
    """The committed JSON."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"
