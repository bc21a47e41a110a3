"""The hot path, with no server: plan() per (grant, namespace), hashing, and the work queue.

`plan()` is timed for one grant over N namespaces in the two shapes that matter: every copy
in sync (a restart, or a source event that changed nothing), and every copy missing (the
first fan-out). The figure reported is time per (grant, namespace) pair.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, summary, write_result
from projector.control.queue import WorkQueue
from projector.core.desired import Desired, desired_copy
from projector.core.model import (
    Grant,
    LabelSelector,
    Namespace,
    ObjectKey,
    Source,
    Uid,
    content_hash,
    parse_copy,
)
from projector.core.plans import Action, Snapshot, SourceState
from projector.core.reconcile import plan

DATA = {
    k: base64.b64encode(f"value-of-{k}-".encode() * 4).decode()
    for k in ("api-token", "client-id", "client-secret")
}


def world(n: int, *, in_sync: bool) -> Snapshot:
    """One grant selecting n namespaces; copies all in sync, or none yet."""
    grant = Grant(
        name="g",
        uid=Uid("uid-g"),
        generation=1,
        created="2026-01-01T00:00:00Z",
        source=ObjectKey("src", "hub"),
        keys=None,
        target_name="hub",
        namespaces=frozenset(),
        selector=LabelSelector((("team", "x"),)),
    )
    source = Source(ObjectKey("src", "hub"), Uid("uid-s"), "Opaque", DATA, ("*",))
    namespaces = {f"ns-{i}": Namespace(f"ns-{i}", {"team": "x"}) for i in range(n)}
    namespaces["src"] = Namespace("src")
    copies = {}
    if in_sync:
        desired = desired_copy(grant, source)
        assert isinstance(desired, Desired)
        for i in range(n):
            m = desired.manifest(f"ns-{i}")
            meta: Any = m["metadata"]
            meta["uid"], meta["resourceVersion"] = f"c{i}", "1"
            meta["managedFields"] = [
                {
                    "manager": "projector",
                    "fieldsV1": {
                        "f:metadata": {"f:annotations": {"f:projector.nebari.dev/grant-uid": {}}}
                    },
                }
            ]
            c = parse_copy(m)
            copies[c.key] = c
    return Snapshot(
        grant_name="g",
        grant=grant,
        source=source,
        source_state=SourceState.AVAILABLE,
        namespaces=namespaces,
        copies=copies,
        live_grant_uids=frozenset({"uid-g"}),
    )


def timed(fn: Callable[[], object], repeats: int, inner: int = 1) -> list[float]:
    """Seconds per call of fn, one sample per repeat (each sample averages `inner` calls)."""
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t) / inner)
    return samples


def queue_throughput(n: int) -> float:
    """Seconds per add+get+done cycle over n distinct keys (debounce 0)."""

    async def run() -> float:
        q: WorkQueue[int] = WorkQueue()
        t = time.perf_counter()
        for i in range(n):
            q.add(i)
        for _ in range(n):
            k = await q.get()
            q.done(k)
        return (time.perf_counter() - t) / n

    return asyncio.run(run())


def run(
    sizes: tuple[int, ...] = (10, 1_000, 10_000), repeats: int = 15, out: Path = RESULTS
) -> Path:
    systems: dict[str, Any] = {"projector": {}}
    m = systems["projector"]
    for n in sizes:
        for in_sync in (True, False):
            snap = world(n, in_sync=in_sync)
            planned = plan(snap)
            want = Action.NOOP if in_sync else Action.CREATE
            assert sum(s.action is want for s in planned.steps) == n, "benchmark world is wrong"
            samples = timed(lambda snap=snap: plan(snap), repeats)  # type: ignore[misc]
            key = f"plan_per_namespace_{'in_sync' if in_sync else 'create'}_{n}"
            m[key] = summary([s / n * 1e6 for s in samples], "us")
    m["content_hash"] = summary(
        [s * 1e6 for s in timed(lambda: content_hash("Opaque", DATA, {}, {}), repeats, 1000)], "us"
    )
    m["queue_add_get_done"] = summary(
        [queue_throughput(10_000) * 1e6 for _ in range(max(3, repeats // 3))], "us"
    )
    return write_result(
        "hotpath",
        {"sizes": list(sizes), "repeats": repeats, "keys_per_secret": len(DATA)},
        systems,
        out=out,
    )


if __name__ == "__main__":
    print(run())
