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
    scale = ""
    if min(med) > 0 and max(med) / min(med) > 20:  # a slow peer would flatten the others
        ax.set_xscale("log")
        scale = ", log scale"
    ax.set_xlabel(f"{systems[0][1]['unit']} (bar: median, whisker: p99{scale})")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    PLOTS.mkdir(parents=True, exist_ok=True)
    path = PLOTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![{title}](benchmarks/{path.name})"


METHOD = """
How these numbers were taken: `make bench` (`make bench-quick` for small sizes) starts a fresh
local control plane (etcd + kube-apiserver + kube-controller-manager, built from their Go
modules, on loopback) and runs each benchmark of `benchmarks/` against it. The controller runs
as a subprocess (`projector run`, from a runtime-only virtualenv, so its memory is what a
deployment would use) with its default flags unless a section says otherwise. Every system
uses the same admin identity against the same API server in the same run, and samples of
projector and of its floor alternate, so drifts in machine load hit both alike. Times are
taken by a watcher in the harness process: from the response to the source update to the watch
event showing the last copy with the new value. Medians and p99 over the samples shown; the
machine is a shared 2-core VM, so only ratios measured in the same run mean much.

The floor is a bare asyncio writer doing the same writes (PUT with the last known
resourceVersion) with the same concurrency (32) and the same HTTP stack (projector's own
client), timed to the watch event of its last write: the limit of this API server on this
machine. For one change and one copy, the floor is two write-and-watch round trips, the least a
controller must do (see the source change, write the copy).

Peers: kubernetes-replicator is built from its Go module by `benchmarks/peers/build.sh`; the
module proxy serves only v1.0.0 (2019, pull-based: each target holds a `replicate-from`
Secret, created by the harness), run with its defaults (client-go's 5 QPS). projection
(`github.com/be0x74a/projection`, now `github.com/projection-operator/projection`) could not be
built: the module proxy refuses every version of both paths (HTTP 403, "This module version is
not available"), so it is absent from every table.

The hot path was profiled with cProfile (`plan()` over 10,000 namespaces): per-namespace costs
were dataclass hashing of `ObjectKey`, a dict rebuilt per call, and fnmatch for `*`. The fixes
(a NamedTuple key, the informer's own dict as the lookup, fast paths for `*` and exact names,
hoisted invariants) are measured side by side in `hotpath-before-after` (each version in its
own subprocess, alternating rounds).

Exact commands of this page: `make bench` (that is `python -m benchmarks full`, then
`python -m benchmarks.report`) and `python -m benchmarks.before_after 08b2335`.
"""


def render(
    results: Path = RESULTS, target: Path = DOCS / "benchmarks.md", intro: str = METHOD
) -> Path:
    docs = load(results)
    out = ["# Benchmarks", "", intro.strip(), ""] if intro else ["# Benchmarks", ""]
    out += ["See the end of this page for the DESIGN §8 targets against these numbers.", ""]
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
    out += targets(docs)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(out) + "\n")
    return target


def _get(docs: dict[str, Any], name: str, system: str, metric: str, key: str = "median") -> Any:
    try:
        m = docs[name]["systems"][system][metric]
    except KeyError:
        return None
    return m.get(key, m.get("value"))


def targets(docs: dict[str, Any]) -> list[str]:
    """DESIGN §8, row by row, against this run's numbers (n/a where not measured)."""

    def v(x: Any, unit: str = "") -> str:
        return "n/a" if x is None else fmt(x, unit)

    def ratio(name: str, key: str) -> Any:
        return docs.get(name, {}).get("ratios", {}).get(key)

    lat0 = "projector (debounce 0)"
    hot = "plan_per_namespace_"
    rows = [
        (
            "fan-out 1 -> 100, last copy",
            "p50 <= 50 ms, p99 <= 100 ms, faster than projection",
            f"p50 {v(_get(docs, 'fanout-100', 'projector', 'last_copy'), 'ms')}, p99 "
            f"{v(_get(docs, 'fanout-100', 'projector', 'last_copy', 'p99'), 'ms')}; floor p50 "
            f"{v(_get(docs, 'fanout-100', 'floor', 'last_copy'), 'ms')}; projection not buildable",
        ),
        (
            "fan-out 1 -> 1,000",
            "<= 1.25 x the raw API write floor",
            f"{v(ratio('fanout-1000', 'projector/floor p50'))} x (default --qps 200), "
            f"{v(ratio('fanout-1000-qps0', 'projector/floor p50'))} x (--qps 0)",
        ),
        (
            "one change, one copy (debounce 0)",
            "p50 <= 1.3 x floor; p99 <= 25 ms",
            f"{v(ratio('latency', lat0 + ' / floor p50'))} x floor; p99 "
            f"{v(_get(docs, 'latency', lat0, 'end_to_end', 'p99'), 'ms')}",
        ),
        (
            "burst: 1,000 updates in ~1 s, 100 copies",
            "<= 5 writes per copy, final state exact",
            f"max {v(_get(docs, 'burst', 'projector', 'max_writes_per_copy'))} writes per copy; "
            f"exact: {v(_get(docs, 'burst', 'projector', 'final_state_exact'))}; the updates "
            f"took {v(docs.get('burst', {}).get('parameters', {}).get('seconds_to_send'), 's')}"
            " to send (the API server's pace here, not 1 s)",
        ),
        (
            "restart with up-to-date copies",
            "ready <= 10 s, 0 writes",
            f"ready {v(_get(docs, 'restart', 'projector', 'time_to_ready'), 's')}, "
            f"{v(_get(docs, 'restart', 'projector', 'writes_after_restart'))} writes "
            f"({docs.get('restart', {}).get('parameters', {}).get('copies', '?')} copies)",
        ),
        (
            "memory: 1,000 grants / 10,000 copies",
            "RSS <= 80 MB / <= 150 MB",
            f"{v(_get(docs, 'memory', 'projector', 'rss_at_size'), 'MiB')} at "
            f"{docs.get('memory', {}).get('parameters', {}).get('grants', '?')} grants and "
            f"{docs.get('memory', {}).get('parameters', {}).get('copies', '?')} copies",
        ),
        (
            "unrelated Secrets",
            "add <= 5 MB RSS and 0 CPU per change",
            f"{v(_get(docs, 'memory', 'projector', 'rss_delta_unrelated'), 'MiB')}, "
            f"{v(_get(docs, 'memory', 'projector', 'cpu_during_unrelated'), 's')} CPU for "
            f"{docs.get('memory', {}).get('parameters', {}).get('unrelated_secrets', '?')}",
        ),
        (
            "leader failover (kill -9 / SIGTERM)",
            "<= lease + 2 s / <= 3 s",
            "; ".join(
                f"{lease}: {v(_get(docs, 'failover', 'projector', f'kill -9, {lease}'), 'ms')}"
                f" / {v(_get(docs, 'failover', 'projector', f'SIGTERM, {lease}'), 'ms')}"
                for lease in docs.get("failover", {}).get("parameters", {}).get("leases", {})
            )
            or "n/a",
        ),
        (
            "hot path: plan one (grant, namespace)",
            "<= 25 us",
            f"{v(_get(docs, 'hotpath', 'projector', hot + 'in_sync_10000'), 'us')} in sync, "
            f"{v(_get(docs, 'hotpath', 'projector', hot + 'create_10000'), 'us')} create "
            "(10,000 namespaces)",
        ),
    ]
    lines = ["## DESIGN §8 targets", "", "| what | target | this run |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return lines


if __name__ == "__main__":
    print(render())
