"""Fairness: another client's reads while projector fans out, with and without its FlowSchema.

Projector runs as the chart's ServiceAccount (its RBAC applied from deploy/install.yaml, a
token of it, default flags: no client-side rate limit), so API Priority and Fairness applies to
it (the admin is exempt, so every other benchmark runs it outside APF). Another ServiceAccount,
the probe, in its own namespace, reads in a closed loop with a pause of `PAUSE`: a GET of one
Secret, then a LIST of its namespace's `PROBE_SECRETS` Secrets, each timed (the raw client of
the floor, aiohttp). Its requests go to the built-in `service-accounts` FlowSchema
(workload-low), where projector's own go without the chart's.

Per mode (the chart's PriorityLevelConfiguration and FlowSchemas applied, then deleted; none
is left behind), the
probe first runs alone (`idle`), then during `samples` fan-outs 1 -> n (a source update; t0
just before its PUT, t1 the last copy's watch event; the probe's requests started in [t0, t1]
count as `during`). Then projector's own counts: its PUTs, and the 429s among them; the copies
written must be exactly n per fan-out, and every PUT beyond them a retry of a 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import dynamic

from benchmarks.common import RESULTS, summary, write_result
from benchmarks.e2e import Values
from benchmarks.floor import observer, ssl_and_headers
from benchmarks.harness import (
    Watcher,
    controller,
    ensure,
    exported,
    gather_limited,
    grant,
    namespaces,
    put_value,
    secret,
)
from projector.client.kube import Kube
from projector.config import Config
from projector.core.kinds import GRANTS, SECRETS
from projector.core.model import GRANT_LABEL
from tests.bed.helm import chart
from tests.bed.kube import PF_LEVEL, priority_levels, token_kubeconfig
from tests.bed.launcher import REPO, ControllerProcess

APF = ("FlowSchema", "PriorityLevelConfiguration")
PROBE = "bench-probe"
PROBE_SECRETS = 50
PAUSE = 0.02


@dataclass
class Probe:
    """The other client: a closed loop of GET and LIST, each request's start and latency."""

    kubeconfig: Path
    samples: list[tuple[str, float, float]] = field(default_factory=list)
    levels: set[str] = field(default_factory=set)
    """The priority levels (uids) that served it."""

    async def run(self, stop: asyncio.Event) -> None:
        server, ssl_ctx, headers = ssl_and_headers(self.kubeconfig)
        base = f"{server}/api/v1/namespaces/{PROBE}/secrets"
        urls = (("GET", f"{base}/probe-0"), ("LIST", base))
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=2), headers=headers
        ) as session:
            i = 0
            while not stop.is_set():
                verb, url = urls[i % 2]
                i += 1
                t = time.monotonic()
                async with session.get(url) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"probe {verb}: {r.status}")
                    self.levels.add(r.headers.get(PF_LEVEL, ""))
                self.samples.append((verb, t, time.monotonic() - t))
                await asyncio.sleep(PAUSE)

    def between(self, t0: float, t1: float, verb: str) -> list[float]:
        return [s for v, t, s in self.samples if v == verb and t0 <= t <= t1]


@contextlib.asynccontextmanager
async def probing(probe: Probe) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task


def _apply(api: k8s.ApiClient, doc: dict[str, Any]) -> None:
    res = dynamic.DynamicClient(api).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    meta = doc["metadata"]
    res.server_side_apply(
        body=doc,
        name=meta["name"],
        namespace=meta.get("namespace"),
        field_manager="bench",
        force_conflicts=True,
    )


def _delete(api: k8s.ApiClient, doc: dict[str, Any]) -> None:
    res = dynamic.DynamicClient(api).resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    with contextlib.suppress(k8s.ApiException):
        res.delete(name=doc["metadata"]["name"])


IDENTITY = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
"""What of the chart projector's identity is: nothing else is applied (the API server may be a
shared test plane whose other tests create the chart's Deployment or budget themselves)."""


def _install(api: k8s.ApiClient) -> list[dict[str, Any]]:
    """Apply the chart's ServiceAccount and RBAC (deploy/install.yaml); return its APF objects."""
    docs = chart.documents((REPO / "deploy" / "install.yaml").read_text())
    for doc in docs:
        if doc["kind"] in IDENTITY:
            _apply(api, doc)
    apf = [d for d in docs if d["kind"] in APF]
    assert len(apf) == 3, "install.yaml renders a level and two FlowSchemas"
    return apf


def _probe_identity(api: k8s.ApiClient) -> None:
    meta = {"name": PROBE, "namespace": PROBE}
    for doc in (
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROBE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROBE},
            "subjects": [{"kind": "ServiceAccount", "name": PROBE, "namespace": PROBE}],
        },
    ):
        _apply(api, doc)


async def _served_by(kubeconfig: Path) -> str:
    """The priority level (uid) that serves a request of this identity."""
    server, ssl_ctx, headers = ssl_and_headers(kubeconfig)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_ctx), headers=headers) as s,
        s.get(f"{server}/api/v1/namespaces/{Config().namespace}/secrets?limit=1") as r,
    ):
        return r.headers.get(PF_LEVEL, "")


