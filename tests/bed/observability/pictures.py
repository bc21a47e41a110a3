"""``docs/observability.md``: the dashboard's main panels as PNGs, drawn with matplotlib.

The data are the range queries that the real-Prometheus integration test collected; the page
also lists every panel query and alert expression with the value Prometheus returned.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Matrix = list[dict[str, Any]]
"""A range query's result: series of ``{"metric": {...}, "values": [[t, "v"], ...]}``."""

MAIN: dict[str, str] = {
    "Projection latency (change observed -> copy written)": "Low and flat under steady "
    "rotations; the burst's queueing and the copies held up by the outage stand out.",
    "Projection latency heatmap": "The same latencies, bucketed: the burst and the outage's "
    "late copies in the upper rows.",
    "Projections per second": "A steady trickle from the rotations, the burst's spike, nothing "
    "during the outage, a catch-up after it.",
    "Writes by action and result": "Creates for the burst's new grants, updates for every "
    "rotation, failed writes while the API server is away.",
    "Queue depth": "Keys piling up in the burst and backing off during the outage.",
    "Conflicts and denied namespaces": "The conflicting namespace, from the moment it appears "
    "until its Secret is removed.",
    "Informer freshness (seconds since the server was last heard)": "Climbing while the API "
    "server is away, back to near zero when it answers.",
    "Process memory (RSS)": "The controller's memory across the whole run.",
}
"""The panels drawn, by title."""


@dataclass(frozen=True)
class Event:
    """Something the scenario did, marked on every picture.

    A span (`end` > `start`) is shaded, an instant is a dashed line; seconds since the start.
    """

    start: float
    end: float
    label: str


def slug(title: str) -> str:
    """A file name for a panel."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48]


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def points(
    values: Sequence[tuple[float | str, str]], step: float, t0: float
) -> list[tuple[float, float]]:
    """A series' samples as (seconds since t0, value).

    A NaN goes where samples are missing (more than a step apart), so the line breaks there
    instead of bridging the gap.
    """
    out: list[tuple[float, float]] = []
    for t, v in values:
        x = float(t) - t0
        if out and x - out[-1][0] > 1.5 * step:
            out.append((out[-1][0] + step, math.nan))
        out.append((x, float(v)))
    return out


def carries_data(pts: Sequence[tuple[float, float]]) -> bool:
    """A series worth a legend entry: some sample is a number other than zero."""
    return any(not math.isnan(y) and y != 0 for _, y in pts)


def draw(
    title: str,
    unit: str,
    series: Sequence[tuple[str, Matrix]],
    out: Path,
    *,
    heatmap: bool = False,
    t0: float,
    step: float = 1.0,
    events: Sequence[Event] = (),
) -> None:
    """One panel to one PNG: lines per series, or a heatmap of bucket increases by ``le``.

    Series that never carry a value other than zero are left out (no line, no legend entry);
    the scenario's `events` are marked so a reader sees which one a change answers.
    """
    fig, ax = plt.subplots(figsize=(9, 3.4), dpi=90)
    if heatmap:
        rows = sorted(
            (float(s["metric"].get("le", "inf")), s) for _, m in series for s in m if s["values"]
        )
        times = sorted({float(t) for _, s in rows for t, _ in s["values"]})
        grid = [[0.0] * len(times) for _ in rows]
        index = {t: i for i, t in enumerate(times)}
        below = [0.0] * len(times)
        for r, (_, s) in enumerate(rows):
            cum = [0.0] * len(times)
            for t, v in s["values"]:
                cum[index[float(t)]] = float(v) if v != "NaN" else 0.0
            grid[r] = [max(0.0, c - b) for c, b in zip(cum, below, strict=True)]
            below = cum
        if times and rows:
            ax.imshow(
                grid,
                aspect="auto",
                origin="lower",
                cmap="viridis",
                extent=(times[0] - t0, times[-1] - t0, 0, len(rows)),
            )
            labels = ["+Inf" if math.isinf(le) else f"{le:g}" for le, _ in rows]
            ax.set_yticks([i + 0.5 for i in range(len(rows))], labels)
            ax.set_ylabel("le (s)")
    else:
        for legend, matrix in series:
            for s in matrix:
                pts = points(s["values"], step, t0)
                if carries_data(pts):
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, label=_legend(legend, s["metric"]) or legend)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
        ax.set_ylabel(unit)
    _mark(ax, events)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("seconds into the test")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def _mark(ax: Any, events: Sequence[Event]) -> None:
    top = ax.get_ylim()[1]
    for e in events:
        if e.end > e.start:
            ax.axvspan(e.start, e.end, color="grey", alpha=0.2, lw=0)
        else:
            ax.axvline(e.start, color="grey", ls="--", lw=0.8)
        ax.text(e.start, top, e.label, fontsize=6, va="top", ha="left", rotation=90, color="0.3")


def image(title: str) -> str:
    """Where a panel's picture lives, relative to docs/."""
    return f"img/observability/{slug(title)}.png"


