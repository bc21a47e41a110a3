"""End-to-end benchmarks against the real control plane, each beside its floor, in one run.

Every time is from t0, just before the triggering write is sent, to t1, the watch event that
shows the last copy with the new value (for every system alike). Each system runs alone in its
block (started for it, stopped after it); blocks alternate, so drifts in machine load hit all
alike; each block's first sample is a warm-up, dropped and counted in the result file.

- fanout:  1 source -> N namespaces. Floor: the same N PUTs by a bare asyncio writer
           (raw HTTP/1.1 read by llhttp, orjson, uvloop) in its own process
           (benchmarks/floor.py), same concurrency (32), timed to the watch event of its last
           write: once on minimal Secrets of its own, once on projector's copies themselves
           (the same bodies: labels, annotations and field manager), the least any
           controller must write to produce these copies. Peers: projection and
           kubernetes-replicator, built from source, each with its own source and copies.
           Client CPU per write: the controller's process CPU (/proc, user + system) from
           before the trigger until it has used none for 0.3 s after the last copy, / its
           Update writes (its /metrics, read outside that window); the floor's process_time()
           around its writes, in its own process, / writes; a peer's like the controller's,
           / copies.
- latency: one source, one copy, updates at a fixed rate. Floor: two write+watch round trips
           (what the controller must do) on the same client.
- burst:   many updates in about a second to one source with many copies: writes per copy
           (MODIFIED events seen), and whether the final state is exact.
- restart: a world of G grants x K namespaces; restart the controller: time to ready, time to
           settled, writes issued (must be 0); RSS at that size; then RSS and CPU while as many
           unrelated Secrets as copies are created.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from benchmarks import peers
from benchmarks.apiserver import ApiServer, Cost
from benchmarks.common import (
    FLOOR_SAME,
    MARKS_RATIO,
    RESULTS,
    SAME_RATIO,
    process_cpu,
    summary,
    write_result,
)
from benchmarks.floor import FLOOR_CLIENT, WRITE_CONCURRENCY, FloorProcess, Observer, observer
from benchmarks.harness import (
    Watcher,
    controller,
    ensure,
    exported,
    gather_limited,
    grant,
    namespaces,
    put_value,
    secret,
    settle,
    sources,
    unb64,
)
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, SECRETS
from projector.core.model import GRANT_LABEL
from projector.core.names import FIELD_MANAGER
from tests.bed.kube import api_client, b64
from tests.bed.otel.harness import Collector
from tests.bed.otel.harness import binary as otel_binary

MANAGED = "projector.nebari.dev/managed-by=projector"


async def cpu_when_quiet(pid: int, quiet: float = 0.3, within: float = 30.0) -> float:
    """The process's CPU seconds once it has used none for `quiet` seconds (read from /proc).

    Ends the CPU window of a sample without asking the process anything (a /metrics scrape
    would cost it CPU of its own); after `within`, the last reading.
    """
    last, since = process_cpu(pid), time.monotonic()
    deadline = since + within
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = process_cpu(pid)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


@dataclass
class Series:
    """One system's samples over its blocks: end-to-end times and client CPU per write."""

    times: list[float] = field(default_factory=list)
    cpu_per_write: list[float] = field(default_factory=list)
    writes: list[float] = field(default_factory=list)
    server_cpu_per_copy: list[float] = field(default_factory=list)
    server_requests_per_copy: list[float] = field(default_factory=list)
    warmup_dropped: int = 0

    def add(
        self,
        warmup: bool,
        seconds: float,
        cpu: float | None,
        writes: float,
        cost: tuple[Cost, int] | None = None,
    ) -> None:
        """One sample; `cost`: what it cost the API server, and over how many copies."""
        if warmup:
            self.warmup_dropped += 1
            return
        self.times.append(seconds * 1000)
        self.writes.append(writes)
        if cpu is not None and writes:
            self.cpu_per_write.append(cpu * 1000 / writes)
        if cost is not None:
            spent, copies = cost
            self.server_cpu_per_copy.append(spent.cpu * 1000 / copies)
            self.server_requests_per_copy.append(spent.requests / copies)

    def result(self, metric: str) -> dict[str, Any]:
        out: dict[str, Any] = {metric: summary(self.times, "ms")}
        out[metric]["values"] = [round(x, 3) for x in self.times]
        if self.cpu_per_write:
            out["client_cpu_per_write"] = summary(self.cpu_per_write, "ms")
            out["client_cpu_per_write"]["total_writes"] = sum(self.writes)
            out["client_cpu_per_write"]["values"] = [round(x, 4) for x in self.cpu_per_write]
        if self.server_cpu_per_copy:
            out["api_server_cpu_per_copy"] = summary(self.server_cpu_per_copy, "ms")
            out["api_server_requests_per_copy"] = summary(self.server_requests_per_copy, "")
        return out


