"""``docs/observability.md``: the dashboard's main panels as PNGs, drawn with matplotlib.

The data are the range queries that the real-Prometheus integration test collected; the page
also lists every panel query and alert expression with the value Prometheus returned.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Matrix = list[dict[str, Any]]
"""A range query's result: series of ``{"metric": {...}, "values": [[t, "v"], ...]}``."""

MAIN = (
    "Projection latency (change observed -> copy written)",
    "Projection latency heatmap",
    "Projections per second",
    "Writes by action and result",
    "Queue depth",
    "Conflicts and denied namespaces",
    "Informer freshness (seconds since the server was last heard)",
    "Process memory (RSS)",
)
"""The panels drawn, by title."""


def slug(title: str) -> str:
    """A file name for a panel."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48]


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def draw(
    title: str,
    unit: str,
    series: Sequence[tuple[str, Matrix]],
    out: Path,
    *,
    heatmap: bool = False,
    t0: float,
) -> None:
    """One panel to one PNG: lines per series, or a heatmap of bucket increases by ``le``."""
    fig, ax = plt.subplots(figsize=(7, 3), dpi=90)
    if heatmap:
        rows = sorted(
            (float(s["metric"].get("le", "inf")), s) for _, m in series for s in m if s["values"]
        )
        rows = [(le, s) for le, s in rows if not math.isinf(le)]
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
            ax.set_yticks([i + 0.5 for i in range(len(rows))], [f"{le:g}" for le, _ in rows])
            ax.set_ylabel("le (s)")
    else:
        for legend, matrix in series:
            for s in matrix:
                pts = [(float(t) - t0, float(v)) for t, v in s["values"] if v not in ("NaN",)]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, label=_legend(legend, s["metric"]) or legend)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
        ax.set_ylabel(unit)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("seconds into the test")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def page(images: Sequence[tuple[str, str]], values: Sequence[tuple[str, str, str]]) -> str:
    """The Markdown of docs/observability.md: pictures first, then every query and its value."""
    lines = [
        "# Observability: what the dashboard shows",
        "",
        "Drawn by `tests/integration/test_observability.py` from range queries to a real",
        "Prometheus (built from its Go module) that scraped a real controller projecting against",
        "the real API server, then stalled its informers on purpose (the freshness panel's last",
        "seconds). Regenerate with `make observability-docs`. The dashboard itself is",
        "`deploy/grafana/projector.json`; the metrics are described in `docs/metrics.md`; the",
        "alerts and what to do about them in `docs/runbook.md`.",
        "",
    ]
    for title, path in images:
        lines += [f"## {title}", "", f"![{title}]({path})", ""]
    lines += [
        "## Every panel query and alert expression, as evaluated in that test",
        "",
        "`$job` = `projector`, `$__rate_interval` = `1m`. A value is the instant query's result,",
        "rounded: one series, its value; several, how many and the largest (with its labels).",
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