async def _until_served_by(kubeconfig: Path, api: k8s.ApiClient, level: str) -> None:
    """Wait until APF has taken the change in (its config controller applies it in the
    background): this identity's requests are served by `level`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if await _served_by(kubeconfig) == priority_levels(api).get(level):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"requests never served by {level}")


def _counts(c: ControllerProcess) -> tuple[float, float, float]:
    """projector's copy PUTs so far, those the API server answered 429, and its copy updates."""
    puts = functools.partial(
        c.metric, "projector_api_requests_total", verb="UPDATE", resource="secrets"
    )
    return (
        puts(),
        puts(code="429"),
        c.metric("projector_writes_total", action="Update", result="ok"),
    )


def _stats(samples: list[float]) -> dict[str, Any]:
    return summary([s * 1000 for s in samples], "ms") if samples else {"samples": 0}


async def run(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    size: tuple[int, int, float],
    out: Path = RESULTS,
) -> Path:
    """`size`: (namespaces, fan-outs per mode, seconds of the probe's idle baseline)."""
    api = k8s_config.new_client_from_config(str(kubeconfig))
    try:
        return await _run(kube, api, kubeconfig, work, size, out)
    finally:
        api.close()


async def _run(
    kube: Kube,
    api: k8s.ApiClient,
    kubeconfig: Path,
    work: Path,
    size: tuple[int, int, float],
    out: Path,
) -> Path:
    n, samples, idle_seconds = size
    apf = await asyncio.to_thread(_install, api)
    await asyncio.to_thread(_probe_identity, api)
    await gather_limited(
        ensure(kube, SECRETS, secret(f"probe-{i}", {"token": "p"}), PROBE)
        for i in range(PROBE_SECRETS)
    )
    ns = Config().namespace
    as_projector = token_kubeconfig(work / "sa.kubeconfig", api, "projector", ns)
    as_probe = token_kubeconfig(work / "probe.kubeconfig", api, PROBE, PROBE)
    tag = f"fair{n}"
    src, targets = f"{tag}-src", [f"{tag}-{i}" for i in range(n)]
    await namespaces(kube, [src], {})
    await namespaces(kube, targets, {"bench": tag})
    await ensure(kube, SECRETS, exported("hub", {"token": "v0"}), src)
    await ensure(kube, GRANTS, grant(tag, (src, "hub"), selector={"bench": tag}))
    copies = [(t, "hub") for t in targets]
    values = Values(tag)
    await put_value(kube, src, "hub", "token", values.current)
    systems: dict[str, Any] = {}
    modes = (("with FlowSchema", True), ("without FlowSchema", False))
    async with observer(kubeconfig) as obs, Watcher(obs, f"{GRANT_LABEL}={tag}", "token") as watch:
        for mode, installed in modes:
            for doc in apf:
                await asyncio.to_thread(_apply if installed else _delete, api, doc)
            level = "projector" if installed else "workload-low"
            await _until_served_by(as_projector, api, level)
            probe = Probe(as_probe)
            result: dict[str, Any] = {"projector_level": level}
            async with controller(
                kubeconfig, work / f"{tag}-{installed}.log", run_as=as_projector
            ) as c:
                await watch.until(watch.all_equal(copies, values.current), 600)
                before = _counts(c)
                async with probing(probe):
                    t_idle = time.monotonic()
                    await asyncio.sleep(idle_seconds)  # the probe's baseline, the API server idle
                    idle_end = time.monotonic()
                    windows, times = [], []
                    for _ in range(samples):
                        value = values.next()
                        t0 = await put_value(obs, src, "hub", "token", value)
                        t1 = await watch.reached(copies, value, 600)
                        windows.append((t0, t1))
                        times.append((t1 - t0) * 1000)
                puts, throttled, written = (x - y for x, y in zip(_counts(c), before, strict=True))
            for verb in ("GET", "LIST"):
                idle = probe.between(t_idle, idle_end, verb)
                during = [s for t0, t1 in windows for s in probe.between(t0, t1, verb)]
                result[f"probe_{verb}_idle"] = _stats(idle)
                result[f"probe_{verb}_during_fanout"] = _stats(during)
            result["last_copy"] = summary(times, "ms")
            result["copies_written"] = written
            result["copy_puts"] = puts
            result["copy_puts_429"] = throttled
            names = {uid: name for name, uid in priority_levels(api).items()}
            result["probe_levels"] = sorted(names.get(uid, uid) for uid in probe.levels if uid)
            assert written == n * samples, f"{mode}: {written} copies written, {n * samples} due"
            assert puts == written + throttled, f"{mode}: {puts} PUTs, {throttled} of them 429"
            systems[f"projector ({mode})"] = result
    for doc in apf:  # the API server as it was found (a shared test plane has none of them)
        await asyncio.to_thread(_delete, api, doc)
    await kube.delete(GRANTS, tag)  # no controller runs: the copies stay, out of later runs' way
    ratios: dict[str, float] = {}
    for key, r in systems.items():
        for verb in ("GET", "LIST"):
            idle, during = r[f"probe_{verb}_idle"], r[f"probe_{verb}_during_fanout"]
            if idle.get("samples") and during.get("samples"):
                ratios[f"{key}: probe {verb} p99 during/idle"] = during["p99"] / idle["p99"]
                ratios[f"{key}: probe {verb} p50 during/idle"] = during["median"] / idle["median"]
    params = {
        "namespaces": n,
        "samples": samples,
        "probe_secrets": PROBE_SECRETS,
        "probe_pause_s": PAUSE,
        "idle_s": idle_seconds,
    }
    return write_result(f"fairness-{n}", params, systems, ratios, out=out)