FLOOR_MINIMAL = "floor"


@dataclass
class FloorRun:
    """One floor of a fan-out: the Secrets it PUTs (a selector, their keys), as which manager.

    On minimal Secrets of its own, or on projector's copies themselves with projector's field
    manager, so the same bytes, labels, annotations and managedFields are written: the
    difference between the two is what the copies' ownership marks cost the API server.
    """

    selector: str
    keys: list[tuple[str, str]]
    manager: str = "floor"
    series: Series = field(default_factory=Series)


class Values:
    """Unique values for one run, so a sample never sees an old one."""

    def __init__(self, run: str) -> None:
        self.run, self.n = run, 0
        self.current = self.projector = f"{run}-v0"

    def next(self) -> str:
        self.n += 1
        self.current = f"{self.run}-v{self.n}"
        return self.current


async def paced(
    obs: Observer, watch: Watcher, where: tuple[str, str], values: Values, n: int, rate: float
) -> AsyncIterator[tuple[int, float, float]]:
    """Once the copy in `where`'s second namespace is seen: n + 1 updates of the source in the
    first, at `rate` per second; each `(i, written, copy seen)`, i == 0 the warm-up."""
    src, dst = where
    await watch.until(lambda: (dst, "hub") in watch.values, 120)
    start = time.monotonic()
    for i in range(n + 1):
        value = values.next()
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        t0 = await put_value(obs, src, "hub", "token", value)
        t1 = await watch.reached([(dst, "hub")], value)
        yield i, t0, t1


@dataclass
class PeerState:
    peer: peers.Peer
    src: str
    name: str
    label: str
    ready: bool = False
    value: str = "v0"
    series: Series = field(default_factory=Series)


