"""`python -m benchmarks.profile N...`: where the controller's CPU goes in a 1 -> N fan-out.

For each N: N namespaces, one exported source, one selector grant; the controller runs (from
the dev venv, which has pyinstrument) until its copies hold the current value and it is quiet,
then the source is updated `--rounds` times, each time until every copy holds the new value
and the controller has used no CPU for 0.3 s. Printed per N: process CPU per Update write
(/proc, the fan-out benchmark's method), and with `--profile` pyinstrument's call tree of the
whole run (start-up included) into `--out`/profile-N.txt; with `--cpu-profile`, one more run
at the largest N sampled by py-spy during the updates only (`benchmarks.cpuprofile`): the CPU's
shares by component.

Against the control plane of `make cluster-up` (`--kubeconfig`, default .local/kubeconfig).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from benchmarks import cpuprofile
from benchmarks.common import summary, write_result
from benchmarks.e2e import MANAGED, cpu_when_quiet
from benchmarks.floor import observer
from benchmarks.harness import (
    Watcher,
    ensure,
    exported,
    grant,
    namespaces,
    own_namespace,
    put_value,
    settle,
    wait_ready,
)
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, SECRETS
from tests.bed.launcher import REPO, ControllerProcess, launch, stop_process

RUN_FROM = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1:4];"
    " runpy.run_module('projector', run_name='__main__', alter_sys=True)"
)
"""Runs `projector` from the directory in argv[1] (an exported commit), not the repository's."""


def start(
    kubeconfig: Path, log: Path, profile: Path | None, *flags: str, code: Path | None = None
) -> ControllerProcess:
    """The controller, profiled into `profile` if given, from `code` (a `projector/` parent)."""
    prof = ["-m", "pyinstrument", "-r", "text", "-o", str(profile)] if profile else []
    if code is not None:
        prof = ["-c", RUN_FROM, str(code)]
    own_namespace(kubeconfig)
    return launch(kubeconfig, log, "--log-level=warning", *flags, prefix=prof)


