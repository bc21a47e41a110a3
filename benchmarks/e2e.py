"""End-to-end benchmarks against the real control plane, each beside its floor, in one run.

- fanout:  1 source -> N namespaces; from the source update's response to the last copy seen
           (by watch) with the new value. Floor: the same N PUTs by a bare asyncio writer, same
           HTTP stack, same concurrency, timed to the last write seen by the same kind of watch.
- latency: one source, one copy, updates at a fixed rate; from the update's response to the
           copy seen. Floor: two raw write-and-watch round trips (what the controller must do).
- burst:   many updates in about a second to one source with many copies: writes per copy
           (MODIFIED events seen), and whether the final state is exact.
- restart: a world of G grants x K namespaces; restart the controller: time to ready, time to
           settled, writes issued (must be 0); RSS at that size; then RSS and CPU while as many
           unrelated Secrets as copies are created.
Samples alternate between projector and the floor, so drift in machine load hits both alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from benchmarks import peers
from benchmarks.common import RESULTS, summary, write_result
from benchmarks.harness import (
    EXPORT,
    Watcher,
    controller,
    ensure,
    gather_limited,
    grant,
    namespaces,
    put_value,
    secret,
    settle,
    unb64,
)
from projector.api import GRANTS, SECRETS, Obj
from projector.kube import Kube
from tests.support import api_client, b64

MANAGED = "projector.nebari.dev/managed-by=projector"
EXPORT_ALL = {"projector.nebari.dev/export-to": "*"}
WRITE_CONCURRENCY = 32  # projector's default --write-concurrency; the floor uses the same


async def _floor_round(
    kube: Kube,
    bodies: dict[tuple[str, str], Obj],
    key: str,
    value: str,
    limit: int = WRITE_CONCURRENCY,
) -> None:
    """PUT every body with a new value (each with its last known resourceVersion)."""

    async def one(k: tuple[str, str]) -> None:
        body = bodies[k]
        body["data"][key] = b64(value)
        bodies[k] = await kube.replace(SECRETS, body, namespace=k[0])

    await gather_limited((one(k) for k in bodies), limit)


async def fanout(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    n: int,
    reps: int,
    flags: Sequence[str] = (),
    out: Path = RESULTS,
    name: str = "",
    peer_reps: int = 0,
) -> Path:
    tag = f"fan{n}"
    src, targets = f"{tag}-src", [f"{tag}-{i}" for i in range(n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": tag})
    await ensure(
        kube, SECRETS, secret("hub", {"token": "v0"}, labels=EXPORT, annotations=EXPORT_ALL), src
    )
    await gather_limited(
        ensure(kube, SECRETS, secret("floor", {"token": "v0"}, labels={"bench-floor": tag}), ns)
        for ns in targets
    )
    await ensure(kube, GRANTS, grant(tag, (src, "hub"), selector={"bench": tag}))
    copies = [(ns, "hub") for ns in targets]
    floor_items, _ = await kube.list(SECRETS, label_selector=f"bench-floor={tag}")
    bodies = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in floor_items}
    proj: list[float] = []
    floor: list[float] = []
    run = name or f"fanout-{n}"  # values unique to this run: a rerun never sees old ones
    start = f"{run}-v0"
    await put_value(kube, src, "hub", "token", start)
    async with (
        controller(kubeconfig, work / f"controller-{run}.log", *flags),
        Watcher(kube, MANAGED, "token") as watch,
        Watcher(kube, f"bench-floor={tag}", "token") as fwatch,
    ):
        await watch.until(watch.all_equal(copies, start), 600)
        for r in range(1, reps + 1):
            value = f"{run}-v{r}"
            t0 = await put_value(kube, src, "hub", "token", value)
            proj.append(await watch.until(watch.all_equal(copies, value), 600) - t0)
            t0 = time.monotonic()
            await _floor_round(kube, bodies, "token", value)
            floor.append(await fwatch.until(fwatch.all_equal(bodies, value), 600) - t0)
    await kube.delete(GRANTS, tag)
    p, f = summary([s * 1000 for s in proj], "ms"), summary([s * 1000 for s in floor], "ms")
    systems: dict[str, Any] = {"projector": {"last_copy": p}, "floor": {"last_copy": f}}
    ratios = {
        "projector/floor p50": p["median"] / f["median"],
        "projector/floor p99": p["p99"] / f["p99"],
    }
    unavailable: dict[str, str] = {}
    if peer_reps:
        for peer in peers.all_peers():
            try:
                samples = await _peer_fanout(kube, kubeconfig, work, peer, tag, targets, peer_reps)
            except peers.PeerUnavailable as e:
                unavailable[peer.name] = str(e).strip().splitlines()[-1][:300]
                continue
            s_peer = summary([x * 1000 for x in samples], "ms")
            systems[f"{peer.name} {peer.version}"] = {"last_copy": s_peer}
            ratios[f"projector/{peer.name} p50"] = p["median"] / s_peer["median"]
    return write_result(
        name or f"fanout-{n}",
        {
            "namespaces": n,
            "repetitions": reps,
            "flags": list(flags),
            "write_concurrency": WRITE_CONCURRENCY,
            "peer_repetitions": peer_reps,
            "peers_unavailable": unavailable,
        },
        systems,
        ratios,
        out=out,
    )


async def _peer_fanout(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    peer: peers.Peer,
    tag: str,
    targets: list[str],
    reps: int,
) -> list[float]:
    """The same fan-out by a peer, run with its defaults; its own source and copies."""
    peer.ensure_built()
    src, name = f"{tag}-peer-src", f"{tag}-peer"
    await namespaces(kube, [src], {})
    await ensure(kube, SECRETS, secret(name, {"token": "v0"}), src)
    api = api_client(kubeconfig)
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    proc = peer.start(kubeconfig, work / f"{peer.name}-{tag}.log")
    samples: list[float] = []
    try:
        await asyncio.to_thread(peer.wait_ready, proc)
        await asyncio.to_thread(
            peer.setup_fanout, core, custom, src, name, targets, 1200.0, {"bench-peer": tag}
        )
        copies = [(ns, peer.copy_name(name)) for ns in targets]
        async with Watcher(kube, f"bench-peer={tag}", "token") as watch:
            await watch.until(watch.all_equal(copies, "v0"), 1200)
            for r in range(1, reps + 1):
                value = f"v{r}"
                t0 = await put_value(kube, src, name, "token", value)
                samples.append(await watch.until(watch.all_equal(copies, value), 1200) - t0)
    finally:
        peers.stop(proc)
        api.close()
    return samples


async def latency(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    updates: int,
    rate: float,
    debounces: Sequence[str] = ("0", "default"),
    out: Path = RESULTS,
) -> Path:
    src, dst = "lat-src", "lat-dst"
    await namespaces(kube, [src, dst], {})
    await ensure(
        kube, SECRETS, secret("hub", {"token": "v0"}, labels=EXPORT, annotations=EXPORT_ALL), src
    )
    for n in ("floor-a", "floor-b"):
        await ensure(kube, SECRETS, secret(n, {"token": "v0"}, labels={"bench-floor": "lat"}), dst)
    await ensure(kube, GRANTS, grant("lat", (src, "hub"), targets=[dst]))
    systems: dict[str, Any] = {}
    floor: list[float] = []
    items, _ = await kube.list(SECRETS, label_selector="bench-floor=lat")
    bodies = {o["metadata"]["name"]: o for o in items}
    counter = 0
    for debounce in debounces:
        flags = [] if debounce == "default" else [f"--debounce={debounce}"]
        samples: list[float] = []
        async with (
            controller(kubeconfig, work / f"controller-lat-{debounce}.log", *flags),
            Watcher(kube, MANAGED, "token") as watch,
            Watcher(kube, "bench-floor=lat", "token") as fwatch,
        ):
            await watch.until(lambda: (dst, "hub") in watch.values, 120)
            start = time.monotonic()
            for i in range(updates):
                counter += 1
                value = f"v{counter}"
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
                t0 = await put_value(kube, src, "hub", "token", value)
                samples.append(await watch.until(watch.all_equal([(dst, "hub")], value)) - t0)
                # the floor: write A, see A, write B, see B
                t0 = time.monotonic()
                for n in ("floor-a", "floor-b"):
                    body = bodies[n]
                    body["data"]["token"] = b64(value)
                    bodies[n] = await kube.replace(SECRETS, body, namespace=dst)
                    await fwatch.until(fwatch.all_equal([(dst, n)], value))
                floor.append(time.monotonic() - t0)
        systems[f"projector (debounce {debounce})"] = {
            "end_to_end": summary([s * 1000 for s in samples], "ms")
        }
    f = summary([s * 1000 for s in floor], "ms")
    systems["floor (2 write+watch round trips)"] = {"end_to_end": f}
    ratios = {
        f"{k} / floor p50": v["end_to_end"]["median"] / f["median"]
        for k, v in systems.items()
        if k.startswith("projector")
    }
    await kube.delete(GRANTS, "lat")
    return write_result(
        "latency",
        {"updates": updates, "rate_per_s": rate, "debounces": list(debounces)},
        systems,
        ratios,
        out=out,
    )


async def burst(
    kube: Kube, kubeconfig: Path, work: Path, updates: int, copies_n: int, out: Path = RESULTS
) -> Path:
    src, targets = "burst-src", [f"burst-{i}" for i in range(copies_n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": "burst"})
    await ensure(
        kube, SECRETS, secret("hub", {"token": "v0"}, labels=EXPORT, annotations=EXPORT_ALL), src
    )
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
    sources = 10
    src = "world-src"
    targets = [f"world-{i}" for i in range(namespaces_n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": "world"})
    for s in range(sources):
        await ensure(
            kube,
            SECRETS,
            secret(
                f"contract-{s}",
                {"token": f"t{s}", "id": f"i{s}"},
                labels=EXPORT,
                annotations=EXPORT_ALL,
            ),
            src,
        )
    await gather_limited(
        ensure(
            kube,
            GRANTS,
            grant(
                f"world-{g}",
                (src, f"contract-{g % sources}"),
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
