"""What a tenant sees: a new namespace getting its copy, and a copy going when consent goes.

Each system (projector, projection, kubernetes-replicator) runs alone in its block, with its
defaults, its own source and its own namespace label; every time is from t0, just before the
triggering write is sent (by the harness's own client, the same for all), to the receipt of
the watch event (the floor's `Observer`) that shows the result:

- new namespace, single: one namespace carrying the grant's label is created; t1 its copy's
  ADDED event. Samples one after another.
- new namespace, burst: `burst` such namespaces created at once (32 creates in flight, as the
  floor writes); each namespace's time from its own create's send, and the last copy's from
  the first send.
- revocation, relabelled: a namespace holding a copy loses the label; t1 the copy's DELETED.
- revocation, grant deleted: the grant (projection's ClusterProjection) of a fan-out to
  `fan` namespaces is deleted; t1 the last copy's DELETED. Each sample recreates it first.
  kubernetes-replicator has no grant: its fan-out is the source's `replicate-to-matching`
  annotation, whose removal leaves every copy in place; the only withdrawal that takes its
  copies away is the source's deletion, so its "grant deleted" deletes the source (and each
  sample creates it again).

Both revocations are under deletion on revoke, each system's default (projector's
`onRevoke: Delete`; projection deletes what it no longer projects; kubernetes-replicator
deletes a copy whose namespace no longer matches, and the copies of a deleted source).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from benchmarks import peers
from benchmarks.common import RESULTS, summary, write_result
from benchmarks.floor import WRITE_CONCURRENCY, Observer, observer
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
from projector.client.kube import Kube
from projector.core.kinds import GRANTS, NAMESPACES, SECRETS
from projector.core.model import GRANT_LABEL
from tests.bed.kube import api_client

LABEL = "bench-tenant"
NAME = "hub"
WITHIN = 120.0


@dataclass(frozen=True)
class Sizes:
    """Samples of each measure (see the module's docstring)."""

    single: int = 30
    burst: int = 200
    relabel: int = 30
    fan: int = 100
    deletes: int = 3


@dataclass
class Results:
    """One system's samples, in ms."""

    metrics: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metric: str, seconds: float) -> None:
        self.metrics.setdefault(metric, []).append(seconds * 1000)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for metric, ms in self.metrics.items():
            out[metric] = summary(ms, "ms") | {"values": [round(x, 2) for x in ms]}
        return out


@dataclass
class System:
    """How a system is asked for a fan-out over namespaces labelled `LABEL=tag`, and undone."""

    tag: str
    selector: str
    """The label selector of its copies (what the Watcher follows)."""
    project: Callable[[], Awaitable[None]]
    withdraw: Callable[[], Awaitable[None]]


async def _timed_creates(kube: Kube, names: list[str], tag: str) -> dict[str, float]:
    """Create these namespaces (WRITE_CONCURRENCY at once); when each create was sent."""
    sent: dict[str, float] = {}

    async def one(name: str) -> None:
        sent[name] = time.monotonic()
        await kube.create(NAMESPACES, {"metadata": {"name": name, "labels": {LABEL: tag}}})

    await gather_limited((one(n) for n in names), WRITE_CONCURRENCY)
    return sent


async def _block(kube: Kube, obs: Observer, system: System, sizes: Sizes, res: Results) -> None:
    tag = system.tag
    async with Watcher(obs, system.selector, "token") as watch:
        await system.project()
        # new namespaces, one at a time (the first is a warm-up)
        for i in range(sizes.single + 1):
            ns = f"{tag}-one-{i}"
            sent = await _timed_creates(kube, [ns], tag)
            await watch.until(lambda ns=ns: (ns, NAME) in watch.values, WITHIN)  # type: ignore[misc]
            if i:
                res.add("new_namespace", watch.since[ns, NAME] - sent[ns])
        # a burst created at once
        names = [f"{tag}-burst-{i}" for i in range(sizes.burst)]
        sent = await _timed_creates(kube, names, tag)
        keys = [(n, NAME) for n in names]
        await watch.until(lambda: all(k in watch.values for k in keys), WITHIN * 5)
        for n in names:
            res.add("new_namespace_in_burst", watch.since[n, NAME] - sent[n])
        res.add("burst_last_copy", max(watch.since[k] for k in keys) - min(sent.values()))
        # relabelled: the copies of the single namespaces go one at a time
        for i in range(min(sizes.relabel, sizes.single) + 1):
            ns = f"{tag}-one-{i}"
            t0 = time.monotonic()
            await kube.patch(NAMESPACES, ns, {"metadata": {"labels": {LABEL: None}}})
            await watch.until(lambda ns=ns: (ns, NAME) not in watch.values, WITHIN)  # type: ignore[misc]
            if i:
                res.add("revoked_relabelled", watch.gone[ns, NAME] - t0)
        # the grant deleted: a fan-out to the burst's namespaces goes at once
        fan = keys[: sizes.fan]
        for i in range(sizes.deletes + 1):
            await watch.until(lambda: all(k in watch.values for k in fan), WITHIN * 5)
            t0 = time.monotonic()
            await system.withdraw()
            await watch.until(lambda: not any(k in watch.values for k in fan), WITHIN * 5)
            if i:
                res.add("revoked_grant_deleted", max(watch.gone[k] for k in fan) - t0)
            await system.project()


