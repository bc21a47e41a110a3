"""Our informer and client against the real API server: list+watch, filters, resume, stalls.

(A 410 cannot be provoked against the session's API server: its watch cache serves any old
resourceVersion of a young cluster. tests/integration/test_faults.py provokes one for real on a
plane without a watch cache, after an etcd compaction; tests/unit/test_informer.py covers the
relist's details.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from projector.cache.caches import Cache, Kind, Spec
from projector.cache.informer import Informer
from projector.client.kube import Kube
from projector.core.kinds import SECRETS, Obj
from projector.core.model import ObjectKey
from projector.errors import NotFound


async def until(cond: Callable[[], object], within: float = 20.0) -> None:
    """Await a condition with a deadline (the async twin of `eventually`)."""
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110 - polls state another task changes, with a deadline
            await asyncio.sleep(0.02)  # allowed-sleep: poll interval under asyncio.timeout


def _key(o: Obj) -> ObjectKey:
    return ObjectKey(o["metadata"]["namespace"], o["metadata"]["name"])


def _data(o: Obj) -> dict[str, str]:
    return dict(o.get("data") or {})


@pytest.fixture
async def kube(projector_kubeconfig: Path) -> AsyncIterator[Kube]:
    """Our client as the shipped RBAC's ServiceAccount, never admin: what the informers may
    list and watch here is what they may list and watch in a cluster."""
    k = await Kube.connect(str(projector_kubeconfig))
    yield k
    await k.close()


def secret(core: client.CoreV1Api, ns: str, name: str, labels: dict[str, str], v: str) -> None:
    core.create_namespaced_secret(
        ns,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, labels=labels),
            data={"v": base64.b64encode(v.encode()).decode()},
        ),
    )


def informer(
    kube: Kube,
    label: str,
    changes: list[tuple[object, object]] | None = None,
    **kw: Any,
) -> Informer[ObjectKey, dict[str, str]]:
    """An informer of the Secrets labelled `label=yes`, into a cache of their data."""
    spec = Spec(Kind.COPY, SECRETS, _data, _key, f"{label}=yes")
    record = changes.append if changes is not None else lambda _change: None
    cache: Cache[ObjectKey, dict[str, str]] = Cache(spec, lambda old, new: record((old, new)))
    return Informer(kube, cache, **kw)


def keys(inf: Informer[ObjectKey, dict[str, str]]) -> set[ObjectKey]:
    return set(inf.cache)


def counted(
    kube: Kube, label: str, **kw: Any
) -> tuple[Informer[ObjectKey, dict[str, str]], Counter[str]]:
    """An informer of `label`'s Secrets (see `informer`), and the count of its events by type."""
    events: Counter[str] = Counter()
    return informer(kube, label, on_event=lambda _k, t: events.update([t]), **kw), events


async def arrives(
    core: client.CoreV1Api, inf: Informer[ObjectKey, dict[str, str]], key: ObjectKey, label: str
) -> None:
    """Create the Secret `key`, labelled for `inf`, and wait until `inf`'s cache has it."""
    secret(core, key.namespace, key.name, {label: "yes"}, "1")
    await until(lambda: key in keys(inf))


@contextlib.asynccontextmanager
async def running(inf: Informer[ObjectKey, dict[str, str]]) -> AsyncIterator[None]:
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.cache.synced.wait(), 20)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_list_then_watch_with_label_filter(
    kube: Kube, core_v1: client.CoreV1Api, namespace: str
) -> None:
    label = f"informer-test-{namespace}"
    secret(core_v1, namespace, "before", {label: "yes"}, "1")
    secret(core_v1, namespace, "unrelated", {}, "1")
    changes: list[tuple[object, object]] = []
    inf = informer(kube, label, changes)
    async with running(inf):
        assert keys(inf) == {ObjectKey(namespace, "before")}
        secret(core_v1, namespace, "after", {label: "yes"}, "2")
        secret(core_v1, namespace, "unrelated-2", {}, "2")
        await until(lambda: ObjectKey(namespace, "after") in keys(inf))
        core_v1.patch_namespaced_secret(
            "before", namespace, {"metadata": {"labels": {label: None}}}
        )
        await until(lambda: ObjectKey(namespace, "before") not in keys(inf))
        assert keys(inf) == {ObjectKey(namespace, "after")}
        assert (changes[-1][0], changes[-1][1]) == ({"v": base64.b64encode(b"1").decode()}, None)


async def test_get_missing_is_not_found(kube: Kube, namespace: str) -> None:
    with pytest.raises(NotFound):
        await kube.get(SECRETS, "nope", namespace=namespace, metadata_only=True)


async def test_resumes_after_server_timeout(
    kube: Kube, core_v1: client.CoreV1Api, namespace: str
) -> None:
    label = f"informer-410-{namespace}"
    inf, events = counted(kube, label, timeout_seconds=1)
    async with running(inf):
        await until(lambda: events["WATCH_RESTART"] >= 1)  # the server ended a watch; resumed
        await arrives(core_v1, inf, ObjectKey(namespace, "a"), label)
        restarts = events["WATCH_RESTART"]
        await until(lambda: events["WATCH_RESTART"] > restarts)
        await arrives(core_v1, inf, ObjectKey(namespace, "b"), label)
        assert inf.cache.healthy.is_set() and events["RELIST"] == 1  # resumed, never relisted


async def test_silent_watch_is_detected_and_restarted(
    kube: Kube, core_v1: client.CoreV1Api, namespace: str
) -> None:
    label = f"informer-stall-{namespace}"
    inf, events = counted(kube, label, read_deadline=0.5)
    async with running(inf):
        await until(lambda: events["ERROR"] >= 1)  # no byte for 0.5 s: treated as stalled
        await arrives(core_v1, inf, ObjectKey(namespace, "late"), label)
