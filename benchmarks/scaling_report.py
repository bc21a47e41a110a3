"""docs/scaling.md from benchmarks/results/scaling.json: tables, plots, fitted formulas, the size
at which one replica misses a target, and the sharding design that would come next.

Called by `python -m benchmarks.report` when the scaling result exists; the text around the
numbers is here, the numbers only in the result file.
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
MIB = 2**20
RSS_TARGET_MB = 80  # DESIGN §8: 1,000 grants and 10,000 copies
RSS_LIMIT_MIB = 256  # the chart's default memory limit (deploy/helm/projector/values.yaml)
READY_TARGET_S = 10.0  # DESIGN §8: restart over synced copies, ready
UNITS = {
    "namespaces": "selected namespaces (each with its copy)",
    "grants": "one-copy grants",
    "copies": "copies (100 grants over 1,000 namespaces)",
    "unrelated": "unrelated Secrets",
}

METHOD = """\
How these numbers were taken: `make bench` (`python -m benchmarks full`, its `scaling` part,
`benchmarks/scaling.py`) on a fresh local control plane (etcd + kube-apiserver +
kube-controller-manager on loopback), the controller from the runtime-only virtualenv, on the
shared 2-core VM that runs every benchmark here. Each axis grows alone on its own objects, in
place (sizes cumulative), until its sizes are done or its time budget is spent:

- **namespaces**: one selector grant over N labelled namespaces (so N copies);
- **grants**: N grants of one copy each, over 1,000 namespaces and ten sources;
- **copies**: 100 grants over 1,000 namespaces, each targeting N/100 of them;
- **unrelated**: N unlabelled Secrets in one namespace, beside a 100-copy grant;
- **source change rate**: one source with 100 copies, updated at R per second for a while.

Per point: a controller (`--qps 0`) writes the world and stops; a second one starts over it,
and its seconds to /readyz and to settled (every grant reconciled, the queue empty), its writes
(must be 0) and its RSS once settled are taken; then one source of the axis is updated and the
time from just before that write to the watch event of its last copy, and the controller's
CPU per copy write (/proc, user + system, the window closed once it has used no CPU for
0.3 s), are measured. Objects of earlier axes stay in the cluster and in the controller's
caches: each axis's slope is a least-squares line over that axis's own points, so the
leftovers move its intercept (a), not its slope (b). Each point is one sample (a restart is
minutes at the large sizes), so read the slopes, not the last digit of a point.
"""

SHARDING = """\
## The step after one replica: sharding (design, not built)

One replica holds every grant, namespace and copy in memory and does every write; the slopes
above say how far that goes. The next step, if a cluster ever needs it, splits the work so
that **no two replicas ever write the same copy**:

- **Shard key: the consumer (target) namespace.** A copy lives in exactly one namespace, so
  hashing the namespace name (`fnv32(namespace) mod S`, S shards) gives every copy exactly
  one owner, whatever grant wants it. A grant is not a shard key: a selector grant spans
  namespaces, and two grants may name the same copy (the conflict rules of `reconcile.claim`
  must see every claimant of one copy, which they do when the copy's namespace decides).
- **Assignment and handover: one Lease per shard** (`projector-shard-<i>` in the controller's
  namespace), as kubernetes-controller-sharding does with its per-shard Leases. A replica
  campaigns for shards until it holds about S / replicas of them; the Lease's holder is the
  only writer of that shard's copies, and the write fence (`leader.Elector.valid_for`, asked
  before every write today) is asked per shard. Handover **drains first**: a replica giving a
  shard up stops taking that shard's keys, finishes (or cancels) the writes in flight, and only
  then releases the Lease; the next holder starts from a fresh list, so at no instant do two
  replicas write one copy. A replica that dies stops renewing; its shards move after one
  lease duration, as the single leader's term does today.
