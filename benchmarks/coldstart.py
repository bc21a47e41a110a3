"""A replica's cold start over synced copies, beside the floor of the same LIST requests.

World, grown in place: `NAMESPACES` namespaces carrying one label, and one grant per 1,000
copies, each selecting them all from its own opted-in source (so 100 grants at 100,000 copies).
A controller writes each size's new copies and stops. Then, `rounds` times, alternating:

- projector: a new controller process over the world, its defaults; seconds from the process's
  start to its probe port's first answer (started: imports, credentials, ports; its lists
  begin), to /readyz (every cache listed) and to settled (every grant planned and reconciled),
  and its writes (must be 0);
- floor: the LIST requests projector's informers issue, the same (each kind's resource, label
  selector and page size, `projector.cache.caches`' specs, all kinds at once as its informers
  list, consistent reads with `limit` and `continue`), by a bare client in this process
  (aiohttp, each page read and parsed by orjson, nothing kept): seconds from the first request
  to the last page: what the API server itself takes to serve the lists.

The goal is two (`benchmarks.report.restart_floor_row`): started within 1 s, and settled minus
started within 1.5x the floor at every size. The start is a fixed cost of the process (CPython
and its libraries' imports: ~0.8 s of CPU), the same at every size, which the floor, a client
already running, does not pay: at 10,000 copies it is half the floor.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson

from benchmarks.common import RESULTS, summary, write_result
from benchmarks.floor import ssl_and_headers
from benchmarks.harness import (
    controller,
    ensure,
    exported,
    gather_limited,
    grant,
    namespaces,
    settle,
)
from projector.cache.caches import (
    CONFIG_COPY_SPEC,
    CONFIG_SOURCE_SPEC,
    COPY_SPEC,
    EXPORT_SPEC,
    GRANT_SPEC,
    NAMESPACE_SPEC,
    SOURCE_SPEC,
    Spec,
)
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, SECRETS
from projector.core.model import MANAGED_BY_LABEL, MANAGED_BY_VALUE

NAMESPACES = 1_000
LABEL = "bench-coldstart"
SPECS: tuple[Spec[Any, Any], ...] = (
    GRANT_SPEC,
    EXPORT_SPEC,
    NAMESPACE_SPEC,
    SOURCE_SPEC,
    COPY_SPEC,
    CONFIG_SOURCE_SPEC,
    CONFIG_COPY_SPEC,
)
"""What a replica lists at start (with --configmaps, its default; no rollouts)."""


async def _list_all(session: aiohttp.ClientSession, server: str, spec: Spec[Any, Any]) -> int:
    """One kind's list, page by page; the objects it held."""
    query: dict[str, str] = {"limit": str(spec.page)}
    if spec.label_selector:
        query["labelSelector"] = spec.label_selector
    count = 0
    while True:
        async with session.get(
            f"{server}{spec.resource.root}/{spec.resource.plural}?{urlencode(query)}"
        ) as r:
            body = orjson.loads(await r.read())
            if r.status != 200:
                raise RuntimeError(f"list {spec.resource.plural}: {r.status}")
        count += len(body.get("items") or ())
        token = body["metadata"].get("continue")
        if not token:
            return count
        query["continue"] = token


async def floor(kubeconfig: Path) -> tuple[float, int]:
    """Seconds to list every kind at once as projector's informers do; the objects listed."""
    server, ssl_ctx, headers = ssl_and_headers(kubeconfig)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=len(SPECS)), headers=headers
    ) as session:
        t0 = time.monotonic()
        counts = await asyncio.gather(*(_list_all(session, server, s) for s in SPECS))
        return time.monotonic() - t0, sum(counts)


async def _count(kube: Kube, own: bool = False) -> int:
    """Copies in the cluster; `own`: only this benchmark's (`copy-<g>` in `cold-<i>`)."""
    items, _ = await kube.list(
        SECRETS, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}", metadata_only=True
    )
    if not own:
        return len(items)
    return sum(
        1
        for o in items
        if o["metadata"]["namespace"].startswith("cold-")
        and o["metadata"]["name"].startswith("copy-")
    )


