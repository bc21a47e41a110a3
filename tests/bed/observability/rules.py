"""The alert rules: one source for ``deploy/prometheus/``, and the chart's PrometheusRule.

Rendered three ways from the same groups: ``deploy/prometheus/rules.yaml`` (a Prometheus rule
file) and ``deploy/prometheus/prometheusrule.yaml`` with the default job selector and runbook
base, and ``deploy/helm/projector/files/prometheus-rules.yaml`` with the tokens ``JOB_TOKEN``
and ``RUNBOOK_TOKEN`` that the chart's ``templates/prometheusrule.yaml`` replaces with
``metrics.prometheusRule.selector`` and ``metrics.runbookBaseURL``: the chart ships exactly the
rules the real-Prometheus test evaluates (it renders them with ``helm template``).

Each alert names its section in ``docs/runbook.md`` (absolute ``runbook_url``). Aggregations
keep ``namespace`` and ``job``, so alerts can be routed by where projector runs. The latency
SLO: 99% of copies are written within 5 s of the change that caused them (bucket
``le="5.0"``); it pages on the multi-window burn rates of the SRE workbook (14.4x over 1 h and
5 m, 6x over 6 h and 30 m).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

SLO_TARGET = 0.99
"""Share of copies written within `SLO_SECONDS` of the change observed."""
SLO_SECONDS = "5.0"
"""The latency bucket (``le`` label, as prometheus_client writes it) the SLO counts."""
RUNBOOK = "https://github.com/nebari-dev/projector/blob/main/docs/runbook.md"
"""The default runbook base (the chart's ``metrics.runbookBaseURL``): docs/runbook.md."""
JOB = 'job="projector"'
"""The default job selector (the chart's ``metrics.prometheusRule.selector``)."""
JOB_TOKEN = "__PROJECTOR_JOB_SELECTOR__"
RUNBOOK_TOKEN = "__PROJECTOR_RUNBOOK_BASE_URL__"
_BY = "namespace, job"
"""What every aggregation keeps."""


def m(metric: str, matchers: str = "") -> str:
    """A selector of `metric` limited to projector's job (JOB_TOKEN until rendered)."""
    return f"{metric}{{{JOB_TOKEN}{',' + matchers if matchers else ''}}}"


WINDOWS = ("5m", "30m", "1h", "6h")


@dataclass(frozen=True)
class Alert:
    """One alerting rule; `runbook` is the anchor of its section in docs/runbook.md."""

    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    runbook: str


def _slow_ratio(window: str) -> str:
    bucket = m("projector_projection_latency_seconds_bucket", f'le="{SLO_SECONDS}"')
    count = m("projector_projection_latency_seconds_count")
    return (
        f"1 - (sum by ({_BY}) (rate({bucket}[{window}]))"
        f" / sum by ({_BY}) (rate({count}[{window}])))"
    )


RECORDS: tuple[tuple[str, str], ...] = tuple(
    (f"projector:projection_latency_slo_miss:ratio_rate{w}", _slow_ratio(w)) for w in WINDOWS
)
"""Recording rules: the share of copies slower than the SLO, per window."""

_BUDGET = f"{1 - SLO_TARGET:.2f}"
_ERROR = 'result="error"'
_CONFLICTED = 'state=~"Conflict|GrantConflict"'
_READY = 'condition="Ready"'
REVOCATION_SECONDS = "10.0"
"""The revocation bucket (``le``) past which a revoked copy counts as lagging."""


def _lagging_revocations() -> str:
    bucket = m("projector_revocation_seconds_bucket", f'le="{REVOCATION_SECONDS}"')
    count = m("projector_revocation_seconds_count")
    return (
        f"1 - (sum by ({_BY}) (rate({bucket}[10m]))\n/ sum by ({_BY}) (rate({count}[10m]))) > 0.01"
    )


def _burn(long: str, short: str, factor: str) -> str:
    return (
        f"projector:projection_latency_slo_miss:ratio_rate{long} > ({factor} * {_BUDGET})\n"
        f"and\nprojector:projection_latency_slo_miss:ratio_rate{short} > ({factor} * {_BUDGET})"
    )


ALERTS: tuple[Alert, ...] = (
    Alert(
        "ProjectorLatencySLOBurnFast",
        _burn("1h", "5m", "14.4"),
        "2m",
        "critical",
        "Projection latency burns the error budget 14.4x too fast (1h and 5m windows).",
        "projectorlatencysloburn",
    ),
    Alert(
        "ProjectorLatencySLOBurnSlow",
        _burn("6h", "30m", "6"),
        "15m",
        "warning",
        "Projection latency burns the error budget 6x too fast (6h and 30m windows).",
        "projectorlatencysloburn",
    ),
    Alert(
        "ProjectorWriteErrors",
        f"sum by ({_BY}) (rate({m('projector_writes_total', _ERROR)}[10m]))\n"
        f"/ sum by ({_BY}) (rate({m('projector_writes_total')}[10m])) > 0.05",
        "10m",
        "warning",
        "More than 5% of copy writes fail.",
        "projectorwriteerrors",
    ),
    Alert(
        "ProjectorRevocationsLagging",
        _lagging_revocations(),
        "1m",
        "warning",
        "More than 1% of revoked copies were deleted over 10 s after consent was withdrawn.",
        "projectorrevocationslagging",
    ),
    Alert(
        "ProjectorNoLeader",
        f"(max({m('projector_leader')}) or vector(0)) < 1",
        "1m",
        "critical",
        "No projector replica has led for over a minute: nothing is projected.",
        "projectornoleader",
    ),
    Alert(
        "ProjectorInformerStalled",
        f"max by ({_BY}, instance, kind) ({m('projector_informer_seconds_since_activity')})\n"
        f"> on ({_BY}, instance) group_left ()\n"
        f"max by ({_BY}, instance) ({m('projector_informer_stall_threshold_seconds')})",
        "0s",
        "critical",
        "Informer {{ $labels.kind }} has heard nothing from the API server for"
        " {{ $value | humanizeDuration }}.",
        "projectorinformerstalled",
    ),
    Alert(
        "ProjectorConflicts",
        f"sum by ({_BY}) ({m('projector_projections', _CONFLICTED)}) > 0",
        "15m",
        "warning",
        "{{ $value }} target namespaces hold a Secret projector may not overwrite.",
        "projectorconflicts",
    ),
    Alert(
        "ProjectorGrantsNotReady",
        f"max by ({_BY}, grant, reason) ({m('projector_grant_condition', _READY)}) == 0",
        "15m",
        "warning",
        "ProjectionGrant {{ $labels.grant }} is not Ready: {{ $labels.reason }}.",
        "projectorgrantsnotready",
    ),
)


DESCRIPTIONS: dict[str, str] = {
    "ProjectorLatencySLOBurnFast": "More than 1% of copies took over 5 s to land, fast enough to "
    "spend a month's error budget in about two days. Look at queue wait, API request codes "
    "(429s) and the largest fan-outs.",
    "ProjectorLatencySLOBurnSlow": "More than 1% of copies took over 5 s to land, fast enough to "
    "spend a month's error budget in about five days.",
    "ProjectorWriteErrors": "Copy writes fail after the writer's retries; the failing grants' "
    "status and Events name the namespace and the API server's answer (403 RBAC or admission, "
    "422 invalid, 5xx server).",
    "ProjectorRevocationsLagging": "A namespace kept a copy after its grant, export or label "
    "was withdrawn: its tenants could read the Secret for that long. Look at queue wait, API "
    "request codes (429s) and failing deletes.",
    "ProjectorNoLeader": "No grant is reconciled and copies no longer follow their sources. "
    "Replicas campaign again by themselves once the API server answers; look for failed "
    "lease campaign attempts in their logs.",
    "ProjectorInformerStalled": "Changes of this kind are not seen, so copies go stale; "
    "reconnecting on the read deadline has not helped.",
    "ProjectorConflicts": "A Secret projector does not own holds a copy's name (or two grants "
    "claim one); the consumer there does not get the contract Secret until it is moved.",
    "ProjectorGrantsNotReady": "`projector explain {{ $labels.grant }}` says why per namespace; "
    "the grant's status and Events say the same.",
}
"""One more sentence per alert, for the notification (``description``)."""
GRAFANA_TOKEN = "__PROJECTOR_GRAFANA_URL__"
DASHBOARD = "/d/projector/projector"
"""The dashboard's path under Grafana (its uid is ``projector``); ``dashboard_url`` is the
chart's ``metrics.grafanaURL`` (empty by default: a path relative to Grafana) plus this."""


def groups(job: str = JOB, runbook: str = RUNBOOK, grafana: str = "") -> list[dict[str, Any]]:
    """The rule groups, as Prometheus' rule file holds them, for a job selector and a runbook."""

    def fill(text: str) -> str:
        return text.replace(JOB_TOKEN, job)

    records = [{"record": name, "expr": fill(expr)} for name, expr in RECORDS]
    alerts = [
        {
            "alert": a.name,
            "expr": fill(a.expr),
            **({"for": a.for_} if a.for_ != "0s" else {}),
            "labels": {"severity": a.severity},
            "annotations": {
                "summary": a.summary,
                "description": DESCRIPTIONS[a.name],
                "runbook_url": f"{runbook}#{a.runbook}",
                "dashboard_url": f"{grafana}{DASHBOARD}",
            },
        }
        for a in ALERTS
    ]
    return [
        {"name": "projector.slo", "rules": records},
        {"name": "projector.alerts", "rules": alerts},
    ]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # A token the chart replaces stays in a literal block, so whatever replaces it (quotes,
    # colons, a URL) needs no YAML quoting.
    literal = "\n" in value or any(t in value for t in (JOB_TOKEN, RUNBOOK_TOKEN, GRAFANA_TOKEN))
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if literal else None)


_Dumper.add_representer(str, _str)

_NOTE = "# Generated by `make generate` (tests/bed/observability/rules.py): do not edit.\n"


def rules_yaml() -> str:
    """``deploy/prometheus/rules.yaml``."""
    return _NOTE + yaml.dump({"groups": groups()}, Dumper=_Dumper, sort_keys=False, width=1000)


def chart_rules_yaml() -> str:
    """The chart's ``files/prometheus-rules.yaml``: the groups with its tokens.

    ``templates/prometheusrule.yaml`` replaces them with the job selector and runbook base.
    """
    doc = {"groups": groups(JOB_TOKEN, RUNBOOK_TOKEN, GRAFANA_TOKEN)}
    return _NOTE + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)


def prometheus_rule_yaml() -> str:
    """The same groups as a Prometheus Operator ``PrometheusRule``."""
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "projector",
            "namespace": "projector-system",
            "labels": {"app.kubernetes.io/name": "projector"},
        },
        "spec": {"groups": groups()},
    }
    return _NOTE + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)