async def fanout(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    n: int,
    blocks: int,
    per_block: int,
    flags: Sequence[str] = (),
    out: Path = RESULTS,
    name: str = "",
    peer_blocks: int = 0,
    build_peers: bool = True,
    peer_names: Sequence[str] = (),
) -> Path:
    """1 source -> n namespaces, each system alone in its block, blocks alternating.

    Order: projector, floor, projection, replicator, projector, ... Each block starts its system
    (the controller, the floor process, a peer), waits until its copies hold the current value,
    takes 1 warm-up sample (dropped, counted) and `per_block` samples, then stops it. A sample:
    t0 just before the triggering write is sent (the source update; for the floor, its first
    PUT), t1 the watch event of the last copy with the new value, seen by a Watcher here.
    `peer_names`: only these peers (default: all).
    """
    tag = f"fan{n}"
    src, targets = f"{tag}-src", [f"{tag}-{i}" for i in range(n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": tag})
    await ensure(kube, SECRETS, exported("hub", {"token": "v0"}), src)
    await gather_limited(
        ensure(kube, SECRETS, secret("floor", {"token": "v0"}, labels={"bench-floor": tag}), ns)
        for ns in targets
    )
    await ensure(kube, GRANTS, grant(tag, (src, "hub"), selector={"bench": tag}))
    copies = [(ns, "hub") for ns in targets]
    floors = {
        FLOOR_MINIMAL: FloorRun(f"bench-floor={tag}", [(ns, "floor") for ns in targets]),
        FLOOR_SAME: FloorRun(f"{GRANT_LABEL}={tag}", copies, manager=FIELD_MANAGER),
    }
    run = name or f"fanout-{n}"
    values = Values(run)
    await put_value(kube, src, "hub", "token", values.current)
    proj = Series()
    unavailable: dict[str, str] = {}
    peer_states: list[PeerState] = []
    if peer_blocks:
        await namespaces(kube, [f"{tag}-peer-src"], {})
        for peer in peers.all_peers():
            if peer_names and peer.name not in peer_names:
                continue
            try:
                if build_peers:
                    peer.ensure_built()
                elif peer.built() is None:
                    raise peers.PeerUnavailable(
                        f"{peer.name} {peer.version} not built (benchmarks/peers/build.sh "
                        "builds it; this size never builds peers)"
                    )
            except peers.PeerUnavailable as e:
                unavailable[peer.name] = str(e).strip().splitlines()[-1][:300]
                continue
            short = "repl" if "replicator" in peer.name else peer.name
            st = PeerState(peer, f"{tag}-peer-src", f"{tag}-{short}", f"{tag}-{short}")
            await ensure(kube, SECRETS, secret(st.name, {"token": "v0"}), st.src)
            peer_states.append(st)

    async with observer(kubeconfig) as obs:
        await _fanout_blocks(
            ApiServer.find(kubeconfig),
            kube,
            obs,
            kubeconfig,
            work,
            run,
            flags,
            tag,
            src,
            targets,
            copies,
            floors,
            proj,
            peer_states,
            values,
            blocks,
            per_block,
            peer_blocks,
        )
    await kube.delete(GRANTS, tag)
    systems: dict[str, Any] = {"projector": proj.result("last_copy")}
    systems.update((k, fr.series.result("last_copy")) for k, fr in floors.items())
    p, f = systems["projector"]["last_copy"], systems[FLOOR_MINIMAL]["last_copy"]
    same = systems[FLOOR_SAME]["last_copy"]
    ratios = {
        "projector/floor p50": p["median"] / f["median"],
        "projector/floor p99": p["p99"] / f["p99"],
        SAME_RATIO: p["median"] / same["median"],
        "projector/floor (same bodies) p99": p["p99"] / same["p99"],
        MARKS_RATIO: same["median"] / f["median"],
    }
    warmups = {"projector": proj.warmup_dropped}
    warmups.update((k, fr.series.warmup_dropped) for k, fr in floors.items())
    for st in peer_states:
        key = f"{st.peer.name} {st.peer.version}"
        systems[key] = st.series.result("last_copy")
        warmups[key] = st.series.warmup_dropped
        s_peer = systems[key]["last_copy"]
        ratios[f"projector/{st.peer.name} p50"] = p["median"] / s_peer["median"]
        ratios[f"{st.peer.name}/floor p50"] = s_peer["median"] / f["median"]
    server = "api_server_cpu_per_copy"
    if server in systems["projector"]:  # what each system's copies cost the API server
        # (0 where a tiny fan-out's CPU is below /proc's 10 ms tick: no ratio then)
        mine = systems["projector"][server]["median"]
        for key, sys_ in systems.items():
            if key != "projector" and server in sys_ and sys_[server]["median"] > 0:
                other = key if key.startswith("floor") else key.split(" ")[0]
                ratios[f"projector/{other} API server CPU per copy p50"] = (
                    mine / sys_[server]["median"]
                )
    if "client_cpu_per_write" in systems["projector"]:
        ratios["projector/floor client CPU per write p50"] = (
            systems["projector"]["client_cpu_per_write"]["median"]
            / systems["floor"]["client_cpu_per_write"]["median"]
        )
    return write_result(
        run,
        {
            "namespaces": n,
            "blocks": blocks,
            "samples_per_block": per_block,
            "warmup_dropped": warmups,
            "flags": list(flags),
            "write_concurrency": WRITE_CONCURRENCY,
            "floor_client": FLOOR_CLIENT,
            "peer_blocks": peer_blocks,
            "peers_only": list(peer_names),
            "peers_unavailable": unavailable,
        },
        systems,
        ratios,
        out=out,
    )


async def _start(api: ApiServer | None) -> None:
    if api is not None:
        await api.start()


async def _stop(api: ApiServer | None, copies: int) -> tuple[Cost, int] | None:
    return None if api is None else (await api.stop(), copies)


async def _peer_block(
    server: ApiServer | None,
    obs: Observer,
    kubeconfig: Path,
    work: Path,
    st: PeerState,
    tag: str,
    targets: list[str],
    per_block: int,
    values: Values,
) -> None:
    """One block of a peer, run with its defaults: its own source, its own copies."""
    peer = st.peer
    api = api_client(kubeconfig)
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    proc = peer.start(kubeconfig, work / f"{peer.name}-{tag}.log")
    copies = [(ns, peer.copy_name(st.name)) for ns in targets]
    try:
        await asyncio.to_thread(peer.wait_ready, proc)
        if not st.ready:
            await asyncio.to_thread(
                peer.setup_fanout,
                core,
                custom,
                st.src,
                st.name,
                targets,
                1200.0,
                {"bench-peer": st.label},
                ("bench", tag),
            )
            st.ready = True
        async with Watcher(obs, f"bench-peer={st.label}", "token") as watch:
            await watch.until(watch.all_equal(copies, st.value), 1200)
            for i in range(per_block + 1):
                st.value = values.next()
                cpu0 = await cpu_when_quiet(proc.pid)
                await _start(server)
                t0 = await put_value(obs, st.src, st.name, "token", st.value)
                t1 = await watch.reached(copies, st.value, 1200)
                cpu = await cpu_when_quiet(proc.pid) - cpu0
                cost = await _stop(server, len(copies))
                st.series.add(i == 0, t1 - t0, cpu, len(copies), cost)
    finally:
        peers.stop(proc)
        api.close()


async def latency(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    blocks: int,
    per_block: int,
    rate: float,
    debounces: Sequence[str] = ("0", "default"),
    out: Path = RESULTS,
) -> Path:
    """One source, one copy; each system alone in its block, blocks alternating.

    projector (each debounce): t0 just before the source update is sent, t1 the watch event of
    the copy. The floor: two write+watch round trips (write A, see A, write B, see B: the least a
    controller must do) by the floor's client, timed in its own process.
    """
    src, dst = "lat-src", "lat-dst"
    await namespaces(kube, [src, dst], {})
    await ensure(kube, SECRETS, exported("hub", {"token": "v0"}), src)
    for n in ("floor-a", "floor-b"):
        await ensure(kube, SECRETS, secret(n, {"token": "v0"}, labels={"bench-floor": "lat"}), dst)
    await ensure(kube, GRANTS, grant("lat", (src, "hub"), targets=[dst]))
    series = {d: Series() for d in debounces}
    floors = {f: Series() for f in FLOORS}
    floor_splits: dict[str, list[list[float]]] = {f: [] for f in FLOORS}
    values = Values("lat")
    async with observer(kubeconfig) as obs:
        for b in range(blocks):
            for debounce in debounces:
                flags = [] if debounce == "default" else [f"--debounce={debounce}"]
                async with (
                    controller(kubeconfig, work / f"controller-lat-{debounce}-{b}.log", *flags),
                    Watcher(obs, MANAGED, "token") as watch,
                ):
                    async for i, t0, t1 in paced(obs, watch, (src, dst), values, per_block, rate):
                        series[debounce].add(i == 0, t1 - t0, None, 1)
            for fname, module in FLOORS.items():
                async with FloorProcess(kubeconfig, work / "floor-lat.log", module) as fp:
                    await fp.call("watch", selector="bench-floor=lat")
                    start = time.monotonic()
                    for i in range(per_block + 1):
                        value = values.next()
                        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
                        r = await fp.call(
                            "roundtrips",
                            namespace=dst,
                            names=["floor-a", "floor-b"],
                            key="token",
                            value=value,
                        )
                        floors[fname].add(i == 0, r["t1"] - r["t0"], r["cpu"], r["writes"])
                        if i:
                            floor_splits[fname].append(_splits(r["t0"], r["marks"]))
        stages = await _stages(kubeconfig, work, obs, src, dst, values, per_block, rate)
    systems: dict[str, Any] = {
        f"projector (debounce {d})": series[d].result("end_to_end") for d in debounces
    }
    for fname in FLOORS:
        systems[fname] = floors[fname].result("end_to_end")
        for part, xs in zip(FLOOR_PARTS, zip(*floor_splits[fname], strict=True), strict=True):
            systems[fname][part] = summary(list(xs), "ms")
    systems["projector (debounce 0, traced: stages)"] = stages
    f = systems[FLOOR]["end_to_end"]["median"]
    ratios: dict[str, float] = {}
    for k, v in systems.items():
        if k.startswith("projector") and "end_to_end" in v:
            ratios[f"{k} / floor p50"] = v["end_to_end"]["median"] / f
            ratios[f"{k} - floor p50 (ms)"] = v["end_to_end"]["median"] - f
    plain = systems[PLAIN_FLOOR]["end_to_end"]["median"]
    ratios[f"{FLOOR} / {PLAIN_FLOOR} p50"] = f / plain
    ratios["projector (debounce 0) / plain floor p50"] = (
        systems["projector (debounce 0)"]["end_to_end"]["median"] / plain
    )
    await kube.delete(GRANTS, "lat")
    return write_result(
        "latency",
        {
            "blocks": blocks,
            "samples_per_block": per_block,
            "rate_per_s": rate,
            "debounces": list(debounces),
            "warmup_dropped": {
                **{f"projector (debounce {d})": series[d].warmup_dropped for d in debounces},
                **{k: v.warmup_dropped for k, v in floors.items()},
            },
            "floor_clients": {
                FLOOR: f"{FLOOR_CLIENT} (benchmarks/floor.py)",
                PLAIN_FLOOR: "http.client + json, a watch thread, own process "
                "(benchmarks/floor_sync.py)",
            },
        },
        systems,
        ratios,
        out=out,
    )


FLOOR = "floor (2 write+watch round trips)"
PLAIN_FLOOR = "plain floor (2 write+watch round trips, stdlib sync client)"
FLOORS = {FLOOR: "benchmarks.floor", PLAIN_FLOOR: "benchmarks.floor_sync"}
FLOOR_PARTS = ("write A", "watch event of A", "write B", "watch event of B")
STAGES = (
    "trigger write + watch event to the controller + queue hand-off",
    "snapshot + plan",
    "copy write (serialize, send, server, parse)",
    "watch event of the copy to the harness",
    "after the write in the reconcile (status, metrics)",
)


def _splits(t0: float, marks: list[float]) -> list[float]:
    """Milliseconds between consecutive marks, the first from t0."""
    return [(b - a) * 1000 for a, b in zip([t0, *marks], marks, strict=False)]


async def _stages(
    kubeconfig: Path,
    work: Path,
    obs: Observer,
    src: str,
    dst: str,
    values: Values,
    samples: int,
    rate: float,
) -> dict[str, Any]:
    """Where one change's milliseconds go: a block of debounce-0 samples with the controller
    exporting spans to a real collector; each sample split at its reconcile span's start and
    its write span's start and end (span clocks are wall time: converted with one offset taken
    here). Tracing costs CPU of its own, so these samples are not mixed into the series."""
    collector = Collector(otel_binary(), work / "otelcol-lat")
    offset = time.time_ns() - time.monotonic_ns()
    marks: list[tuple[float, float]] = []
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint}
        log = work / "controller-lat-stages.log"
        async with (
            controller(kubeconfig, log, "--debounce=0", env=env),
            Watcher(obs, MANAGED, "token") as watch,
        ):
            async for i, t0, t1 in paced(obs, watch, (src, dst), values, samples, rate):
                if i:
                    marks.append((t0, t1))
    finally:  # the controller's exit flushed its spans; the collector's flushes its file
        collector.stop()
    spans = _span_times(collector.file, offset)
    recs = sorted((s for s in spans.values() if s["name"] == "reconcile"), key=lambda s: s["start"])
    writes = {s["parent"]: s for s in spans.values() if s["name"] == "write"}
    parts: list[list[float]] = []
    for t0, t1 in marks:
        rec = next((r for r in recs if r["start"] > t0 and r["id"] in writes), None)
        if rec is None or rec["start"] > t1:
            continue
        w = writes[rec["id"]]
        points = [t0, rec["start"], w["start"], w["end"], t1]
        parts.append([*_splits(points[0], points[1:]), (rec["end"] - w["end"]) * 1000])
    columns = list(zip(*parts, strict=True)) if parts else [() for _ in STAGES]
    out: dict[str, Any] = {
        name: summary(list(xs), "ms") for name, xs in zip(STAGES, columns, strict=True)
    }
    out["end_to_end"] = summary([(t1 - t0) * 1000 for t0, t1 in marks], "ms")
    out["end_to_end"]["matched_to_spans"] = len(parts)
    return out


def _span_times(file: Path, offset_ns: int) -> dict[str, dict[str, Any]]:
    """Every span of the collector's file: name, parent, start and end on the monotonic clock."""
    out: dict[str, dict[str, Any]] = {}
    for line in file.read_text().splitlines() if file.exists() else []:
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    out[s["spanId"]] = {
                        "id": s["spanId"],
                        "name": s["name"],
                        "parent": s.get("parentSpanId", ""),
                        "start": (int(s["startTimeUnixNano"]) - offset_ns) / 1e9,
                        "end": (int(s["endTimeUnixNano"]) - offset_ns) / 1e9,
                    }
    return out


async def _fanout_blocks(
    api: ApiServer | None,
    kube: Kube,
    obs: Observer,
    kubeconfig: Path,
    work: Path,
    run: str,
    flags: Sequence[str],
    tag: str,
    src: str,
    targets: list[str],
    copies: list[tuple[str, str]],
    floors: dict[str, FloorRun],
    proj: Series,
    peer_states: list[PeerState],
    values: Values,
    blocks: int,
    per_block: int,
    peer_blocks: int,
) -> None:
    for b in range(blocks):
        # projector
        async with (
            controller(kubeconfig, work / f"controller-{run}-{b}.log", *flags) as ctl,
            Watcher(obs, MANAGED, "token") as watch,
        ):
            await watch.until(watch.all_equal(copies, values.projector), 600)
            await settle(ctl)
            for i in range(per_block + 1):
                value = values.projector = values.next()
                w0 = ctl.metric("projector_writes_total", action="Update", result="ok")
                cpu0 = await cpu_when_quiet(ctl.proc.pid)
                await _start(api)
                t0 = await put_value(obs, src, "hub", "token", value)
                t1 = await watch.reached(copies, value, 600)
                cpu = await cpu_when_quiet(ctl.proc.pid) - cpu0
                cost = await _stop(api, len(copies))
                await settle(ctl)
                w = ctl.metric("projector_writes_total", action="Update", result="ok") - w0
                proj.add(i == 0, t1 - t0, cpu, w, cost)
        # the floors (the one on projector's copies leaves them drifted: projector's next
        # block starts by writing them back, before its samples)
        for fr in floors.values():
            async with (
                FloorProcess(kubeconfig, work / f"floor-{run}.log") as fp,
                Watcher(obs, fr.selector, "token") as fwatch,
            ):
                await fp.call("load", selector=fr.selector, manager=fr.manager)
                for i in range(per_block + 1):
                    floor_value = values.next()
                    # The same quiet gap as projector's samples get (its CPU window's 0.3 s):
                    # back to back, a sample began while the API server still worked off the
                    # last one's writes, and the floor read 55 or 90 ms by turns.
                    await cpu_when_quiet(fp.pid)
                    await _start(api)
                    r = await fp.call(
                        "fanout", key="token", value=floor_value, concurrency=WRITE_CONCURRENCY
                    )
                    t1 = await fwatch.reached(fr.keys, floor_value, 600)
                    await cpu_when_quiet(fp.pid)
                    cost = await _stop(api, len(fr.keys))
                    fr.series.add(i == 0, t1 - r["t0"], r["cpu"], r["writes"], cost)
        # the peers
        if b < peer_blocks:
            for st in peer_states:
                await _peer_block(api, obs, kubeconfig, work, st, tag, targets, per_block, values)


async def burst(
    kube: Kube, kubeconfig: Path, work: Path, updates: int, copies_n: int, out: Path = RESULTS
) -> Path:
    src, targets = "burst-src", [f"burst-{i}" for i in range(copies_n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": "burst"})
    await ensure(kube, SECRETS, exported("hub", {"token": "v0"}), src)
    await ensure(kube, GRANTS, grant("burst", (src, "hub"), selector={"bench": "burst"}))
    keys = [(ns, "hub") for ns in targets]
    async with (
        controller(kubeconfig, work / "controller-burst.log") as ctl,
        Watcher(kube, MANAGED, "token") as watch,
    ):
        await watch.until(watch.all_equal(keys, "v0"), 300)
        await settle(ctl)
        before = dict(watch.modified)
        writes_before = ctl.metric("projector_writes_total", action="Update", result="ok")
        t0 = time.monotonic()
        await gather_limited(
            (
                kube.patch(SECRETS, "hub", {"data": {"token": b64(f"b{i}")}}, namespace=src)
                for i in range(updates)
            ),
            limit=8,
        )
        sent = time.monotonic() - t0
        final = (await kube.get(SECRETS, "hub", namespace=src))["data"]["token"]
        value = unb64(final)
        await watch.until(watch.all_equal(keys, value), 300)
        await settle(ctl)
        per_copy = [watch.modified.get(k, 0) - before.get(k, 0) for k in keys]
        exact = all(watch.values.get(k) == value for k in keys)
        writes = ctl.metric("projector_writes_total", action="Update", result="ok") - writes_before
    await kube.delete(GRANTS, "burst")
    return write_result(
        "burst",
        {"updates": updates, "copies": copies_n, "seconds_to_send": round(sent, 3)},
        {
            "projector": {
                "writes_per_copy": summary([float(x) for x in per_copy], "writes"),
                "max_writes_per_copy": {"value": max(per_copy), "unit": "writes"},
                "update_writes_total": {"value": writes, "unit": "writes"},
                "final_state_exact": {"value": exact, "unit": "bool"},
            }
        },
        out=out,
    )


async def restart_and_memory(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    grants_n: int,
    namespaces_n: int,
    per_grant: int,
    unrelated: int,
    out: Path = RESULTS,
) -> tuple[Path, Path]:
    n_sources = 10
    src = "world-src"
    targets = [f"world-{i}" for i in range(namespaces_n)]
    await sources(kube, src, "contract", n_sources)
    await namespaces(kube, targets, {"bench": "world"})
    await gather_limited(
        ensure(
            kube,
            GRANTS,
            grant(
                f"world-{g}",
                (src, f"contract-{g % n_sources}"),
                targets=[targets[(g * per_grant + k) % namespaces_n] for k in range(per_grant)],
                target_name=f"copy-{g}",
            ),
        )
        for g in range(grants_n)
    )
    expected = grants_n * per_grant
    async with controller(kubeconfig, work / "controller-world-1.log", "--qps=0") as first:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            items, _ = await kube.list(SECRETS, label_selector=MANAGED, metadata_only=True)
            if (
                len([o for o in items if o["metadata"]["namespace"].startswith("world-")])
                >= expected
            ):
                break
            await asyncio.sleep(0.5)
        await settle(first, 900)
    t_start = time.monotonic()
    async with controller(kubeconfig, work / "controller-world-2.log") as second:
        ready = second.started and (time.monotonic() - second.started)
        await settle(second, 900)
        settled = time.monotonic() - t_start
        writes = second.writes()
        rss = second.rss_mib()
        # Unrelated Secrets: label-filtered watches never deliver them.
        cpu0, rss0 = second.cpu_seconds(), second.rss_mib()
        await namespaces(kube, ["unrelated"], {})
        t0 = time.monotonic()
        await gather_limited(
            ensure(kube, SECRETS, secret(f"u{i}", {"x": "y" * 64}), "unrelated")
            for i in range(unrelated)
        )
        took = time.monotonic() - t0
        await settle(second)
        cpu1, rss1 = second.cpu_seconds(), second.rss_mib()
    r1 = write_result(
        "restart",
        {"grants": grants_n, "copies": expected, "namespaces": namespaces_n},
        {
            "projector": {
                "time_to_ready": {"value": ready, "unit": "s"},
                "time_to_settled": {"value": settled, "unit": "s"},
                "writes_after_restart": {"value": writes, "unit": "writes"},
            }
        },
        out=out,
    )
    r2 = write_result(
        "memory",
        {"grants": grants_n, "copies": expected, "unrelated_secrets": unrelated},
        {
            "projector": {
                "rss_at_size": {"value": rss, "unit": "MiB"},
                "rss_delta_unrelated": {"value": rss1 - rss0, "unit": "MiB"},
                "cpu_during_unrelated": {"value": cpu1 - cpu0, "unit": "s", "over_seconds": took},
            }
        },
        out=out,
    )
    return r1, r2
