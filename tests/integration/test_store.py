"""The store on the real API server, under the shipped RBAC: informers and a one-shot load agree.

`projector explain` will plan from a store loaded once; the controller plans from a store its
informers keep current. Both must give the same snapshot, hence the same plan.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from kubernetes import client

from projector.cache import probe
from projector.cache.informer import Informer
from projector.cache.store import Store
from projector.client.kube import Kube
from projector.core.model import ObjectKey
from projector.core.plans import SourceState
from projector.core.reconcile import plan
from tests.support import Cluster, NamespaceFactory


@contextlib.asynccontextmanager
async def informed(kube: Kube) -> AsyncIterator[Store]:
    store = Store(kube)
    tasks = [asyncio.create_task(Informer(kube, c).run()) for c in store.caches]
    try:
        async with asyncio.timeout(20):
            await asyncio.gather(*(c.synced.wait() for c in store.caches))
        yield store
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_store_loaded_once_snapshots_like_the_informed_one(
    projector_kubeconfig: Path, k8s: Cluster, make_namespace: NamespaceFactory
) -> None:
    src = make_namespace()
    listed = make_namespace()
    team = f"team-{src}"
    selected = make_namespace(labels={"team": team})
    k8s.source(src, "hub", {"token": "store-canary-1"}, export_to="*")
    k8s.core.create_namespaced_secret(
        selected,
        client.V1Secret(
            metadata=client.V1ObjectMeta(
                name="hub", labels={"projector.nebari.dev/managed-by": "projector"}
            ),
            data={"token": "eA=="},
        ),
    )  # someone else's Secret at the target name: the snapshot must show it
    grant = k8s.grant((src, "hub"), namespaces=[listed], selector={"matchLabels": {"team": team}})
    kube = await Kube.connect(str(projector_kubeconfig))
    try:
        async with informed(kube) as live:
            loaded = Store(kube)
            await loaded.load()
            deadline = asyncio.get_running_loop().time() + 20
            while True:  # the informers may trail the one-shot lists by a few events
                one, two = await probe.snapshot(loaded, grant), await probe.snapshot(live, grant)
                if one == two or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)  # allowed-sleep: poll interval under a deadline
    finally:
        await kube.close()
    assert one == two
    assert one.source_state is SourceState.AVAILABLE
    assert set(one.namespaces) == {listed, selected}
    assert ObjectKey(selected, "hub") in one.copies  # at the target name: the plan sees it
    assert ObjectKey(listed, "hub") not in one.copies
    assert plan(one) == plan(two)
