"""What a cleared Conflict costs and how soon it is noticed (issue 42 item 2).

    python -m benchmarks.conflicts [--conflicts 1000] [--window 180] [--samples 10]
                                   [--kubeconfig K] [--out DIR]

One control plane (fresh, unless --kubeconfig), one controller with its default flags
(`--conflict-recheck`'s 60 s included). Two worlds, each with its own grant:

- **one**: one grant, one target namespace blocked by a foreign, unlabelled Secret of the
  copy's name (the common case). Per sample: the foreign Secret is created, the grant reports
  the Conflict, 2 s pass (its place's watch has listed: milliseconds), then t0 just before the
  foreign Secret is deleted, t1 the watch event of the copy landing there.
- **many**: one selector grant over `--conflicts` namespaces, each blocked the same way. Once
  the grant reports every one conflicted, the controller's API requests (by verb and resource),
  reconciles, CPU and RSS are read over `--window` seconds of nothing happening: the steady cost
  of that many conflicts. Then `--samples` foreign Secrets are deleted one at a time, each
  timed as above: a cleared Conflict among many.

The conflict watches' own memory (the cache of namespace names, the records, one informer) is
measured in this process with tracemalloc, on an in-memory API listing `--conflicts` blockers.
Result: `<out>/conflicts.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, summary, write_result
from benchmarks.harness import (
    Watcher,
    controller,
    ensure,
    exported,
    gather_limited,
    grant,
    namespaces,
    secret,
)
from projector.client.api import Api, Request
from projector.client.kube import Kube
from projector.control.conflicts import ConflictWatches
from projector.core.grantspec import parse_grant
from projector.core.kinds import GRANTS, SECRETS, Obj
from projector.core.model import SourceKind, parse_source
from projector.core.plans import Action, Outcome, Plan, Reason, Snapshot, SourceState, Step
from tests.bed.launcher import ControllerProcess

SRC = "cf-src"
LABEL = {"bench-conflicts": "many"}
MANAGED = "projector.nebari.dev/managed-by=projector"


def _foreign(name: str) -> Obj:
    return secret(name, {"theirs": "not-projectors"})


async def _conflicted(kube: Kube, g: str, count: int, within: float = 600.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        obj = await kube.get(GRANTS, g)
        targets = (obj.get("status") or {}).get("targets") or {}
        if targets.get("conflicted") == count:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"grant {g} never reported {count} conflicts")


async def _cleared(kube: Kube, watcher: Watcher, ns: str, name: str) -> float:
    """Delete the foreign Secret at (ns, name): seconds until the copy's watch event."""
    t0 = time.monotonic()
    await kube.delete(SECRETS, name, namespace=ns)
    t1 = await watcher.until(lambda: (ns, name) in watcher.values, within=120)
    return t1 - t0


def _requests(c: ControllerProcess) -> Counter[str]:
    out: Counter[str] = Counter()
    for (name, labels), value in c.metrics().items():
        if name == "projector_api_requests_total":
            lab = dict(labels)
            out[f"{lab.get('verb')} {lab.get('resource')}"] += int(value)
    return out


async def _one(kube: Kube, watcher: Watcher, samples: int) -> list[float]:
    """Per sample a fresh namespace, blocked, and a fresh grant into it (deleted after)."""
    await ensure(kube, SECRETS, exported("one", {"token": "t"}), SRC)
    out = []
    for i in range(samples):
        ns, g = f"cf-one-{i}", f"cf-one-{i}"
        await namespaces(kube, [ns], {})
        await kube.create(SECRETS, _foreign("one"), namespace=ns)
        await kube.create(GRANTS, grant(g, (SRC, "one"), targets=[ns]))
        await _conflicted(kube, g, 1)
        await asyncio.sleep(2.0)  # the place's watch lists in milliseconds; the recheck is 60 s
        out.append(await _cleared(kube, watcher, ns, "one"))
        await kube.delete(GRANTS, g)
    return out