async def fan_out_world(kube: Kube, tag: str, n: int) -> tuple[str, list[tuple[str, str]]]:
    """A source namespace, `n` selected namespaces and a grant copying `hub` into each: the
    source's namespace and the copies to watch."""
    src, targets = f"{tag}-src", [f"{tag}-{i}" for i in range(n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": tag})
    await ensure(kube, SECRETS, exported("hub", {"token": "v0"}), src)
    await ensure(kube, GRANTS, grant(tag, (src, "hub"), selector={"bench": tag}))
    return src, [(ns, "hub") for ns in targets]


async def measured_rounds(
    kubeconfig: Path,
    launch_controller: Callable[[], ControllerProcess],
    src: str,
    copies: list[tuple[str, str]],
    first: str,
    values: list[str],
    during: Callable[[int], AbstractContextManager[None]] | None = None,
) -> list[tuple[float, float]]:
    """The source set to `first`, a controller launched and every copy awaited; then per value,
    the source updated and (controller CPU ms per Update write, ms until the last copy holds
    it), the CPU counted until the controller is quiet; the controller stopped at the end.
    `during(pid)` wraps the updates (a profiler's sampling of them)."""
    samples: list[tuple[float, float]] = []
    async with observer(kubeconfig) as obs:
        await put_value(obs, src, "hub", "token", first)
        ctl = launch_controller()
        try:
            await wait_ready(ctl)
            async with Watcher(obs, MANAGED, "token") as watch:
                await watch.until(watch.all_equal(copies, first), 600)
                await settle(ctl)
                with during(ctl.proc.pid) if during else nullcontext():
                    for value in values:
                        w0 = ctl.metric("projector_writes_total", action="Update", result="ok")
                        cpu0 = await cpu_when_quiet(ctl.proc.pid)
                        t0 = time.monotonic()
                        await put_value(obs, src, "hub", "token", value)
                        t1 = await watch.reached(copies, value, 600)
                        cpu = await cpu_when_quiet(ctl.proc.pid) - cpu0
                        await settle(ctl)
                        w = ctl.metric("projector_writes_total", action="Update", result="ok") - w0
                        samples.append((cpu * 1000 / w, (t1 - t0) * 1000))
        finally:
            stop_process(ctl.proc, timeout=60)
    return samples


async def one(
    kubeconfig: Path,
    out: Path,
    n: int,
    rounds: int,
    profile: bool,
    flags: list[str],
    code: Path | None = None,
    sampled_into: Path | None = None,
) -> list[float]:
    kube = await Kube.connect(str(kubeconfig))
    tag = f"prof{n}"
    src, copies = await fan_out_world(kube, tag, n)
    profile_out = out / f"profile-{n}.txt" if profile else None
    samples = await measured_rounds(
        kubeconfig,
        lambda: start(
            kubeconfig, out / f"controller-{n}.log", profile_out, "--qps=0", *flags, code=code
        ),
        src,
        copies,
        f"{tag}-start",
        [f"{tag}-r{r}" for r in range(rounds)],
        functools.partial(cpuprofile.sampled, out=sampled_into) if sampled_into else None,
    )
    await kube.delete(GRANTS, tag)
    await kube.close()
    return [cpu for cpu, _ in samples]


def call_tree(text: str) -> list[str]:
    """pyinstrument's tree from the event loop down (start-up imports left out)."""
    lines = text.splitlines()
    loop = ("Handle._run", "Runner.run")  # asyncio's loop runs Handles; uvloop's is native
    start = next((i for i, line in enumerate(lines) if any(h in line for h in loop)), 0)
    end = next((i for i, line in enumerate(lines) if "<module>  projector/app.py" in line), None)
    return [line.rstrip() for line in lines[start:end]]


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("sizes", nargs="+", type=int)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="then one profiled run, largest size")
    p.add_argument(
        "--cpu-profile", action="store_true", help="then one run sampled by py-spy, largest size"
    )
    p.add_argument("--flag", action="append", default=[], help="a flag of `projector run`")
    p.add_argument("--kubeconfig", type=Path, default=REPO / ".local/kubeconfig")
    p.add_argument("--out", type=Path, default=REPO / ".local/profile")
    p.add_argument("--results", type=Path, help="write cpu-per-write.json there")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    systems: dict[str, Any] = {}
    for n in args.sizes:
        ms = await one(args.kubeconfig, args.out, n, args.rounds, False, args.flag)
        systems[f"projector 1 -> {n}"] = {"client_cpu_per_write": summary(ms, "ms")}
        print(f"1 -> {n}: CPU per write {summary(ms, 'ms')}")
    extra: dict[str, Any] = {}
    if args.cpu_profile:
        n, collapsed = max(args.sizes), args.out / "py-spy.txt"
        ms = await one(
            args.kubeconfig, args.out, n, args.rounds, False, args.flag, sampled_into=collapsed
        )
        systems[f"projector 1 -> {n} sampled by py-spy"] = {
            "client_cpu_per_write": summary(ms, "ms")
        }
        extra["cpu_profile"] = cpuprofile.summarize(collapsed.read_text())
        print(json.dumps(extra["cpu_profile"], indent=1))
    tree: list[str] = []
    if args.profile:
        n = max(args.sizes)
        ms = await one(args.kubeconfig, args.out, n, args.rounds, True, args.flag)
        systems[f"projector 1 -> {n} under pyinstrument"] = {
            "client_cpu_per_write": summary(ms, "ms")
        }
        tree = call_tree((args.out / f"profile-{n}.txt").read_text())
        print("\n".join(tree))
    if args.results:
        small, large = min(args.sizes), max(args.sizes)
        cpu = {k: v["client_cpu_per_write"]["median"] for k, v in systems.items()}
        ratios = {
            f"CPU per write, 1 -> {large} / 1 -> {small} p50": cpu[f"projector 1 -> {large}"]
            / cpu[f"projector 1 -> {small}"]
        }
        params = {
            "rounds": args.rounds,
            "flags": ["--qps=0", *args.flag],
            "method": "benchmarks.profile",
        }
        write_result(
            "cpu-per-write",
            params,
            systems,
            ratios,
            out=args.results,
            extra=extra | {"profile": tree},
        )


if __name__ == "__main__":
    asyncio.run(main())
