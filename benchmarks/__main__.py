"""`python -m benchmarks [full|quick|tiny]`: start a control plane, run every benchmark.

full: the sizes of DESIGN §8 (tens of minutes), into benchmarks/results/; quick: small sizes
(about 10 minutes with the peers), into benchmarks/results-quick/; tiny: the smoke run inside
`make test` so the benchmark code never rots (its numbers mean nothing; peers only if already
built, never built by it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import coldstart, e2e, failover, fairness, hostile, hotpath, scaling, tenant
from benchmarks.common import RESULTS
from benchmarks.harness import control_plane
from projector.client.kube import Kube

SIZES: dict[str, dict[str, Any]] = {
    # fanout: (namespaces, blocks, samples per block); every block adds one warm-up sample.
    # peer_blocks: how many of those blocks each peer gets (the first ones), by namespaces.
    # latency: (blocks, samples per block, updates per second).
    "full": {
        "hot": (10, 1_000, 10_000),
        "hot_repeats": 15,
        "fanout": ((100, 10, 3), (1_000, 9, 1), (5_000, 3, 1)),
        "peer_blocks": {100: 5, 1_000: 9, 5_000: 3},
        # kubernetes-replicator (client-go's 5 QPS) takes 200 s a sample at 1,000, 1,000 s at
        # 5,000: it runs at 1 -> 100 only
        "peers_only": {1_000: ("projection",), 5_000: ("projection",)},
        "tenant": tenant.Sizes(single=30, burst=200, relabel=30, fan=100, deletes=3),
        "fairness": (5_000, 3, 5.0),
        "coldstart": ((10_000, 50_000, 100_000), 3),
        "build_peers": True,
        "latency": (10, 30, 20.0),
        "burst": (1_000, 100),
        "world": (1_000, 1_000, 10, 10_000),
        "failover": (3, ("defaults (15 s lease)", "5 s lease", "3 s lease")),
        "scaling": {
            "namespaces": (1_000, 5_000, 10_000),
            "grants": (1_000, 2_500, 5_000),
            "copies": (10_000, 25_000, 50_000),
            "unrelated": (10_000, 50_000, 100_000),
            "rate": ((5.0, 20.0, 100.0, 400.0), 10.0),
            "budget_seconds": 900,  # per axis: "until a target breaks or 15 minutes pass"
        },
    },
    "quick": {
        "hot": (10, 1_000),
        "hot_repeats": 7,
        "fanout": ((100, 4, 2), (1_000, 2, 1)),
        "peer_blocks": {100: 2},
        "peers_only": {},
        "tenant": tenant.Sizes(single=10, burst=50, relabel=10, fan=50, deletes=2),
        "fairness": (1_000, 2, 3.0),
        "coldstart": ((2_000, 5_000), 2),
        "build_peers": True,
        "latency": (4, 20, 20.0),
        "burst": (1_000, 100),
        "world": (100, 100, 10, 1_000),
        "failover": (1, ("5 s lease", "3 s lease")),
        "scaling": {
            "namespaces": (200, 500, 1_000),
            "grants": (100, 250, 500),
            "copies": (1_000, 2_500, 5_000),
            "unrelated": (1_000, 5_000, 10_000),
            "rate": ((5.0, 20.0, 100.0), 5.0),
            "budget_seconds": 300,
        },
    },
    "tiny": {
        "hot": (10,),
        "hot_repeats": 2,
        "fanout": ((5, 1, 1),),
        "peer_blocks": {5: 1},  # only peers already built: tiny never builds one
        "peers_only": {},
        "tenant": tenant.Sizes(single=2, burst=3, relabel=2, fan=3, deletes=1),
        "fairness": (5, 1, 0.5),
        "coldstart": ((1_000,), 1),
        "build_peers": False,
        "latency": (1, 2, 20.0),
        "burst": (20, 3),
        "world": (4, 4, 2, 10),
        "failover": (1, ("2 s lease",)),
        "scaling": {
            "namespaces": (3,),
            "grants": (3,),
            "copies": (100,),
            "unrelated": (5,),
            "rate": ((5.0,), 1.0),
            "budget_seconds": 60,
        },
    },
}
OUT = {"full": RESULTS, "quick": RESULTS.parent / "results-quick"}
"""Where each size writes by default: quick never overwrites the committed full-size results."""


async def run_e2e(
    kubeconfig: Path,
    work: Path,
    size: dict[str, Any],
    out: Path,
    only: set[str],
    fanouts: frozenset[int] = frozenset(),
) -> list[Path]:
    kube = await Kube.connect(str(kubeconfig), qps=0)
    paths: list[Path] = []
    try:
        if "fanout" in only:
            for n, blocks, per_block in size["fanout"]:
                if fanouts and n not in fanouts:
                    continue
                fanout = functools.partial(
                    e2e.fanout, kube, kubeconfig, work, n, blocks, per_block, out=out
                )
                peers = size["peer_blocks"].get(n, 0)
                named = size["peers_only"].get(n, ())
                build = size["build_peers"]
                paths.append(await fanout(peer_blocks=peers, build_peers=build, peer_names=named))
                # without the default 50 ms debounce: the engine's own cost
                paths.append(await fanout(["--debounce=0"], name=f"fanout-{n}-debounce0"))
                if n == 1_000:  # the client-side limit that was the default until 0.2.0
                    paths.append(await fanout(["--qps=200"], name=f"fanout-{n}-qps200"))
        if "tenant" in only:
            paths.append(
                await tenant.run(
                    kube, kubeconfig, work, size["tenant"], out, build_peers=size["build_peers"]
                )
            )
        if "fairness" in only:
            paths.append(await fairness.run(kube, kubeconfig, work, size["fairness"], out))
        if "latency" in only:
            blocks, per_block, rate = size["latency"]
            paths.append(
                await e2e.latency(kube, kubeconfig, work, blocks, per_block, rate, out=out)
            )
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
        if "coldstart" in only:  # its 100,000 copies stay: after everything but scaling
            sizes, rounds = size["coldstart"]
            paths.append(await coldstart.run(kube, kubeconfig, work, sizes, rounds, out))
        if "scaling" in only:  # last: its objects stay in the cluster
            paths.append(await scaling.run(kube, kubeconfig, work, size["scaling"], out))
    finally:
        await kube.close()
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("size", nargs="?", default="quick", choices=sorted(SIZES))
    p.add_argument(
        "--out",
        type=Path,
        help="results folder (default: benchmarks/results for full, benchmarks/results-quick "
        "for quick; tiny requires it)",
    )
    p.add_argument(
        "--only",
        default="hotpath,hostile,fanout,tenant,fairness,latency,burst,failover,restart,coldstart,"
        "scaling",
    )
    p.add_argument(
        "--fanout",
        default="",
        help="only these fan-out sizes (namespaces, comma-separated), e.g. 1000,5000",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="use this admin kubeconfig's cluster instead of starting a control plane",
    )
    a = p.parse_args(argv)
    size, only = SIZES[a.size], set(a.only.split(","))
    fanouts = frozenset(int(x) for x in a.fanout.split(",") if x)
    if a.out is None:
        if a.size not in OUT:
            p.error(f"{a.size} needs --out (its numbers mean nothing; never into results/)")
        a.out = OUT[a.size]
    os.environ["PROJECTOR_BENCH_SIZE"] = a.size  # recorded in every result file
    started = time.monotonic()
    paths: list[Path] = []
    if "hotpath" in only:
        paths.append(hotpath.run(size["hot"], size["hot_repeats"], out=a.out))
    if "hostile" in only:
        paths.append(hostile.run(out=a.out))
    work = Path(tempfile.mkdtemp(prefix="projector-bench-"))
    try:
        if a.kubeconfig:
            paths += asyncio.run(run_e2e(a.kubeconfig, work, size, a.out, only, fanouts))
        else:
            with control_plane(work / "plane") as plane:
                paths += asyncio.run(run_e2e(plane.kubeconfig, work, size, a.out, only, fanouts))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for path in paths:
        print(f"wrote {path}")
    print(f"benchmarks ({a.size}) done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