@contextlib.asynccontextmanager
async def _projector(kube: Kube, kubeconfig: Path, work: Path, tag: str) -> AsyncIterator[System]:
    src = f"{tag}-src"
    await namespaces(kube, [src], {})
    await ensure(kube, SECRETS, exported(NAME, {"token": "v0"}), src)
    body = grant(tag, (src, NAME), selector={LABEL: tag})

    async def project() -> None:
        await kube.create(GRANTS, body)

    async def withdraw() -> None:
        await kube.delete(GRANTS, tag)

    async with controller(kubeconfig, work / f"{tag}.log"):
        yield System(tag, f"{GRANT_LABEL}={tag}", project, withdraw)
    with contextlib.suppress(Exception):
        await withdraw()


@contextlib.asynccontextmanager
async def _running(
    peer: peers.Peer,
    kubeconfig: Path,
    work: Path,
    tag: str,
    project: Callable[[], Awaitable[None]],
    withdraw: Callable[[], Awaitable[None]],
) -> AsyncIterator[System]:
    """A peer started and ready, as a System whose copies carry `bench-peer=tag` (the source's
    label, which both peers copy); afterwards its fan-out withdrawn and the peer stopped."""
    proc = peer.start(kubeconfig, work / f"{tag}.log")
    try:
        await asyncio.to_thread(peer.wait_ready, proc)
        yield System(tag, f"bench-peer={tag}", project, withdraw)
    finally:
        with contextlib.suppress(Exception):
            await withdraw()
        peers.stop(proc)


@contextlib.asynccontextmanager
async def _projection(kube: Kube, kubeconfig: Path, work: Path, tag: str) -> AsyncIterator[System]:
    peer = peers.Projection()
    src = f"{tag}-src"
    await namespaces(kube, [src], {})
    await ensure(kube, SECRETS, secret(NAME, {"token": "v0"}), src)
    api = api_client(kubeconfig)
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    name = f"{src}.{NAME}"  # its ClusterProjection's, as `Projection` names it
    args = (peer.GROUP, peer.API_VERSION, peer.PLURAL)

    def gone() -> bool:
        try:
            custom.get_cluster_custom_object(*args, name)
        except k8s.ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    async def project() -> None:
        deadline = time.monotonic() + WITHIN
        while not await asyncio.to_thread(gone):  # its finalizer: the last one still ends
            if time.monotonic() > deadline:
                raise TimeoutError(f"ClusterProjection {name} never went")
            await asyncio.sleep(0.05)
        labels = {"bench-peer": tag}
        await asyncio.to_thread(
            peer.setup_fanout, core, custom, src, NAME, [], WITHIN, labels, (LABEL, tag)
        )

    async def withdraw() -> None:
        await asyncio.to_thread(custom.delete_cluster_custom_object, *args, name)

    try:
        async with _running(peer, kubeconfig, work, tag, project, withdraw) as system:
            yield system
    finally:
        api.close()


@contextlib.asynccontextmanager
async def _replicator(kube: Kube, kubeconfig: Path, work: Path, tag: str) -> AsyncIterator[System]:
    peer = peers.Replicator()
    src = f"{tag}-src"
    await namespaces(kube, [src], {})
    body = secret(
        NAME,
        {"token": "v0"},
        labels={"bench-peer": tag},  # copied onto its copies: what the Watcher follows
        annotations={peer.REPLICATE_TO_MATCHING: f"{LABEL}={tag}"},
    )

    async def project() -> None:
        await kube.create(SECRETS, body, namespace=src)

    async def withdraw() -> None:
        await kube.delete(SECRETS, NAME, namespace=src)

    async with _running(peer, kubeconfig, work, tag, project, withdraw) as system:
        yield system


SystemOf = Callable[[Kube, Path, Path, str], contextlib.AbstractAsyncContextManager[System]]
PEERS: tuple[tuple[Callable[[], peers.Peer], SystemOf, str], ...] = (
    (peers.Projection, _projection, "tn-pjn"),
    (peers.Replicator, _replicator, "tn-rep"),
)
"""Each peer, its system, its tag; run after projector, in this order."""


async def run(
    kube: Kube,
    kubeconfig: Path,
    work: Path,
    sizes: Sizes,
    out: Path = RESULTS,
    build_peers: bool = True,
) -> Path:
    """Each system's block, projector first; one result file, `tenant`. Without
    `build_peers`, a peer runs only if already built."""
    systems: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    async with observer(kubeconfig) as obs:
        res = Results()
        async with _projector(kube, kubeconfig, work, "tn-proj") as system:
            await _block(kube, obs, system, sizes, res)
        systems["projector"] = res.summary()
        for make, system_of, tag in PEERS:
            peer = make()
            try:
                if build_peers:
                    peer.ensure_built()
                elif peer.built() is None:
                    raise peers.PeerUnavailable(f"{peer.name} {peer.version} not built")
            except peers.PeerUnavailable as e:
                unavailable[peer.name] = str(e).strip().splitlines()[-1][:300]
                continue
            res = Results()
            async with system_of(kube, kubeconfig, work, tag) as system:
                await _block(kube, obs, system, sizes, res)
            systems[f"{peer.name} {peer.version}"] = res.summary()
    ratios: dict[str, float] = {}
    mine = systems["projector"]
    for key, theirs in systems.items():
        if key == "projector":
            continue
        for metric, s in mine.items():
            ratios[f"projector/{key.split()[0]} {metric} p50"] = (
                s["median"] / theirs[metric]["median"]
            )
            ratios[f"projector/{key.split()[0]} {metric} p99"] = s["p99"] / theirs[metric]["p99"]
    params = {
        "single": sizes.single,
        "burst": sizes.burst,
        "relabel": sizes.relabel,
        "fan": sizes.fan,
        "deletes": sizes.deletes,
        "create_concurrency": WRITE_CONCURRENCY,
        "peers_unavailable": unavailable,
    }
    return write_result("tenant", params, systems, ratios, out=out)