SCRAPING = """## Scraping metrics

`/metrics` has a port of its own, 8443 (`--metrics-port`, the chart's `service.port`), and is
served over HTTPS to a bearer token only: the controller asks the API server whose token it is
(a TokenReview) and whether that user may `get` the non-resource URL `/metrics` (a
SubjectAccessReview), as controller-runtime's secure metrics and kube-rbac-proxy do. No token
or an unknown one: 401; a token not allowed: 403. The chart ships the ClusterRole
`<release>-metrics-reader` (`nonResourceURLs: [/metrics]`, `get`): bind a scraper's
ServiceAccount to it (`metrics.readers`), and the ServiceMonitor (`metrics.serviceMonitor`)
scrapes with the Prometheus pod's own token. The certificate is made at each start and signed
by itself, unless `metrics.certSecret` names a TLS Secret (`--metrics-cert-dir`); a scraper
skips verifying the self-signed one (`insecureSkipVerify`): what it may read rests on its token.
A verdict is remembered for a minute (by the token's SHA-256, at most 1,024 of them), so a
scraper costs two reviews a minute; the reviews have a client session of their own, limited to
10 a second, and at most 8 new tokens are reviewed at once (429 beyond), so a flood of tokens
never takes the controller's write budget. `/healthz` and `/readyz` stay plain HTTP on 8080
(`--http-port`, `probes.port`) for the kubelet. `metrics.secure: false`
(`--no-metrics-secure`) serves `/metrics` in plain HTTP to whoever reaches the port, and the
chart then grants no reviews and ships no metrics-reader role.

By hand, and as a scrape config without the operator (the real-Prometheus test scrapes so):

```sh
kubectl -n projector-system port-forward svc/projector-metrics 8443 &
curl -sk -H "Authorization: Bearer $(kubectl -n monitoring create token prometheus)" \\
  https://127.0.0.1:8443/metrics
```

```yaml
- job_name: projector
  scheme: https
  authorization:
    credentials_file: /var/run/secrets/kubernetes.io/serviceaccount/token
  tls_config:
    insecure_skip_verify: true
  kubernetes_sd_configs: [{role: endpoints, namespaces: {names: [projector-system]}}]
  relabel_configs:
    - source_labels: [__meta_kubernetes_service_name, __meta_kubernetes_endpoint_port_name]
      regex: projector-metrics;metrics
      action: keep
```
"""
"""How /metrics is read: written here, since the page is drawn anew by each run."""


def page(images: Sequence[tuple[str, str]], values: Sequence[tuple[str, str, str]]) -> str:
    """The Markdown of docs/observability.md: pictures first, then every query and its value."""
    lines = [
        "# Observability: what the dashboard shows",
        "",
        "The pictures are drawn by `tests/integration/test_observability.py` (its long",
        "scenario, `make observability-docs`) from range queries to a real Prometheus (built",
        "from its Go module) that scraped a real controller every few seconds for several",
        "minutes while it projected against the real API server: steady rotations of one",
        "source throughout, a burst (many grants created at once, then their sources rotated",
        "together), a conflict (a namespace already holding a Secret of the copy's name) and",
        "its resolution, and an API server outage in the middle of a fan-out and its recovery.",
        "Each event is marked on every picture (the outage shaded); a legend lists only the",
        "series that carried a value other than zero. The dashboard itself is",
        "`deploy/grafana/projector.json`; the metrics are described in `docs/metrics.md`; the",
        "alerts and what to do about them in `docs/runbook.md`.",
        "",
        *SCRAPING.splitlines(),
        "",
    ]
    for title, path in images:
        lines += [f"## {title}", "", MAIN.get(title, ""), "", f"![{title}]({path})", ""]
    lines += [
        "## Every panel query and alert expression, as evaluated on a real Prometheus",
        "",
        "From the short test in the same file (run by `make test`: a fan-out with a conflict,",
        "a denied namespace and refused writes, then a frozen connection and a stopped",
        "controller). `$job` = `projector`, `$__rate_interval` = `1m`. A value is the instant",
        "query's result, rounded: one series, its value; several, how many and the largest",
        "(with its labels).",
        "An alert's value is its expression's (empty: no series, not firing; every rule also",
        "reported `health: ok` on Prometheus' rules API). Recording rules are listed with theirs.",
        "",
        "| where | query | value |",
        "|---|---|---|",
    ]
    for where, expr, value in values:
        one = " ".join(expr.split()).replace("|", "\\|")
        lines.append(f"| {where} | `{one}` | {value} |")
    return "\n".join(lines) + "\n"
