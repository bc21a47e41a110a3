"""The informer's state machine on a scripted API: relist on 410, health on errors.

The real API server is used in tests/integration/test_informer.py; what it cannot be made to
do on demand (answer 410 Gone) is scripted here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from projector.api import SECRETS, Api, Obj
from projector.errors import Gone, ServerError
from projector.informer import Informer
from projector.store import Cache, Kind, Spec


def obj(name: str, rv: str, v: str = "x") -> Obj:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "data": {"v": v}}


class ScriptedKube:
    """list() serves `objects`; each watch() plays the next script: events, then an error."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.rv = "10"
        self.lists = 0
        self.watch_rvs: list[str] = []
        self.scripts: list[tuple[list[tuple[str, Obj]], BaseException | None]] = []
        self.idle = asyncio.Event()
        self.later: tuple[dict[str, Obj], str] | None = None
        """What later lists return: the world as it moved on meanwhile."""

    async def list(self, _res: Any, **_kw: Any) -> tuple[list[Obj], str]:
        self.lists += 1
        if self.later is not None and self.lists > 1:
            self.objects, self.rv = self.later
        return list(self.objects.values()), self.rv

    async def watch(
        self, _res: Any, *, resource_version: str, **_kw: Any
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        self.watch_rvs.append(resource_version)
        if not self.scripts:
            yield "OPEN", {}
            self.idle.set()
            await asyncio.Event().wait()  # a quiet, healthy watch
            return
        events, error = self.scripts.pop(0)
        yield "OPEN", {}
        for e in events:
            yield e
        if error is not None:
            raise error


@contextlib.asynccontextmanager
async def running(inf: Informer[str, Any]) -> AsyncIterator[None]:
    task = asyncio.create_task(inf.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


SPEC: Spec[str, str] = Spec(
    Kind.COPY, SECRETS, lambda o: o["data"]["v"], lambda o: o["metadata"]["name"]
)


def informer(kube: ScriptedKube, changes: list[tuple[Any, Any]]) -> Informer[str, Any]:
    fake: Api = kube  # type: ignore[assignment]
    cache: Cache[str, str] = Cache(SPEC, lambda old, new: changes.append((old, new)))
    return Informer(fake, cache, backoff=(0.0, 0.0))


def items(inf: Informer[str, Any]) -> dict[str, Any]:
    return dict(inf.cache.items())


async def test_410_relists_and_reports_what_vanished_as_deleted() -> None:
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5"), "b": obj("b", "6")}
    kube.scripts = [([("MODIFIED", obj("a", "11", "y"))], Gone(410, "Expired"))]
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    # While the first watch plays, the world moves on: b is deleted, c appears (missed events).
    kube.later = ({"a": obj("a", "11", "y"), "c": obj("c", "12")}, "20")
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert kube.lists == 2  # initial list + relist after 410
    assert kube.watch_rvs == ["10", "20"]  # the relist's version, never the expired one
    assert items(inf) == {"a": "y", "c": "x"}
    assert (None, "x") in changes  # c added by the relist
    assert ("x", None) in changes  # b deleted by the relist (authoritative: a fresh list)
    assert inf.cache.synced.is_set() and inf.cache.healthy.is_set()


async def test_broken_watch_resumes_from_last_version_and_is_unhealthy_meanwhile() -> None:
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5")}
    kube.scripts = [([("ADDED", obj("b", "15"))], ServerError(0, "ReadTimeout"))]
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    health: list[bool] = []
    orig = inf.cache.healthy.clear

    def clear() -> None:
        health.append(False)
        orig()

    inf.cache.healthy.clear = clear  # type: ignore[method-assign]
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert kube.lists == 1  # a broken connection resumes; only 410 relists
    assert kube.watch_rvs == ["10", "15"]
    assert health.count(False) == 2  # before the first list, and when the watch broke
    assert items(inf) == {"a": "x", "b": "x"}
    assert inf.cache.healthy.is_set()


async def test_bookmarks_move_the_version_without_changes() -> None:
    kube = ScriptedKube()
    kube.scripts = [([("BOOKMARK", {"metadata": {"resourceVersion": "99"}})], None)]
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert kube.watch_rvs == ["10", "99"]
    assert changes == []


async def test_unparseable_object_is_skipped_not_fatal() -> None:
    kube = ScriptedKube()
    kube.scripts = [
        (
            [
                ("ADDED", {"metadata": {"name": "bad", "resourceVersion": "11"}}),
                ("ADDED", obj("good", "12")),
            ],
            None,
        )
    ]
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert items(inf) == {"good": "x"}


async def test_a_failing_index_update_ends_the_informer_loudly() -> None:
    """A bug in the store's indexes must not drop a change silently: the informer dies with it."""
    kube = ScriptedKube()
    kube.scripts = [([("ADDED", obj("a", "11"))], None)]

    def broken(_old: Any, _new: Any) -> None:
        raise RuntimeError("index bug")

    fake: Api = kube  # type: ignore[assignment]
    inf = Informer(fake, Cache(SPEC, broken), backoff=(0.0, 0.0))
    with pytest.raises(RuntimeError, match="index bug"):
        await asyncio.wait_for(inf.run(), 5)
