"""Where one replica ends: grow each axis alone and measure the controller at every size.

Axes, each on its own objects, grown in place (sizes cumulative) until a time budget is spent:
- namespaces: one selector grant over N labelled namespaces (N copies);
- grants:     N one-copy grants over 1,000 namespaces, ten sources;
- copies:     100 grants over 1,000 namespaces, each targeting N/100 of them;
- unrelated:  N unlabelled Secrets in one namespace, beside a 100-copy grant (label-filtered
              watches never deliver them: RSS and CPU must stay +0);
- rate:       one source with 100 copies updated at R per second for a fixed time.

Per point (the first four): a controller (`--qps 0`) writes the world, then stops; a second one
starts over it: seconds to ready and to settled (every grant reconciled), its writes (must be
0), its RSS once settled; then one source of the axis is updated and the time to its last
copy's watch event (t0 just before the update) and the controller's CPU per copy write (/proc,
the fan-out benchmark's window) are taken. Objects of earlier axes stay in the cluster (and in
the controller's caches): each axis's slope is fitted on its own points, so the leftovers move
its intercept only. Slopes are least-squares lines over the points (`fit`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, write_result
from benchmarks.e2e import MANAGED, cpu_when_quiet
from benchmarks.floor import Observer, observer
from benchmarks.harness import (
    Watcher,
    controller,
    ensure,
    gather_limited,
    grant,
    namespaces,
    put_value,
    secret,
    settle,
    sources,
    unb64,
)
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, SECRETS
from projector.errors import ServerError
from tests.bed.kube import b64

AXIS = "bench-axis"
SOURCES = 10
BASE_NAMESPACES = 1_000
COPY_GRANTS = 100


def fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Least-squares line y = a + b·x over the points (b = 0 with fewer than two sizes)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return {"a": my - b * mx, "b": b}


def _took(step: float) -> dict[str, float]:
    return {"seconds": round(time.monotonic() - step, 1)}


def _affordable(started: float, budget: float, points: list[dict[str, Any]], n: int) -> bool:
    """Whether size n fits in what is left of the axis's budget, guessing its duration from the
    last point's (linear in the size), so the largest point cannot overrun by its own length."""
    spent = time.monotonic() - started
    if not points:
        return spent < budget
    last = points[-1]
    return spent + last["seconds"] * n / max(last["size"], 1) <= budget


async def _count(kube: Kube, selector: str) -> int:
    items, _ = await kube.list(SECRETS, label_selector=selector, metadata_only=True)
    return len(items)


async def _until_copies(kube: Kube, selector: str, expected: int, within: float) -> None:
    """Poll (a list every 2 s: cheap beside the writes) until `expected` copies exist."""
    deadline = time.monotonic() + within
    while await _count(kube, selector) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {expected} copies ({selector}) after {within} s")
        await asyncio.sleep(2)


async def _arena(kube: Kube, tag: str, count: int) -> list[str]:
    """An axis's sources (`scale-TAG-src/TAG-hub-N`) and its `count` target namespaces
    (`scale-TAG-I`), which it returns."""
    await sources(kube, f"scale-{tag}-src", f"{tag}-hub", SOURCES)
    targets = [f"scale-{tag}-{i}" for i in range(count)]
    await namespaces(kube, targets, {})
    return targets


def _labelled(body: dict[str, Any], axis: str) -> dict[str, Any]:
    """A grant whose copies carry `bench-axis=<axis>` (the target's labels are copied)."""
    body["spec"]["target"]["labels"] = {AXIS: axis}
    return body