async def _grow(kube: Kube, kubeconfig: Path, work: Path, have: int, copies: int) -> None:
    """Add grants (1,000 copies each) until the world holds `copies` of them; written once."""
    targets = [f"cold-{i}" for i in range(NAMESPACES)]
    await namespaces(kube, ["cold-src"], {})
    await namespaces(kube, targets, {LABEL: "yes"})
    new = range(have // NAMESPACES, copies // NAMESPACES)
    await gather_limited(
        ensure(kube, SECRETS, exported(f"src-{g}", {"token": f"t{g}"}), "cold-src") for g in new
    )
    async with controller(kubeconfig, work / f"coldstart-build-{copies}.log") as c:
        for g in new:
            body = grant(f"cold-{g}", ("cold-src", f"src-{g}"), selector={LABEL: "yes"})
            body["spec"]["target"]["name"] = f"copy-{g}"
            await ensure(kube, GRANTS, body)
        deadline = time.monotonic() + 3600
        while await _count(kube, own=True) < copies:
            if time.monotonic() > deadline:
                raise TimeoutError(f"never {copies} copies")
            await asyncio.sleep(2)
        await settle(c, 3600)


async def run(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    sizes: tuple[int, ...],
    rounds: int,
    out: Path = RESULTS,
) -> Path:
    points: list[dict[str, Any]] = []
    have = 0
    for size in sizes:
        await _grow(kube, kubeconfig, work, have, size)
        have = size
        in_cluster = await _count(kube)  # other benchmarks' copies too: in both systems' lists
        started, ready, settled, floors, writes, listed = [], [], [], [], [], 0
        for r in range(rounds):
            log = work / f"coldstart-{size}-{r}.log"
            async with controller(kubeconfig, log) as c:
                ready.append(time.monotonic() - c.started)  # from the process's start
                assert c.answered is not None  # the port answered before it was ready
                started.append(c.answered - c.started)
                await settle(c, 3600)
                settled.append(time.monotonic() - c.started)
                writes.append(c.writes())
            seconds, listed = await floor(kubeconfig)
            floors.append(seconds)
        after = [s - t for s, t in zip(settled, started, strict=True)]
        s_started, s_ready, s_settled, s_after, s_floor = (
            summary(x, "s") for x in (started, ready, settled, after, floors)
        )
        point = {
            "copies": size,
            "copies_in_cluster": in_cluster,
            "objects_listed": listed,
            "started_s": s_started,
            "ready_s": s_ready,
            "settled_s": s_settled,
            "settled_after_start_s": s_after,
            "floor_s": s_floor,
            "writes": writes,
            "settled/floor p50": s_settled["median"] / s_floor["median"],
            "ready/floor p50": s_ready["median"] / s_floor["median"],
            "after start/floor p50": s_after["median"] / s_floor["median"],
        }
        points.append(point)
    systems = {
        f"{p['copies_in_cluster']:,} copies": {
            "projector started": p["started_s"],
            "projector ready": p["ready_s"],
            "projector settled": p["settled_s"],
            "projector settled, after its start": p["settled_after_start_s"],
            "floor (the same lists, bare client)": p["floor_s"],
        }
        for p in points
    }
    ratios = {}
    for p in points:
        at = f"{p['copies_in_cluster']:,} copies"
        ratios[f"{at}: settled/floor p50"] = p["settled/floor p50"]
        ratios[f"{at}: ready/floor p50"] = p["ready/floor p50"]
        ratios[f"{at}: settled after start/floor p50"] = p["after start/floor p50"]
    params = {"sizes": list(sizes), "rounds": rounds, "namespaces": NAMESPACES}
    return write_result("restart-floor", params, systems, ratios, out=out, extra={"points": points})
