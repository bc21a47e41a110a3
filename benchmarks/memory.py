"""RSS before and after a memory change, side by side in one run, at sizes that give slopes.

    python -m benchmarks.memory <before-commit> [<after-commit>] [--rounds N] [--kubeconfig K]

One control plane; the world grows in place, one axis at a time (cumulative), and at every
point each version of `projector/` (a commit's files, `git archive`, imported with `-P` so the
working tree is not on the path) runs its own controller over it, versions alternating round by
round: start, settle (every grant reconciled, the queue empty), read VmRSS, stop. Writes after
each start must be 0 (the world was written once, by the after version, with `--qps 0`).

Points: the empty cluster (idle); + namespaces (500, 1,000); + one-copy grants (500, 1,000);
then the 1,000 grants widened to 5 and 10 copies each (10,000 copies at 1,000 namespaces: the
memory benchmark's world). Slopes: least squares over each axis's three points (its first
point is the previous axis's last); bytes per grant are the grants slope minus one copy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.before_after import export
from benchmarks.common import REPO, summary, write_result
from benchmarks.e2e import MANAGED
from benchmarks.harness import (
    controller_python,
    ensure,
    gather_limited,
    grant,
    namespaces,
    own_namespace,
    settle,
    sources,
    wait_ready,
)
from benchmarks.scaling import fit
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, SECRETS
from tests.bed.launcher import ControllerProcess, launch

SRC = "mem-src"
SOURCES = 10
NS_STEPS = (500, 1_000)
GRANT_STEPS = (500, 1_000)
PER_GRANT_STEPS = (5, 10)


def _targets(g: int, per: int, n: int) -> list[str]:
    return [f"mem-{(g * per + k) % n}" for k in range(per)]


async def _grants(kube: Kube, start: int, stop: int, per: int, n: int) -> None:
    async def one(g: int) -> None:
        body = grant(f"mem-{g}", (SRC, f"src-{g % SOURCES}"), targets=_targets(g, per, n))
        body["spec"]["target"]["name"] = f"copy-{g}"
        try:
            old = await kube.get(GRANTS, f"mem-{g}")
        except Exception:  # absent: create it
            await ensure(kube, GRANTS, body)
            return
        old["spec"] = body["spec"]
        await kube.replace(GRANTS, old)

    await gather_limited(one(g) for g in range(start, stop))


async def _write_world(kubeconfig: Path, work: Path, path: Path, copies: int) -> None:
    """Let the after version write every copy (unthrottled), then stop it."""
    c = _start(kubeconfig, work / "writer.log", path, "--qps=0")
    try:
        await wait_ready(c)
        kube = await Kube.connect(str(kubeconfig), qps=0)
        try:
            deadline = asyncio.get_running_loop().time() + 900
            while asyncio.get_running_loop().time() < deadline:
                items, _ = await kube.list(SECRETS, label_selector=MANAGED, metadata_only=True)
                if len(items) >= copies:
                    break
                await asyncio.sleep(0.5)
        finally:
            await kube.close()
        await settle(c, 900)
    finally:
        c.stop(timeout=30)


def _start(kubeconfig: Path, log: Path, path: Path, *extra: str) -> ControllerProcess:
    own_namespace(kubeconfig)
    return launch(
        kubeconfig,
        log,
        "--log-level=warning",
        *extra,
        python=controller_python(),
        prefix=("-P",),
        env={"PYTHONPATH": str(path)},
    )


async def _measure(kubeconfig: Path, log: Path, path: Path, grants: int) -> dict[str, float]:
    c = _start(kubeconfig, log, path)
    try:
        await wait_ready(c)
        if grants:  # settled means a reconcile ran: with no grant, none does
            await settle(c, 900)
        else:
            await asyncio.sleep(3.0)
        await asyncio.sleep(1.0)  # let the last responses' buffers go
        return {"rss": c.rss_mib(), "writes": c.writes()}
    finally:
        c.stop(timeout=30)


async def run(
    kubeconfig: Path, work: Path, versions: dict[str, Path], rounds: int
) -> dict[str, Any]:
    kube = await Kube.connect(str(kubeconfig), qps=0)
    points: list[dict[str, Any]] = []
    after = list(versions.values())[-1]
    n = grants_n = per = 0

    async def point(axis: str) -> None:
        copies = grants_n * per
        if copies:
            await _write_world(kubeconfig, work, after, copies)
        rss: dict[str, list[float]] = {v: [] for v in versions}
        writes = 0.0
        for r in range(rounds):
            for v, path in versions.items():
                log = work / f"{axis}-{n}-{grants_n}-{per}-{v}-{r}.log"
                m = await _measure(kubeconfig, log, path, grants_n)
                rss[v].append(m["rss"])
                writes += m["writes"]
        p = {
            "axis": axis,
            "namespaces": n,
            "grants": grants_n,
            "copies": copies,
            "rss_mib": rss,
            "writes": writes,
            "load": os.getloadavg()[0],
        }
        print(p, flush=True)
        points.append(p)

    try:
        await sources(kube, SRC, "src", SOURCES)
        await point("idle")
        for n_ in NS_STEPS:
            await namespaces(kube, [f"mem-{i}" for i in range(n, n_)], {"bench": "mem"})
            n = n_
            await point("namespaces")
        per = 1
        for g in GRANT_STEPS:
            await _grants(kube, grants_n, g, per, n)
            grants_n = g
            await point("grants")
        for p_ in PER_GRANT_STEPS:
            per = p_
            await _grants(kube, 0, grants_n, per, n)
            await point("copies")
    finally:
        await kube.close()
    return {"points": points}


def slopes(points: list[dict[str, Any]], version: str) -> dict[str, float]:
    """Bytes per namespace, grant and copy; idle MiB (medians of each point's rounds)."""

    def med(p: dict[str, Any]) -> float:
        return statistics.median(p["rss_mib"][version])

    def axis(name: str, x: str) -> float:
        pts = [
            p
            for i, p in enumerate(points)
            if p["axis"] == name
            or (i + 1 < len(points) and points[i + 1]["axis"] == name and p["axis"] != name)
        ]
        return fit([p[x] for p in pts], [med(p) for p in pts])["b"] * 2**20

    per_copy = axis("copies", "copies")
    return {
        "idle_mib": med(points[0]),
        "bytes_per_namespace": axis("namespaces", "namespaces"),
        "bytes_per_copy": per_copy,
        "bytes_per_grant": axis("grants", "grants") - per_copy,
        "rss_at_target_mib": med(points[-1]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory")
    p.add_argument("before")
    p.add_argument("after", nargs="?", default="HEAD")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kubeconfig", type=Path)
    a = p.parse_args(argv)
    from benchmarks.harness import control_plane

    with tempfile.TemporaryDirectory(prefix="projector-mem-") as tmp:
        work = Path(tmp)
        versions = {
            "before": export(a.before, work / "before"),
            "after": export(a.after, work / "after"),
        }
        if a.kubeconfig:
            result = asyncio.run(run(a.kubeconfig, work, versions, a.rounds))
        else:
            with control_plane(work / "plane") as plane:
                result = asyncio.run(run(plane.kubeconfig, work, versions, a.rounds))
    pts = result["points"]
    systems = {
        f"{v} ({c})": {
            **{
                k: {"value": round(x, 1), "unit": "B" if k.startswith("bytes") else "MiB"}
                for k, x in slopes(pts, v).items()
            },
            "rss_per_point": summary([min(p["rss_mib"][v]) for p in pts], "MiB"),
        }
        for v, c in (("before", a.before), ("after", a.after))
    }
    path = write_result(
        "memory-before-after",
        {"before": a.before, "after": a.after, "rounds": a.rounds, "points": pts},
        systems,
        out=REPO / ".local/before-after",  # an experiment: git history keeps it, not results/
    )
    for name, s in systems.items():
        print(name, {k: v["value"] for k, v in s.items() if "value" in v})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
