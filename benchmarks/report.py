"""Render docs/benchmarks.md and its PNG plots from benchmarks/results/*.json.

The report is regenerated from the JSON only, so every number in it can be traced to a file
that says when, where and at which commit it was measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks.common import REPO, RESULTS

DOCS = REPO / "docs"
PLOTS = DOCS / "benchmarks"


def load(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("*.json"))}


def fmt(v: Any, unit: str = "") -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        v = f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return f"{v} {unit}".strip()


def stat_row(system: str, metric: str, m: dict[str, Any]) -> str:
    if "median" in m:
        return (
            f"| {system} | {metric} | {fmt(m['median'], m['unit'])} | {fmt(m['p99'], m['unit'])}"
            f" | {fmt(m['p25'])} to {fmt(m['p75'])} | {m['samples']} |"
        )
    return f"| {system} | {metric} | {fmt(m['value'], m['unit'])} | | | 1 |"


def table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| system | metric | median (or value) | p99 | IQR | samples |",
        "|---|---|---|---|---|---|",
    ]
    for system, metrics in doc["systems"].items():
        for metric, m in metrics.items():
            lines.append(stat_row(system, metric, m))
    if doc.get("ratios"):
        lines += ["", "| ratio | value |", "|---|---|"]
        lines += [f"| {k} | {fmt(v)} |" for k, v in doc["ratios"].items()]
    return lines


def plot_bars(name: str, doc: dict[str, Any], metric: str, title: str) -> str:
    """Median bars with p99 whiskers, one per system."""
    systems = [(s, m[metric]) for s, m in doc["systems"].items() if metric in m]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(systems)))
    labels = [s for s, _ in systems]
    med = [m["median"] for _, m in systems]
    err = [[0] * len(systems), [m["p99"] - m["median"] for _, m in systems]]
    ax.barh(labels, med, xerr=err, color="#4477aa", capsize=4)
    ax.set_xlabel(f"{systems[0][1]['unit']} (bar: median, whisker: p99)")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    PLOTS.mkdir(parents=True, exist_ok=True)
    path = PLOTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![{title}](benchmarks/{path.name})"


def render(results: Path = RESULTS, target: Path = DOCS / "benchmarks.md", intro: str = "") -> Path:
    docs = load(results)
    out = ["# Benchmarks", "", intro.strip(), ""] if intro else ["# Benchmarks", ""]
    any_doc = next(iter(docs.values()), None)
    if any_doc:
        mach = any_doc["machine"]
        out += [
            f"Measured at commit `{any_doc['commit']}` on {any_doc['date'][:10]}: "
            f"{mach['cpus']} CPUs ({mach['cpu']}), {mach['memory_gib']} GiB, Python "
            f"{mach['python']}; load average at start {fmt(mach['load_avg_at_start'][0])}.",
            "",
        ]
    plots = {
        "fanout-100": "last_copy",
        "fanout-1000": "last_copy",
        "latency": "end_to_end",
        "burst": "writes_per_copy",
    }
    for name, doc in docs.items():
        out += [
            f"## {name}",
            "",
            "Parameters: " + ", ".join(f"{k}={v}" for k, v in doc["parameters"].items()),
            "",
        ]
        out += table(doc)
        if name in plots:
            out += ["", plot_bars(name, doc, plots[name], name)]
        out.append("")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(out) + "\n")
    return target


if __name__ == "__main__":
    print(render())
