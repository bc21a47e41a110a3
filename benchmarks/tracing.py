"""`python -m benchmarks.tracing`: what exporting spans costs the controller, receiver up or not.

Four runs of the same controller (the runtime-only venv, as deployed) on one control plane:

- ``off``: no OTEL_EXPORTER_OTLP_ENDPOINT (trace ids in logs and exemplars only);
- ``collector up``: exporting to a real OpenTelemetry Collector (tests/bed/otel/) on loopback;
- ``collector down``: exporting to a loopback port where nothing listens (refused at once);
- ``black-holed``: exporting to a port that accepts, reads and never answers (tests/bed/otel).

Each run measures, per source update fanned out to `namespaces` copies: the end-to-end time
(the triggering write sent -> the watch event of the last copy, as benchmarks/harness.py times
every system) and the controller's CPU seconds per copy written (from /proc, the window closed
once the process is quiet). Then `grants` grants of one copy each are reconciled `rounds` times
(grants x rounds reconciles, each one reconcile span and one write span) while the resident
memory is sampled after every round: with the receiver down, the bounded span queue must keep it
flat. The result goes to benchmarks/results/tracing.json (or --out) and is printed as a table.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, percentile, write_result
from benchmarks.e2e import MANAGED, cpu_when_quiet
from benchmarks.harness import (
    Watcher,
    control_plane,
    controller_python,
    delete_grants,
    ensure,
    exported,
    grant,
    namespaces,
    put_value,
    settle,
    wait_ready,
)
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, SECRETS
from tests.bed.controlplane.plane import free_port
from tests.bed.launcher import ControllerProcess, launch
from tests.bed.otel.harness import BlackHole, Collector, binary

MODES = ("off", "collector up", "collector down", "black-holed")


@contextmanager
def receiver(mode: str, work: Path) -> Iterator[dict[str, str]]:
    """The OTEL_* environment of one mode, with its receiver running meanwhile."""
    if mode == "off":
        yield {}
    elif mode == "collector up":
        c = Collector(binary(), work / "otelcol")
        try:
            yield {"OTEL_EXPORTER_OTLP_ENDPOINT": c.endpoint}
        finally:
            c.stop()
    elif mode == "collector down":
        yield {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    else:
        hole = BlackHole()
        try:
            yield {"OTEL_EXPORTER_OTLP_ENDPOINT": hole.endpoint}
        finally:
            hole.close()


async def fan_out(
    kube: Kube, c: ControllerProcess, tag: str, n: int, updates: int
) -> dict[str, Any]:
    """`updates` source changes, each to `n` copies: end-to-end seconds and CPU per write."""
    src, targets = f"tr-{tag}-src", [f"tr-{tag}-{i}" for i in range(n)]
    await namespaces(kube, [src, *targets], {"bench": "tracing"})
    await ensure(
        kube,
        SECRETS,
        exported("db", {"k": "v0"}),
        namespace=src,
    )
    watcher = Watcher(kube, MANAGED, "k")
    times: list[float] = []
    async with watcher:
        await kube.create(GRANTS, grant(f"tr-{tag}", (src, "db"), targets=targets))
        keys = [(t, "db") for t in targets]
        await watcher.reached(keys, "v0")
        for i in range(1, updates + 3):  # two warm-up updates, not counted
            if i == 3:
                cpu0 = await cpu_when_quiet(c.proc.pid)
            t0 = await put_value(kube, src, "db", "k", f"v{i}")
            t1 = await watcher.reached(keys, f"v{i}")
            if i >= 3:
                times.append(t1 - t0)
        cpu = await cpu_when_quiet(c.proc.pid) - cpu0
    return {
        "p50_ms": percentile(times, 50) * 1000,
        "p90_ms": percentile(times, 90) * 1000,
        "max_ms": max(times) * 1000,
        "cpu_ms_per_write": cpu / (updates * n) * 1000,
        "samples": len(times),
    }


async def many_reconciles(
    kube: Kube, c: ControllerProcess, tag: str, grants: int, rounds: int
) -> dict[str, Any]:
    """`grants` one-copy grants of one source, the source changed `rounds` times: RSS by round."""
    src, dst = f"tr-{tag}-msrc", f"tr-{tag}-mdst"
    await namespaces(kube, [src, dst], {"bench": "tracing"})
    await ensure(
        kube,
        SECRETS,
        exported("db", {"k": "r0"}),
        namespace=src,
    )
    names = [f"copy-{i}" for i in range(grants)]
    for i, name in enumerate(names):
        await kube.create(
            GRANTS, grant(f"tr-{tag}-m{i}", (src, "db"), targets=[dst], target_name=name)
        )
    keys = [(dst, name) for name in names]
    rss: list[float] = []
    started = c.metric("projector_reconcile_total")
    t0 = time.monotonic()
    async with Watcher(kube, MANAGED, "k") as watcher:
        await watcher.reached(keys, "r0", within=300)
        for r in range(1, rounds + 1):
            await put_value(kube, src, "db", "k", f"r{r}")
            await watcher.reached(keys, f"r{r}", within=300)
            rss.append(c.rss_mib())
    await settle(c)
    took = time.monotonic() - t0
    reconciles = c.metric("projector_reconcile_total") - started
    tenth = max(1, len(rss) // 10)
    return {
        "reconciles": reconciles,
        "seconds": took,
        "rss_mib_after_first_tenth": rss[tenth - 1],
        "rss_mib_end": rss[-1],
        "rss_mib_max": max(rss),
        "rss_growth_mib_after_first_tenth": rss[-1] - rss[tenth - 1],
        "peak_rss_mib": c.peak_rss_mib(),
        "rss_mib_by_round": [round(x, 1) for x in rss],
        "spans_exported": c.metric("projector_spans_exported_total"),
        "spans_dropped_queue_full": c.metric("projector_spans_dropped_total", reason="queue_full"),
        "spans_dropped_export_failed": c.metric(
            "projector_spans_dropped_total", reason="export_failed"
        ),
        "traces_not_started_paused": c.metric("projector_spans_dropped_total", reason="paused"),
    }


@contextmanager
def running(kubeconfig: Path, work: Path, mode: str, run: str) -> Iterator[ControllerProcess]:
    """One controller in `mode`, its receiver running meanwhile; stopped afterwards."""
    with receiver(mode, work / run) as env:
        c = launch(
            kubeconfig,
            work / f"{run}.log",
            "--log-level=warning",
            python=controller_python(),
            env=env,
        )
        try:
            yield c
        except BaseException:
            print(f"--- {mode}: controller log (tail) ---\n{c.logs()[-3000:]}")
            raise
        finally:
            c.stop(timeout=60)  # a no-op once stopped


async def fan_out_run(
    kube: Kube, kubeconfig: Path, work: Path, mode: str, rep: int, size: Mapping[str, int]
) -> dict[str, Any]:
    run = f"f{rep}m{MODES.index(mode)}"

    async def measure(c: ControllerProcess) -> dict[str, Any]:
        if mode in ("collector down", "black-holed"):
            await outage_noticed(kube, c, run)
        return await fan_out(kube, c, run, size["namespaces"], size["updates"])

    return await measured_run(kube, kubeconfig, work, mode, run, measure)


async def measured_run(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    mode: str,
    run: str,
    measure: Callable[[ControllerProcess], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """`measure` a ready controller in `mode`, then time its exit; its grants go afterwards."""
    with running(kubeconfig, work, mode, run) as c:
        await wait_ready(c)
        result = await measure(c)
        t0 = time.monotonic()
        result["exit_code"] = c.stop(timeout=60)
        result["exit_seconds"] = time.monotonic() - t0
    await delete_grants(kube)
    return result


async def outage_noticed(kube: Kube, c: ControllerProcess, run: str) -> None:
    """Reconcile until an export has failed: the timed fan-outs then see a receiver that has
    been down a while (the steady state of an outage), not its first seconds."""
    src, dst = f"tr-{run}-wsrc", f"tr-{run}-wdst"
    await namespaces(kube, [src, dst], {"bench": "tracing"})
    body = exported("db", {"k": "w0"})
    await ensure(kube, SECRETS, body, namespace=src)
    await kube.create(GRANTS, grant(f"tr-{run}-w", (src, "db"), targets=[dst]))
    deadline = time.monotonic() + 120
    i = 0
    while c.metric("projector_spans_dropped_total", reason="export_failed") == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("no export failed within 120 s")
        i += 1
        await put_value(kube, src, "db", "k", f"w{i}")
        await asyncio.sleep(0.2)


async def memory_run(
    kube: Kube, kubeconfig: Path, work: Path, mode: str, size: Mapping[str, int]
) -> dict[str, Any]:
    run = f"r{MODES.index(mode)}"

    async def measure(c: ControllerProcess) -> dict[str, Any]:
        return await many_reconciles(kube, c, run, size["grants"], size["rounds"])

    return await measured_run(kube, kubeconfig, work, mode, run, measure)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def table(systems: Mapping[str, Mapping[str, Any]]) -> str:
    """The results as a Markdown table, with each mode's CPU per write against tracing off.

    Fan-out columns are medians over the interleaved runs; exit is the slowest stop seen.
    """
    off = systems["off"]
    lines = [
        "| tracing | fan-out p50 | p90 | CPU per write | vs off | reconciles | RSS after 1/10"
        " -> end | spans exported / dropped / reconciles untraced | slowest exit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in sorted(systems, key=lambda m: MODES.index(m) if m in MODES else len(MODES)):
        r = systems[mode]
        ratio = r["cpu_ms_per_write"] / off["cpu_ms_per_write"]
        dropped = r["spans_dropped_queue_full"] + r["spans_dropped_export_failed"]
        lines.append(
            f"| {mode} | {r['p50_ms']:.1f} ms | {r['p90_ms']:.1f} ms "
            f"| {r['cpu_ms_per_write']:.2f} ms | {ratio:.2f}x | {r['reconciles']:.0f} "
            f"| {r['rss_mib_after_first_tenth']:.1f} -> {r['rss_mib_end']:.1f} MiB "
            f"| {r['spans_exported']:.0f} / {dropped:.0f} "
            f"/ {r.get('traces_not_started_paused', 0.0):.0f} "
            f"| {max(r['exit_seconds'], r.get('exit_seconds_max', 0.0)):.1f} s |"
        )
    return "\n".join(lines)


async def run_all(kubeconfig: Path, work: Path, size: Mapping[str, int]) -> dict[str, Any]:
    """Fan-out runs interleaved (mode after mode, `repeats` times: a shared machine's load
    drifts, so each mode sees the same drift), then one memory run per mode."""
    kube = await Kube.connect(str(kubeconfig), qps=0)
    try:
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for rep in range(size["repeats"]):
            for mode in MODES:
                runs[mode].append(await fan_out_run(kube, kubeconfig, work, mode, rep, size))
        systems: dict[str, Any] = {}
        for mode in MODES:
            r: dict[str, Any] = {
                k: _median(runs[mode], k) for k in ("p50_ms", "p90_ms", "cpu_ms_per_write")
            }
            r["exit_seconds_max"] = max(x["exit_seconds"] for x in runs[mode])
            r["fan_out_runs"] = runs[mode]
            r |= await memory_run(kube, kubeconfig, work, mode, size)
            systems[mode] = r
        return systems
    finally:
        await kube.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tracing")
    p.add_argument("--namespaces", type=int, default=20, help="copies per fan-out")
    p.add_argument("--updates", type=int, default=200, help="timed fan-outs per run")
    p.add_argument("--grants", type=int, default=100, help="one-copy grants for the RSS phase")
    p.add_argument("--rounds", type=int, default=100, help="source changes in the RSS phase")
    p.add_argument("--repeats", type=int, default=2, help="fan-out runs per mode, interleaved")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    size = {"namespaces": a.namespaces, "updates": a.updates, "grants": a.grants}
    size |= {"rounds": a.rounds, "repeats": a.repeats}
    work = Path(tempfile.mkdtemp(prefix="projector-bench-tracing-"))
    try:
        with control_plane(work / "plane") as plane:
            systems = asyncio.run(run_all(plane.kubeconfig, work, size))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    off = systems["off"]["cpu_ms_per_write"]
    ratios = {m: systems[m]["cpu_ms_per_write"] / off for m in MODES}
    path = write_result("tracing", size, systems, {"cpu_per_write_vs_off": ratios}, out=a.out)
    print(table(systems))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