async def _many(
    kube: Kube, c: ControllerProcess, watcher: Watcher, count: int, window: float, samples: int
) -> dict[str, Any]:
    names = [f"cf-{i:05d}" for i in range(count)]
    await namespaces(kube, names, LABEL)
    await gather_limited(ensure(kube, SECRETS, _foreign("hub"), n) for n in names)
    await ensure(kube, SECRETS, exported("hub", {"token": "t"}), SRC)
    watches0 = c.logs().count('"conflict place watched"')
    started = time.monotonic()
    await kube.create(GRANTS, grant("cf-many", (SRC, "hub"), selector=LABEL))
    await _conflicted(kube, "cf-many", count)
    first = time.monotonic() - started
    before, cpu0, rss0 = _requests(c), c.cpu_seconds(), c.rss_mib()
    reconciles0 = c.metric("projector_reconcile_total")
    await asyncio.sleep(window)  # nothing happens: what do `count` conflicts cost meanwhile?
    after, cpu1, rss1 = _requests(c), c.cpu_seconds(), c.rss_mib()
    reconciles = c.metric("projector_reconcile_total") - reconciles0
    per_minute = {k: round((after[k] - before[k]) * 60 / window, 1) for k in sorted(after)}
    # Spread over the grant's namespaces, the last included: a reconcile writes them in order.
    picked = [names[(i + 1) * count // samples - 1] for i in range(samples)]
    latencies = []
    for ns in picked:
        latencies.append(await _cleared(kube, watcher, ns, "hub"))
        await _conflicted(kube, "cf-many", count - len(latencies))
    # Every other blocker deleted at once: what a clean-up costs, and how soon it is done.
    rest = [n for n in names if n not in picked]
    before, reconciles0 = _requests(c), c.metric("projector_reconcile_total")
    t0 = time.monotonic()
    await gather_limited(kube.delete(SECRETS, "hub", namespace=n) for n in rest)
    deleted = time.monotonic() - t0
    t1 = await watcher.until(lambda: all((n, "hub") in watcher.values for n in rest), 600)
    await _conflicted(kube, "cf-many", 0)
    after = _requests(c)
    return {
        "first_reconcile_s": round(first, 2),
        "requests_per_minute": {k: v for k, v in per_minute.items() if v},
        "reconciles_per_minute": round(reconciles * 60 / window, 2),
        "cpu_s_per_minute": round((cpu1 - cpu0) * 60 / window, 3),
        "rss_mib": [round(rss0, 1), round(rss1, 1)],
        "watches": c.logs().count('"conflict place watched"') - watches0,
        "cleared": latencies,
        "clean_up": {
            "blockers": len(rest),
            "deleted_in_s": round(deleted, 2),
            "all_copies_in_s": round(t1 - t0, 2),
            "reconciles": c.metric("projector_reconcile_total") - reconciles0,
            "requests": {k: after[k] - before[k] for k in sorted(after) if after[k] - before[k]},
        },
    }


class _Listing(Api):
    """An API that lists `count` blockers of one name, then holds a quiet watch."""

    def __init__(self, count: int) -> None:
        self.items = [
            {"metadata": {"name": "hub", "namespace": f"cf-{i:05d}", "resourceVersion": "1"}}
            for i in range(count)
        ]
        self.watching = asyncio.Event()

    async def send(self, req: Request) -> Obj:
        query = dict(req.query)
        start = int(query.get("continue", "0"))
        end = start + int(query["limit"])
        meta: Obj = {"resourceVersion": "1"} | (
            {"continue": str(end)} if end < len(self.items) else {}
        )
        return {
            "kind": "PartialObjectMetadataList",
            "metadata": meta,
            "items": self.items[start:end],
        }

    async def stream(
        self, req: Request, read_deadline: float
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        yield "OPEN", {}
        self.watching.set()
        await asyncio.Event().wait()


def _snapshot() -> Snapshot:
    """One grant of a source to one namespace, parsed as the controller parses them."""
    grant = parse_grant(
        {
            "metadata": {"name": "g", "uid": "uid-g", "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"source": {"namespace": SRC, "name": "hub"}, "target": {"namespaces": ["a"]}},
        }
    )
    meta = {"namespace": SRC, "name": "hub", "uid": "uid-hub"}
    source = parse_source({"metadata": meta, "data": {"token": "dDA="}})
    return Snapshot("g", grant, source, SourceState.AVAILABLE, {}, {}, frozenset({str(grant.uid)}))


async def _structures(count: int) -> float:
    """KiB the conflict watches hold for one grant with `count` conflicts at one place."""
    api = _Listing(count)
    plan = Plan(_snapshot(), SourceState.AVAILABLE, None, (), count)
    outcomes = [
        Outcome(
            Step(m["metadata"]["namespace"], Action.CREATE, Reason.PROJECTED, None, "hub"),
            Reason.CONFLICT,
        )
        for m in api.items
    ]
    watches = ConflictWatches(api, lambda names: None)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    watches.record("g", plan, outcomes)
    task = asyncio.create_task(watches.run())
    await asyncio.wait_for(api.watching.wait(), 30)
    assert watches.watching() == {(SourceKind.SECRET, "hub")}
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    watches.stop()
    await task
    return held / 1024


async def run(
    kubeconfig: Path, work: Path, count: int, window: float, samples: int
) -> dict[str, Any]:
    kube = await Kube.connect(str(kubeconfig), qps=0)
    try:
        await namespaces(kube, [SRC], {})
        async with (
            controller(kubeconfig, work / "controller.log", "--log-level=info") as c,
            Watcher(kube, MANAGED, "token") as watcher,
        ):
            one = await _one(kube, watcher, samples)
            many = await _many(kube, c, watcher, count, window, samples)
    finally:
        await kube.close()
    return {"one": one, "many": many, "structures_kib": round(await _structures(count), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.conflicts")
    p.add_argument("--conflicts", type=int, default=1_000)
    p.add_argument("--window", type=float, default=180.0)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--kubeconfig", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work", type=Path, help="keep the control plane's and controller's files here")
    a = p.parse_args(argv)
    from benchmarks.harness import control_plane

    with tempfile.TemporaryDirectory(prefix="bench-conflicts-") as tmp:
        work = a.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if a.kubeconfig:
            r = asyncio.run(run(a.kubeconfig, work, a.conflicts, a.window, a.samples))
        else:
            with control_plane(work / "plane") as plane:
                r = asyncio.run(run(plane.kubeconfig, work, a.conflicts, a.window, a.samples))
    many = r["many"]
    path = write_result(
        "conflicts",
        {"conflicts": a.conflicts, "window_s": a.window, "samples": a.samples, "flags": "defaults"},
        {
            "projector, one conflict": {"cleared -> copy": summary(r["one"], "s")},
            f"projector, {a.conflicts:,} conflicts": {
                "cleared -> copy": summary(many.pop("cleared"), "s")
            },
        },
        out=a.out,
        extra={"steady": many, "conflict_watch_structures_kib": r["structures_kib"]},
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
