"""Leader failover: from the leader's end (kill -9, or SIGTERM) to a standby's projection.

Two replicas with leader election share a Lease; once the leader has projected a value, it is
ended, a new source value is written right after (t0 is taken just before the signal), and the
time until the copy holds that value is the failover time. kill -9 waits for the Lease to
expire (lease duration, judged from the standby's last observation, plus a retry); SIGTERM
releases the Lease, so the standby takes over on its next retry.

The targets (judged by `benchmarks.report`): kill -9 within the lease duration plus 2 s,
SIGTERM within 3 s. They were bounds inside tests/integration/test_leader.py, with its "3 s
lease" timings; the tests now assert only the behaviour, and the speed is measured here.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, summary, write_result
from benchmarks.harness import (
    EXPORT,
    Watcher,
    controller,
    ensure,
    grant,
    namespaces,
    put_value,
    secret,
)
from projector.client.kube import Kube
from projector.control.leader import LEASE_NAME
from projector.core.kinds import GRANTS, LEASES, SECRETS
from projector.errors import NotFound

SYSTEM = "failover-system"
SRC, DST = "failover-src", "failover-dst"
LEASES_TRIED: dict[str, tuple[str, ...]] = {
    "defaults (15 s lease)": (),
    "5 s lease": ("--lease-duration=5s", "--renew-deadline=3s", "--retry-period=1s"),
    "3 s lease": ("--lease-duration=3s", "--renew-deadline=2s", "--retry-period=0.5s"),
    "2 s lease": ("--lease-duration=2s", "--renew-deadline=1.5s", "--retry-period=0.5s"),
}


async def _holder(kube: Kube) -> str:
    try:
        lease = await kube.get(LEASES, LEASE_NAME, namespace=SYSTEM)
    except NotFound:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def _until_holder(kube: Kube, rid: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while await _holder(kube) != rid:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{rid} never held the lease")
        await asyncio.sleep(0.05)


async def _one(
    kube: Kube, kubeconfig: Path, work: Path, flags: Sequence[str], sig: int, run: str
) -> float:
    copy = [(DST, "hub")]
    ha = (f"--namespace={SYSTEM}", *flags)
    async with (
        controller(
            kubeconfig, work / f"{run}-a.log", *ha, f"--id={run}-a", leader_elect=True
        ) as first,
        Watcher(kube, "projector.nebari.dev/managed-by=projector", "token") as watch,
    ):
        await _until_holder(kube, f"{run}-a")
        async with controller(
            kubeconfig, work / f"{run}-b.log", *ha, f"--id={run}-b", leader_elect=True
        ):
            await put_value(kube, SRC, "hub", "token", f"{run}-before")
            await watch.until(watch.all_equal(copy, f"{run}-before"), 120)
            t0 = time.monotonic()
            first.proc.send_signal(sig)
            await put_value(kube, SRC, "hub", "token", f"{run}-after")
            done = await watch.reached(copy, f"{run}-after", 120)
            first.stop()
    return done - t0


async def failover(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    runs: int,
    leases: Sequence[str],
    out: Path = RESULTS,
) -> Path:
    await namespaces(kube, [SYSTEM, SRC, DST], {})
    await ensure(
        kube,
        SECRETS,
        secret(
            "hub",
            {"token": "v0"},
            labels=EXPORT,
            annotations={"projector.nebari.dev/export-to": DST},
        ),
        SRC,
    )
    await ensure(kube, GRANTS, grant("failover", (SRC, "hub"), targets=[DST]))
    systems: dict[str, Any] = {"projector": {}}
    for lease in leases:
        for how, sig in (("kill -9", signal.SIGKILL), ("SIGTERM", signal.SIGTERM)):
            samples = [
                await _one(kube, kubeconfig, work, LEASES_TRIED[lease], sig, f"fo-{i}-{sig}")
                for i in range(runs)
            ]
            systems["projector"][f"{how}, {lease}"] = summary([s * 1000 for s in samples], "ms")
    await kube.delete(GRANTS, "failover")
    return write_result(
        "failover",
        {"runs": runs, "leases": {k: list(LEASES_TRIED[k]) for k in leases}},
        systems,
        out=out,
    )