async def point(
    kube: Kube,
    obs: Observer,
    kubeconfig: Path,
    work: Path,
    axis: str,
    size: int,
    expected: int,
    source: tuple[str, str],
    fanned: list[tuple[str, str]],
) -> dict[str, Any]:
    """Build the world of one size, restart over it, then one fan-out: the point's figures."""
    selector = f"{MANAGED},{AXIS}={axis}"
    t_build = time.monotonic()
    async with controller(kubeconfig, work / f"scale-{axis}-{size}-build.log", "--qps=0") as c:
        await _until_copies(kube, selector, expected, 1800)
        await settle(c, 1800)
    build = time.monotonic() - t_build
    t_start = time.monotonic()
    log = work / f"scale-{axis}-{size}-restart.log"
    async with controller(kubeconfig, log, "--qps=0") as c:
        ready = time.monotonic() - t_start
        await settle(c, 1800)
        settled = time.monotonic() - t_start
        writes_after_restart = c.writes()
        rss = c.rss_mib()
        async with Watcher(obs, f"{AXIS}={axis}", "token") as watch:
            w0 = c.metric("projector_writes_total", action="Update", result="ok")
            cpu0 = await cpu_when_quiet(c.proc.pid)
            value = f"{axis}-{size}-{time.time_ns()}"
            t0 = await put_value(obs, *source, "token", value)
            t1 = await watch.reached(fanned, value, 1800)
            cpu = await cpu_when_quiet(c.proc.pid) - cpu0
            await settle(c, 600)
            w = c.metric("projector_writes_total", action="Update", result="ok") - w0
        copies = await _count(kube, selector)
    return {
        "size": size,
        "copies": copies,
        "build_seconds": round(build, 2),
        "restart_ready_seconds": round(ready, 3),
        "restart_settled_seconds": round(settled, 3),
        "restart_writes": writes_after_restart,
        "rss_mib": round(rss, 2),
        "fanout_copies": len(fanned),
        "fanout_ms": round((t1 - t0) * 1000, 1),
        "cpu_ms_per_write": round(cpu * 1000 / w, 4) if w else None,
        "fanout_writes": w,
    }


@dataclass
class Axis:
    """One axis of a run: where it measures, its time budget, and its points so far."""

    kube: Kube
    obs: Observer
    kubeconfig: Path
    work: Path
    name: str
    budget: float
    points: list[dict[str, Any]] = field(default_factory=list)

    async def grow(self, sizes: Sequence[int], source: tuple[str, str], step: Step) -> None:
        """Grow the world to each size in turn, a point at each, while the budget lasts.

        `step(have, n)` adds what size n needs beyond size `have`, and says how many copies
        the axis then has, the copies of `source` its fan-out reaches, and figures of its own.
        """
        started, have = time.monotonic(), 0
        for n in sizes:
            if not _affordable(started, self.budget, self.points, n):
                break
            t = time.monotonic()
            expected, fanned, extra = await step(have, n)
            have = n
            p = await point(
                self.kube,
                self.obs,
                self.kubeconfig,
                self.work,
                self.name,
                n,
                expected,
                source,
                fanned,
            )
            self.points.append(p | extra | _took(t))


Grown = tuple[int, list[tuple[str, str]], dict[str, Any]]
"""What a step of an axis grew to: its copies, the fanned-out copies, figures of its own."""
Step = Callable[[int, int], Awaitable[Grown]]


async def _grants(
    kube: Kube, axis: str, gs: Iterable[int], targets: Callable[[int], list[str]]
) -> None:
    """Grants scale-<a>-g of the axis (a: its first letter), each of source <a>-hub-(g % 10)
    into `targets(g)` as copy-g."""
    a = axis[0]
    await gather_limited(
        ensure(
            kube,
            GRANTS,
            _labelled(
                grant(
                    f"scale-{a}-{g}",
                    (f"scale-{a}-src", f"{a}-hub-{g % SOURCES}"),
                    targets=targets(g),
                    target_name=f"copy-{g}",
                ),
                axis,
            ),
        )
        for g in gs
    )


async def namespaces_axis(axis: Axis, sizes: Sequence[int]) -> None:
    kube = axis.kube
    await sources(kube, "scale-ns-src", "ns-hub", SOURCES)
    g = grant("scale-ns", ("scale-ns-src", "ns-hub-0"), selector={"scale": "ns"})
    await ensure(kube, GRANTS, _labelled(g, "namespaces"))

    async def step(have: int, n: int) -> Grown:
        await namespaces(kube, [f"scale-ns-{i}" for i in range(have, n)], {"scale": "ns"})
        return n, [(f"scale-ns-{i}", "ns-hub-0") for i in range(n)], {}

    await axis.grow(sizes, ("scale-ns-src", "ns-hub-0"), step)


async def grants_axis(axis: Axis, sizes: Sequence[int]) -> None:
    kube = axis.kube
    targets = await _arena(kube, "g", BASE_NAMESPACES)

    async def step(have: int, n: int) -> Grown:
        await _grants(kube, "grants", range(have, n), lambda g: [targets[g % BASE_NAMESPACES]])
        fanned = [(targets[g % BASE_NAMESPACES], f"copy-{g}") for g in range(0, n, SOURCES)]
        return n, fanned, {}

    await axis.grow(sizes, ("scale-g-src", "g-hub-0"), step)