- **What the informers filter on.** Copies: the managed-by label as now, plus a shard label
  (`projector.nebari.dev/shard=<i>`, written on every copy) so each replica lists and watches
  only its shards' copies (`labelSelector=...,shard in (i,j)`): the copy cache, the largest
  per-object cost measured above, divides by the number of replicas. Namespaces: every replica
  still needs the labels of its shards' namespaces only, but a namespace's shard is a hash of
  its name, which no server-side selector can express, so namespaces stay cluster-wide (their
  cost per namespace is small, above). Grants and sources: every replica keeps all grants and
  the exported sources (a grant's copies may fall in any shard; the sources are few), and
  plans each grant only for the namespaces of its shards. Status is written by one replica
  (the holder of shard 0, or a separate status Lease), from per-shard outcomes reported as
  conditions per shard, so replicas never race on one grant's status.
- **When it pays off.** Not before one replica misses a target at a size a cluster actually
  has; the table "Where one replica misses a target" above gives those sizes. RSS is the
  line that holds across runs (restart times move with the load): with this run's slope the
  chart's 256 MiB limit comes at tens of thousands of copies, and sharding by namespace
  divides exactly that term (the copy cache) by the number of replicas. Until then sharding
  buys nothing but a Lease per shard and a status merge, and one replica with a standby
  (leader election, measured in docs/benchmarks.md's failover section) is simpler and as
  available.
"""


def load(results: Path = RESULTS) -> dict[str, Any] | None:
    path = results / "scaling.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _n(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def _plot(axis: str, points: list[dict[str, Any]], fits: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    xs = [p["size"] for p in points]
    fig, axs = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, key, label in (
        (axs[0], "rss_mib", "RSS once settled (MiB)"),
        (axs[1], "restart_settled_seconds", "restart: settled (s)"),
        (axs[2], "fanout_ms", "one source's fan-out (ms)"),
    ):
        ys = [p[key] for p in points]
        ax.plot(xs, ys, "o", label="measured")
        line = fits.get(key)
        if line:
            ax.plot(xs, [line["a"] + line["b"] * x for x in xs], "-", label="fit")
            ax.legend(fontsize=7)
        ax.set_xlabel(UNITS[axis], fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    path = out / f"{axis}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"![{axis}](scaling/{axis}.png)"


def render(results: Path = RESULTS, target: Path = DOCS / "scaling.md") -> Path | None:
    doc = load(results)
    if doc is None:
        return None
    axes, fits = doc["axes"], doc["fits"]
    rel = results.resolve().relative_to(REPO) if results.resolve().is_relative_to(REPO) else results
    mach = doc["machine"]
    out = [
        "# The scale of one replica",
        "",
        METHOD.strip(),
        "",
        f"Result file: `{rel}/scaling.json` (size {doc.get('size') or '?'}, commit "
        f"`{doc['commit']}`, {doc['date']}; {mach['cpus']} CPUs, load average at start "
        f"{mach['load_avg_at_start'][0]:.2f}). Time per axis (s): "
        + ", ".join(f"{k} {v}" for k, v in doc["parameters"]["axis_seconds"].items())
        + f"; budget {doc['parameters']['budget_seconds_per_axis']} s per axis.",
        "",
    ]
    wanted = doc["parameters"]["sizes"]
    short = [
        f"{a} reached {max((p['size'] for p in axes[a]), default=0):,} of {max(wanted[a]):,}"
        for a in UNITS
        if axes.get(a) is not None and max((p["size"] for p in axes[a]), default=0) < max(wanted[a])
    ]
    if short:
        out += [f"Cut short by the time budget: {'; '.join(short)}.", ""]
    if doc.get("errors"):
        out += ["Errors: " + "; ".join(f"{k}: {v}" for k, v in doc["errors"].items()), ""]
    for axis, unit in UNITS.items():
        pts = axes.get(axis) or []
        if not pts:
            continue
        f = fits[axis]
        out += [
            f"## {axis}",
            "",
            f"N = {unit}.",
            "",
            "| N | copies | RSS (MiB) | restart: ready (s) | settled (s) | writes | "
            "fan-out copies | fan-out (ms) | CPU per write (ms) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in pts:
            out.append(
                f"| {_n(p['size'])} | {_n(p['copies'])} | {_n(p['rss_mib'])} | "
                f"{_n(p['restart_ready_seconds'])} | {_n(p['restart_settled_seconds'])} | "
                f"{_n(p['restart_writes'])} | {_n(p['fanout_copies'])} | {_n(p['fanout_ms'])} | "
                f"{_n(p['cpu_ms_per_write'])} |"
            )
        if axis == "unrelated":
            out += [
                "",
                "While each step's Secrets were created with a controller running: "
                + "; ".join(
                    f"+{p['created_while_running']:,}: RSS {p['rss_delta_mib_while_created']:+.2f}"
                    f" MiB, CPU {p['cpu_seconds_while_created']:.2f} s"
                    for p in pts
                )
                + " (label-filtered watches never deliver them).",
            ]
        rss, settled, ready = f["rss_mib"], f["restart_settled_seconds"], f["restart_ready_seconds"]
        out += [
            "",
            "Fits (least squares over these points): "
            f"RSS = {rss['a']:.1f} MiB {rss['b'] * MIB / 1024:+.2f} KiB · N; "
            f"settled after a restart = {settled['a']:.2f} s {settled['b'] * 1e3:+.4f} ms · N; "
            f"ready = {ready['a']:.2f} s {ready['b'] * 1e3:+.4f} ms · N.",
            "",
            _plot(axis, pts, f, target.parent / "scaling"),
            "",
        ]
    out += _per_object(fits) + _limits(fits) + _rate(axes.get("rate") or [])
    out += [*_restart_floor(results), SHARDING]
    target.write_text("\n".join(out) + "\n")
    return target


def _per_object(fits: dict[str, Any]) -> list[str]:
    if not {"copies", "grants", "namespaces"} <= set(fits):
        return []
    copy = fits["copies"]["rss_mib"]["b"] * MIB
    grant = fits["grants"]["rss_mib"]["b"] * MIB - copy
    ns = fits["namespaces"]["rss_mib"]["b"] * MIB - copy
    unrelated = fits["unrelated"]["rss_mib"]["b"] * MIB if "unrelated" in fits else None
    return [
        "## Bytes per object (from the slopes)",
        "",
        "| object | bytes of RSS | how |",
        "|---|---|---|",
        f"| cached copy | {copy:,.0f} | slope of the copies axis |",
        f"| grant | {grant:,.0f} | grants axis slope minus one copy |",
        f"| namespace | {ns:,.0f} | namespaces axis slope minus one copy |",
        f"| unrelated Secret | {_n(unrelated)} | slope of the unrelated axis (target: 0) |",
        "",
        "A slope that comes out negative or near zero means the object costs less than this "
        "machine's noise on a settled RSS (a few MiB: allocator arenas, the garbage "
        "collector's timing), not that it is free.",
        "",
    ]


def _restart_floor(results: Path) -> list[str]:
    """A replica's cold start beside the same lists by a bare client (`restart-floor.json`)."""
    path = results / "restart-floor.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    rows, slow = [], []
    for p in doc["points"]:
        floor = p["floor_s"]["median"]
        rows.append(
            f"| {p['copies_in_cluster']:,} | {p['objects_listed']:,} | "
            f"{_n(p.get('started_s', {}).get('median'))} | "
            f"{_n(p['ready_s']['median'])} | {_n(p['settled_s']['median'])} | {_n(floor)} | "
            f"{_n(p['settled/floor p50'])} | {_n(p.get('after start/floor p50'))} | "
            f"{sum(p['writes']):g} |"
        )
        if floor > READY_TARGET_S:
            slow.append(f"{p['copies_in_cluster']:,} copies ({_n(floor)} s)")
    out = [
        "## Restart against its floor",
        "",
        "`python -m benchmarks full --only coldstart` (`benchmarks/coldstart.py`, commit "
        f"`{doc['commit']}`, {doc['date']}): one grant per 1,000 copies over 1,000 "
        "namespaces, grown in place; at each size a new replica starts "
        f"{doc['parameters']['rounds']} times over the synced copies (seconds from its "
        "process's start: to its probe port's first answer, started, its lists begin; to "
        "/readyz, every cache listed; and to settled, every grant planned, nothing "
        "written), each start followed by the floor: the same LIST "
        "requests its informers issue (resources, label selectors, page sizes, all kinds "
        "at once) by a bare client (aiohttp, each page parsed by orjson, nothing kept), "
        "what the API server itself takes to serve them. Medians; copies of the other "
        "benchmarks of that run are in the cluster and in every list, both systems'.",
        "",
        "| copies in the cluster | objects listed | started (s) | ready (s) | settled (s) | "
        "floor (s) | settled / floor | after start / floor | writes |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "The start (CPython, the imports of aiohttp, kr8s's configuration loader, structlog, "
        "prometheus-client and OpenTelemetry, credentials, the two ports) is the same at "
        "every size, about 0.8 s of CPU; the floor, a client already running, pays none of "
        "it. So the target is two: started within 1 s, and what the replica does after it "
        "within 1.5x the floor (docs/benchmarks.md, Targets).",
        "",
    ]
    if slow:
        out += [
            f"The floor itself passes {READY_TARGET_S:g} s at {', '.join(slow)}: no client "
            "starts faster over that many copies on this API server, so a cluster of that "
            "size runs the two replicas of the chart (the standby's caches are warm: a "
            "failover lists nothing) and gives the API server the CPU that its lists need.",
            "",
        ]
    return out


def _limits(fits: dict[str, Any]) -> list[str]:
    """The size of each axis at which one replica would miss a target (its fitted line)."""
    rows = []
    for axis in ("copies", "grants", "namespaces"):
        if axis not in fits:
            continue
        f = fits[axis]
        for what, line, y, label in (
            ("RSS", f["rss_mib"], RSS_TARGET_MB * 1e6 / MIB, f"{RSS_TARGET_MB} MB (DESIGN §8)"),
            ("RSS", f["rss_mib"], float(RSS_LIMIT_MIB), f"{RSS_LIMIT_MIB} MiB (chart limit)"),
            (
                "restart: ready",
                f["restart_ready_seconds"],
                READY_TARGET_S,
                f"{READY_TARGET_S:g} s (DESIGN §8)",
            ),
            (
                "restart: settled",
                f["restart_settled_seconds"],
                READY_TARGET_S,
                f"{READY_TARGET_S:g} s",
            ),
        ):
            x = (y - line["a"]) / line["b"] if line["b"] > 0 else None
            where = (
                "never (no growth measured)"
                if x is None
                else "already at the intercept"
                if x <= 0
                else f"{x:,.0f} {UNITS[axis].split(' (')[0]}"
            )
            rows.append(f"| {axis} | {what} | {label} | {where} |")
    return [
        "## Where one replica misses a target",
        "",
        "Each fitted line solved for the target, the other axes at this benchmark's "
        "leftovers (the intercept a); an extrapolation beyond the largest measured point is "
        "only as good as the line. Restart times move with the machine's load far more than "
        "RSS does: where an axis's restart times do not grow from point to point, its line is "
        "noise and so is the size it gives.",
        "",
        "| axis | what | target | reached at |",
        "|---|---|---|---|",
        *rows,
        "",
    ]


def _rate(points: list[dict[str, Any]]) -> list[str]:
    if not points:
        return []
    out = [
        "## Source change rate",
        "",
        "One source, 100 copies, default flags (the debounce coalesces a hot source: "
        "`--debounce`, `--debounce-max`, `--debounce-hot-max`), updates sent at each rate by "
        "up to 64 concurrent PATCHes; lag: from the last update sent to the watch event of the "
        "last copy with the final value; refused: updates the API server did not answer in "
        "time (the harness's 10 s read timeout), left out of the rates and the CPU per update.",
        "",
        "| rate asked (/s) | achieved (/s) | updates | refused | writes per copy | lag (ms) | "
        "CPU per update (ms) | CPU (share of a core) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        out.append(
            f"| {_n(p['rate_per_s'])} | {_n(p['achieved_rate_per_s'])} | {_n(p['updates'])} | "
            f"{_n(p.get('updates_refused', 0))} | "
            f"{_n(p['writes_per_copy'])} | {_n(p['lag_after_last_update_ms'])} | "
            f"{_n(p['cpu_ms_per_update'])} | {_n(p['cpu_share_of_a_core'])} |"
        )
    return [*out, ""]
