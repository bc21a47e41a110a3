"""The write path before and after a change, side by side in one run.

`python -m benchmarks.write_before_after BEFORE [AFTER] --sizes 100 1000 --blocks 4`

Each version of `projector/` (a commit exported to a temporary directory, or the working tree)
runs as its own controller process against the same 1 -> N fan-out (one source, one selector
grant, N namespaces), one version at a time; blocks alternate the versions (ABBA...), so machine
noise hits both alike. In each block the controller starts, reaches the current value and goes
quiet, then the source is updated `--rounds` times: per update, the process CPU per Update write
(/proc, as `benchmarks.profile`) and the fan-out time (the PUT to the last copy's event).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.before_after import export
from benchmarks.common import summary, write_result
from benchmarks.profile import call_tree, fan_out_world, measured_rounds, start
from projector.client.kube import Kube
from projector.core.kinds import GRANTS
from tests.bed.launcher import REPO

Samples = dict[str, list[float]]


async def block(
    kubeconfig: Path, out: Path, n: int, rounds: int, code: Path, flags: list[str], seq: int
) -> Samples:
    """One controller of one version: `rounds` updates of a 1 -> n fan-out."""
    tag = f"wba{n}"
    src, targets = f"{tag}-src", [f"{tag}-{i}" for i in range(n)]
    copies = [(ns, "hub") for ns in targets]
    log = out / f"controller-{n}-{seq}.log"
    samples = await measured_rounds(
        kubeconfig,
        lambda: start(kubeconfig, log, None, *flags, code=code),
        src,
        copies,
        f"{tag}-b{seq}",
        [f"{tag}-b{seq}-r{r}" for r in range(rounds)],
    )
    return {"cpu_ms_per_write": [c for c, _ in samples], "fanout_ms": [f for _, f in samples]}


async def setup(kube: Kube, n: int) -> None:
    await fan_out_world(kube, f"wba{n}", n)


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after", nargs="?")
    p.add_argument("--sizes", nargs="+", type=int, default=[100, 1000])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--flag", action="append", default=[], help="a flag of `projector run`")
    p.add_argument("--kubeconfig", type=Path, default=REPO / ".local/kubeconfig")
    p.add_argument("--out", type=Path, default=REPO / ".local/write-before-after")
    p.add_argument("--results", type=Path, default=REPO / ".local/write-before-after")
    p.add_argument("--name", default="write-before-after", help="of the result file")
    p.add_argument("--tree", type=Path, help="a pyinstrument text profile to keep beside")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kube = await Kube.connect(str(args.kubeconfig))
    loads = [load()]
    with tempfile.TemporaryDirectory() as tmp:
        codes = {"before": export(args.before, Path(tmp) / "before")}
        codes["after"] = export(args.after, Path(tmp) / "after") if args.after else REPO
        samples: dict[tuple[str, int], Samples] = {}
        seq = 0
        for n in args.sizes:
            await setup(kube, n)
            for b in range(args.blocks):
                order = ["before", "after"] if b % 2 == 0 else ["after", "before"]
                for version in order:
                    seq += 1
                    got = await block(
                        args.kubeconfig, args.out, n, args.rounds, codes[version], args.flag, seq
                    )
                    for k, v in got.items():
                        samples.setdefault((version, n), {}).setdefault(k, []).extend(v)
                    loads.append(load())
            await kube.delete(GRANTS, f"wba{n}")
    await kube.close()
    systems: dict[str, Any] = {}
    ratios: dict[str, float] = {}
    for (version, n), m in samples.items():
        name = f"{version} ({getattr(args, version) or 'working tree'}) 1 -> {n}"
        systems[name] = {k: summary(v, "ms") for k, v in m.items()}
    for n in args.sizes:
        for k in ("cpu_ms_per_write", "fanout_ms"):
            sb = summary(samples[("before", n)][k], "ms")
            sa = summary(samples[("after", n)][k], "ms")
            ratios[f"after/before {k} 1 -> {n} p50"] = sa["median"] / sb["median"]
            print(
                f"1 -> {n} {k}: before p50 {sb['median']:.3f} p99 {sb['p99']:.3f}"
                f" | after p50 {sa['median']:.3f} p99 {sa['p99']:.3f}"
                f" | ratio {sa['median'] / sb['median']:.3f}"
            )
    print("load averages (1 min) over the run:", " ".join(loads))
    params = {
        "before": args.before,
        "after": args.after or "worktree",
        "blocks": args.blocks,
        "rounds": args.rounds,
        "flags": args.flag,
        "load_1min": loads,
    }
    extra = {"profile": call_tree(args.tree.read_text())} if args.tree else None
    print(write_result(args.name, params, systems, ratios, out=args.results, extra=extra))


if __name__ == "__main__":
    asyncio.run(main())