def _spread(targets: list[str], g: int, per: int) -> list[str]:
    """Grant g's `per` target namespaces (distinct; grants overlap, their copy names differ)."""
    return [targets[(g * 7 + j) % len(targets)] for j in range(per)]


async def copies_axis(axis: Axis, sizes: Sequence[int]) -> None:
    kube = axis.kube
    targets = await _arena(kube, "c", BASE_NAMESPACES)

    async def step(have: int, n: int) -> Grown:
        per = n // COPY_GRANTS
        if not axis.points:
            await _grants(kube, "copies", range(COPY_GRANTS), lambda g: _spread(targets, g, per))
        else:
            await gather_limited(
                kube.patch(
                    GRANTS,
                    f"scale-c-{g}",
                    {"spec": {"target": {"namespaces": _spread(targets, g, per)}}},
                )
                for g in range(COPY_GRANTS)
            )
        fanned = [
            (ns, f"copy-{g}")
            for g in range(0, COPY_GRANTS, SOURCES)
            for ns in _spread(targets, g, per)
        ]
        return per * COPY_GRANTS, fanned, {}

    await axis.grow(sizes, ("scale-c-src", "c-hub-0"), step)


async def unrelated_axis(axis: Axis, sizes: Sequence[int]) -> None:
    """Unlabelled Secrets created while one controller runs: its RSS and CPU must not move."""
    kube = axis.kube
    targets = await _arena(kube, "u", 100)
    await namespaces(kube, ["scale-unrelated"], {})
    g = grant("scale-u", ("scale-u-src", "u-hub-0"), targets=targets)
    await ensure(kube, GRANTS, _labelled(g, "unrelated"))
    fanned = [(ns, "u-hub-0") for ns in targets]

    async def step(have: int, n: int) -> Grown:
        async with controller(
            axis.kubeconfig, axis.work / f"scale-unrelated-{n}.log", "--qps=0"
        ) as c:
            await _until_copies(kube, f"{AXIS}=unrelated", len(targets), 600)
            await settle(c, 600)
            rss0, cpu0 = c.rss_mib(), await cpu_when_quiet(c.proc.pid)
            t0 = time.monotonic()
            await gather_limited(
                ensure(kube, SECRETS, secret(f"u{i}", {"x": "y" * 64}), "scale-unrelated")
                for i in range(have, n)
            )
            took = time.monotonic() - t0
            cpu1 = await cpu_when_quiet(c.proc.pid)
            running = {
                "created_while_running": n - have,
                "create_seconds": round(took, 1),
                "rss_delta_mib_while_created": round(c.rss_mib() - rss0, 3),
                "cpu_seconds_while_created": round(cpu1 - cpu0, 3),
            }
        return len(targets), fanned, running

    await axis.grow(sizes, ("scale-u-src", "u-hub-0"), step)


async def rate_axis(
    kube: Kube,
    obs: Observer,
    kubeconfig: Path,
    work: Path,
    rates: Sequence[float],
    seconds: float,
    points: list[dict[str, Any]],
) -> None:
    """One source, 100 copies, updates at each rate for `seconds` (default flags: the debounce
    coalesces a hot source): CPU per update, writes per copy, and the lag of the last value."""
    targets = await _arena(kube, "r", 100)
    g = grant("scale-r", ("scale-r-src", "r-hub-0"), targets=targets)
    await ensure(kube, GRANTS, _labelled(g, "rate"))
    keys = [(ns, "r-hub-0") for ns in targets]
    async with (
        controller(kubeconfig, work / "scale-rate.log") as c,
        Watcher(obs, f"{AXIS}=rate", "token") as watch,
    ):
        await watch.until(lambda: all(k in watch.values for k in keys), 600)
        await settle(c, 600)
        for rate in rates:
            w0 = c.metric("projector_writes_total", action="Update", result="ok")
            cpu0 = await cpu_when_quiet(c.proc.pid)
            start, n = time.monotonic(), int(rate * seconds)
            sent: list[float] = []
            refused: list[str] = []  # an update the API server did not take in time, or at all

            async def one(
                i: int,
                start: float = start,
                rate: float = rate,
                sent: list[float] = sent,
                refused: list[str] = refused,
            ) -> None:
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
                body = {"data": {"token": b64(f"r{rate}-{i}")}}
                try:
                    await kube.patch(SECRETS, "r-hub-0", body, namespace="scale-r-src")
                except ServerError as e:  # the server saturated: the rate's honest outcome
                    refused.append(e.reason)
                    return
                sent.append(time.monotonic())

            await gather_limited((one(i) for i in range(n)), limit=64)
            if not sent:
                raise RuntimeError(f"no update at {rate}/s was taken: {sorted(set(refused))}")
            final = await kube.get(SECRETS, "r-hub-0", namespace="scale-r-src")
            t1 = await watch.reached(keys, unb64(final["data"]["token"]), 600)
            cpu = await cpu_when_quiet(c.proc.pid) - cpu0
            await settle(c, 600)
            w = c.metric("projector_writes_total", action="Update", result="ok") - w0
            points.append(
                {
                    "rate_per_s": rate,
                    "updates": n,
                    "updates_refused": len(refused),
                    "refused_because": sorted(set(refused)),
                    "send_seconds": round(max(sent) - start, 2),
                    "achieved_rate_per_s": round(len(sent) / (max(sent) - start), 1),
                    "lag_after_last_update_ms": round((t1 - max(sent)) * 1000, 1),
                    "writes_per_copy": w / len(keys),
                    "cpu_ms_per_update": round(cpu * 1000 / len(sent), 3),
                    "cpu_share_of_a_core": round(cpu / (max(sent) - start), 3),
                }
            )


