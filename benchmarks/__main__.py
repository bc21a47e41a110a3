"""`python -m benchmarks [full|quick|tiny]`: start a control plane, run every benchmark.

full: the sizes of DESIGN §8 (tens of minutes); quick: under 5 minutes; tiny: seconds, the
smoke run inside `make test` so the benchmark code never rots (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import e2e, failover, hotpath
from benchmarks.common import RESULTS
from benchmarks.harness import control_plane
from projector.kube import Kube

SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "hot": (10, 1_000, 10_000),
        "hot_repeats": 15,
        "fanout": ((100, 30), (1_000, 8)),
        "peer_reps": {100: 3, 1_000: 1},
        "latency": (300, 20.0),
        "burst": (1_000, 100),
        "world": (1_000, 1_000, 10, 10_000),
        "failover": (3, ("defaults (15 s lease)", "5 s lease")),
    },
    "quick": {
        "hot": (10, 1_000),
        "hot_repeats": 7,
        "fanout": ((100, 10), (1_000, 3)),
        "peer_reps": {100: 2},
        "latency": (100, 20.0),
        "burst": (1_000, 100),
        "world": (100, 100, 10, 1_000),
        "failover": (1, ("5 s lease",)),
    },
    "tiny": {
        "hot": (10,),
        "hot_repeats": 2,
        "fanout": ((5, 2),),
        "peer_reps": {},
        "latency": (3, 20.0),
        "burst": (20, 3),
        "world": (4, 4, 2, 10),
        "failover": (1, ("2 s lease",)),
    },
}


async def run_e2e(
    kubeconfig: Path, work: Path, size: dict[str, Any], out: Path, only: set[str]
) -> list[Path]:
    kube = await Kube.connect(str(kubeconfig), qps=0)
    paths: list[Path] = []
    try:
        if "fanout" in only:
            for n, reps in size["fanout"]:
                peer_reps = size["peer_reps"].get(n, 0)
                paths.append(
                    await e2e.fanout(kube, kubeconfig, work, n, reps, out=out, peer_reps=peer_reps)
                )
                if n >= 1_000:  # the default client-side rate limit, then without it
                    paths.append(
                        await e2e.fanout(
                            kube,
                            kubeconfig,
                            work,
                            n,
                            reps,
                            ["--qps=0"],
                            out=out,
                            name=f"fanout-{n}-qps0",
                        )
                    )
        if "latency" in only:
            updates, rate = size["latency"]
            paths.append(await e2e.latency(kube, kubeconfig, work, updates, rate, out=out))
        if "burst" in only:
            n_updates, n_copies = size["burst"]
            paths.append(await e2e.burst(kube, kubeconfig, work, n_updates, n_copies, out=out))
        if "failover" in only:
            runs, leases = size["failover"]
            paths.append(await failover.failover(kube, kubeconfig, work, runs, leases, out=out))
        if "restart" in only:
            g, ns, per, unrelated = size["world"]
            paths.extend(
                await e2e.restart_and_memory(kube, kubeconfig, work, g, ns, per, unrelated, out)
            )
    finally:
        await kube.close()
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("size", nargs="?", default="quick", choices=sorted(SIZES))
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--only", default="hotpath,fanout,latency,burst,failover,restart")
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="use this admin kubeconfig's cluster instead of starting a control plane",
    )
    a = p.parse_args(argv)
    size, only = SIZES[a.size], set(a.only.split(","))
    os.environ["PROJECTOR_BENCH_SIZE"] = a.size  # recorded in every result file
    started = time.monotonic()
    paths: list[Path] = []
    if "hotpath" in only:
        paths.append(hotpath.run(size["hot"], size["hot_repeats"], out=a.out))
    work = Path(tempfile.mkdtemp(prefix="projector-bench-"))
    try:
        if a.kubeconfig:
            paths += asyncio.run(run_e2e(a.kubeconfig, work, size, a.out, only))
        else:
            with control_plane(work / "plane") as plane:
                paths += asyncio.run(run_e2e(plane.kubeconfig, work, size, a.out, only))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for path in paths:
        print(f"wrote {path}")
    print(f"benchmarks ({a.size}) done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