def _slopes(fits: dict[str, Any]) -> dict[str, Any]:
    """The per-object costs the fits give, as the result file's metrics."""
    per = {
        "copy": "copies",
        "grant_with_its_copy": "grants",
        "namespace_with_its_copy": "namespaces",
        "unrelated_secret": "unrelated",
    }
    out = {
        f"rss_per_{k}": {"value": fits[axis]["rss_mib"]["b"] * 2**20, "unit": "bytes"}
        for k, axis in per.items()
        if axis in fits
    }
    for k, axis in per.items():
        if axis in fits:
            b = fits[axis]["restart_settled_seconds"]["b"]
            out[f"restart_settled_per_{k}"] = {"value": b * 1e6, "unit": "us"}
    return out


async def run(
    kube: Kube, kubeconfig: Path, work: Path, size: dict[str, Any], out: Path = RESULTS
) -> Path:
    budget = size["budget_seconds"]
    axes: dict[str, Any] = {}
    took: dict[str, float] = {}
    errors: dict[str, str] = {}
    async with observer(kubeconfig) as obs:
        for name, fn in (
            ("namespaces", namespaces_axis),
            ("grants", grants_axis),
            ("copies", copies_axis),
            ("unrelated", unrelated_axis),
        ):
            t = time.monotonic()
            axis = Axis(kube, obs, kubeconfig, work, name, budget)
            axes[name] = axis.points
            try:  # a long run: an axis that fails keeps its points, the others still run
                await fn(axis, size[name])
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"[:500]
            took[name] = round(time.monotonic() - t, 1)
            print(f"scaling: {name} done in {took[name]} s {errors.get(name, '')}", flush=True)
        t = time.monotonic()
        axes["rate"] = []
        try:
            rates, seconds = size["rate"]
            await rate_axis(kube, obs, kubeconfig, work, rates, seconds, axes["rate"])
        except Exception as e:
            errors["rate"] = f"{type(e).__name__}: {e}"[:500]
        took["rate"] = round(time.monotonic() - t, 1)
    fits: dict[str, Any] = {}
    for name in ("namespaces", "grants", "copies", "unrelated"):
        if not axes[name]:
            continue
        pts = [p for p in axes[name] if p["cpu_ms_per_write"] is not None] or axes[name]
        xs = [float(p["size"]) for p in axes[name]]
        fits[name] = {
            "rss_mib": fit(xs, [p["rss_mib"] for p in axes[name]]),
            "restart_settled_seconds": fit(xs, [p["restart_settled_seconds"] for p in axes[name]]),
            "restart_ready_seconds": fit(xs, [p["restart_ready_seconds"] for p in axes[name]]),
            "cpu_ms_per_write": fit(
                [float(p["size"]) for p in pts], [p["cpu_ms_per_write"] or 0.0 for p in pts]
            ),
        }
    return write_result(
        "scaling",
        {
            "sizes": {k: v for k, v in size.items() if k != "budget_seconds"},
            "budget_seconds_per_axis": budget,
            "axis_seconds": took,
            "flags": ["--qps=0"],
        },
        {"projector": _slopes(fits)},
        out=out,
        extra={"axes": axes, "fits": fits, "errors": errors},
    )
