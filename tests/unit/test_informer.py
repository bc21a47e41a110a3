"""The informer's state machine on a scripted API: relist on 410, health on errors.

The real API server is used in tests/integration/test_informer.py; what it cannot be made to
do on demand (answer 410 Gone) is scripted here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import pytest
import structlog.testing

from projector.cache.caches import Cache, Kind, Spec
from projector.cache.informer import Informer
from projector.client.api import Api
from projector.core.kinds import SECRETS, Obj
from projector.errors import Forbidden, Gone, ServerError, TooManyRequests


def obj(name: str, rv: str, v: str = "x") -> Obj:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "data": {"v": v}}


class ScriptedKube:
    """pages() serves `objects`; each watch() plays the next script: events, then an error."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.rv = "10"
        self.lists = 0
        self.watch_rvs: list[str] = []
        self.scripts: list[tuple[list[tuple[str, Obj]], BaseException | None]] = []
        self.idle = asyncio.Event()
        self.later: tuple[dict[str, Obj], str] | None = None
        """What later lists return: the world as it moved on meanwhile."""
        self.page_errors: dict[tuple[int, int], BaseException] = {}
        """(list number, page index) -> the error that page's request raises."""
        self.before_page: Callable[[], None] = lambda: None
        """Called as each page is requested (to see what the informer did with the last)."""

    async def pages(
        self, _res: Any, *, limit: int, **_kw: Any
    ) -> AsyncGenerator[tuple[list[Obj], str], None]:
        self.lists += 1
        if self.later is not None and self.lists > 1:
            self.objects, self.rv = self.later
        objs = list(self.objects.values())
        for index, start in enumerate(range(0, max(len(objs), 1), limit)):
            self.before_page()
            if (error := self.page_errors.pop((self.lists, index), None)) is not None:
                raise error
            yield objs[start : start + limit], self.rv

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


def informer(
    kube: ScriptedKube, changes: list[tuple[Any, Any]], spec: Spec[str, str] = SPEC
) -> Informer[str, Any]:
    fake: Api = kube  # type: ignore[assignment]
    cache: Cache[str, str] = Cache(spec, lambda old, new: changes.append((old, new)))
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


PAGED: Spec[str, str] = Spec(
    Kind.COPY, SECRETS, lambda o: o["data"]["v"], lambda o: o["metadata"]["name"], page=2
)


async def test_a_list_is_cached_page_by_page() -> None:
    """Each page is in the cache before the next is asked for: one page in memory at a time."""
    kube = ScriptedKube()
    kube.objects = {n: obj(n, "5") for n in "abcde"}
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes, PAGED)
    cached_before_page: list[int] = []
    kube.before_page = lambda: cached_before_page.append(len(inf.cache))
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert cached_before_page == [0, 2, 4]  # pages of 2, each parsed before the next request
    assert items(inf) == dict.fromkeys("abcde", "x")
    assert kube.watch_rvs == ["10"]


async def test_a_list_that_expires_midway_deletes_nothing_and_starts_over() -> None:
    """A 410 on a continue token: what the partial list lacked is no evidence of deletion."""
    kube = ScriptedKube()
    kube.objects = {n: obj(n, "5") for n in "abcd"}
    kube.scripts = [([], Gone(410, "Expired"))]  # the first watch expires: relist
    kube.later = ({n: obj(n, "21") for n in "ace"}, "20")  # b and d deleted, e created
    kube.page_errors = {(2, 1): Gone(410, "Expired", "continue token expired")}
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes, PAGED)
    cached: list[set[str]] = []
    kube.before_page = lambda: cached.append(set(inf.cache))
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert kube.lists == 3  # the first list, the one that expired on its 2nd page, a fresh one
    assert cached[4] == set("abcd")  # as list 3 starts: b and d still there after the 410
    assert items(inf) == dict.fromkeys("ace", "x")  # removed only once a whole list lacked them
    assert kube.watch_rvs == ["10", "20"]
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


async def test_a_deleted_event_whose_object_does_not_parse_still_removes_the_key() -> None:
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5")}
    kube.scripts = [([("DELETED", {"metadata": {"name": "a", "resourceVersion": "11"}})], None)]
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert items(inf) == {}
    assert changes[-1] == ("x", None)
    assert kube.watch_rvs == ["10", "11"]


async def test_an_unparseable_object_of_a_relist_keeps_what_the_cache_knew() -> None:
    """It still exists on the server: a relist must not report it deleted."""
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5"), "b": obj("b", "6")}
    kube.scripts = [([], Gone(410, "Expired"))]
    kube.later = (
        {"a": {"metadata": {"name": "a", "resourceVersion": "19"}}, "b": obj("b", "6")},
        "20",
    )
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
    assert kube.lists == 2
    assert items(inf) == {"a": "x", "b": "x"}
    assert ("x", None) not in changes


INT_SPEC: Spec[str, int] = Spec(
    Kind.COPY, SECRETS, lambda o: int(o["data"]["v"]), lambda o: o["metadata"]["name"]
)


async def test_a_skipped_object_is_logged_with_why_and_never_its_value() -> None:
    kube = ScriptedKube()
    kube.objects = {
        "missing": {"metadata": {"name": "missing", "namespace": "ns", "resourceVersion": "1"}},
        "bad": obj("bad", "2", "CANARY-not-a-number"),
    }
    fake: Api = kube  # type: ignore[assignment]
    inf = Informer(fake, Cache(INT_SPEC, lambda _o, _n: None), backoff=(0.0, 0.0))
    with structlog.testing.capture_logs() as logs:
        async with running(inf):
            await asyncio.wait_for(kube.idle.wait(), 5)
    skipped = {e["object"]: e for e in logs if e["event"] == "skipping unparseable object"}
    assert skipped["ns/missing"]["error"] == "KeyError"
    assert skipped["ns/missing"]["field"] == "data"
    assert skipped["ns/bad"]["error"] == "ValueError"
    assert "invalid literal for int()" in skipped["ns/bad"]["message"]
    assert "CANARY" not in repr(logs)


async def test_list_failures_back_off_by_policy_and_each_retry_is_logged() -> None:
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5")}
    kube.page_errors = {(n, 0): ServerError(503, "ServiceUnavailable") for n in (1, 2, 3)}
    changes: list[tuple[Any, Any]] = []
    fake: Api = kube  # type: ignore[assignment]
    cache: Cache[str, str] = Cache(SPEC, lambda old, new: changes.append((old, new)))
    inf = Informer(fake, cache, backoff=(0.01, 0.03))
    with structlog.testing.capture_logs() as logs:
        async with running(inf):
            await asyncio.wait_for(kube.idle.wait(), 5)
    retries = [e for e in logs if e["event"] == "watch failed; retrying"]
    assert [(e["attempt"], e["status"]) for e in retries] == [(1, 503), (2, 503), (3, 503)]
    waits = [e["retry_in"] for e in retries]
    # 10 ms doubling, plus up to 10 ms of jitter, capped at 30 ms
    assert waits == sorted(waits) and waits[0] <= 0.02 and waits[-1] == 0.03
    assert kube.lists == 4 and items(inf) == {"a": "x"}
    assert inf.cache.healthy.is_set() and inf.failing_since is None


async def test_an_unreachable_server_is_neither_refusal_nor_wedge_and_a_refusal_is_timed() -> None:
    """For /healthz: failures to reach the server never start the refusal clock; 403s do, and
    any success stops it; an informer that keeps retrying keeps stepping (not wedged)."""
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5")}
    down = ServerError(0, "ClientConnectorError")
    kube.scripts = [([], down), ([], down), ([], Forbidden(403, "Forbidden"))]
    changes: list[tuple[Any, Any]] = []
    inf = informer(kube, changes)
    seen: list[tuple[bool, bool]] = []
    original = kube.watch

    def watch(*args: Any, **kw: Any) -> AsyncGenerator[tuple[str, Obj], None]:
        seen.append((inf.failing_since is not None, inf.refused_since is not None))
        return original(*args, **kw)

    kube.watch = watch  # type: ignore[method-assign]
    async with running(inf):
        await asyncio.wait_for(kube.idle.wait(), 5)
        assert not inf.wedged()
    # Before each watch: (failing, refused). Unreachable twice: failing, never refused; after
    # the 403: refused; the final watch's OPEN cleared both.
    assert seen == [(False, False), (True, False), (True, False), (True, True)]
    assert inf.failing_since is None and inf.refused_since is None


def test_an_informer_that_stops_stepping_is_wedged() -> None:
    now = [100.0]
    cache: Cache[str, str] = Cache(SPEC, lambda old, new: None)
    inf: Informer[str, Any] = Informer(
        ScriptedKube(),  # type: ignore[arg-type]
        cache,
        read_deadline=5,
        request_timeout=10,
        backoff=(0.1, 1.0),
        clock=lambda: now[0],
    )
    now[0] += 10 + 1 + 59  # the longest step (10 s), the longest backoff (1 s), slack (60 s)
    assert not inf.wedged()
    now[0] += 1.5
    assert inf.wedged()


async def retried(
    page_errors: dict[tuple[int, int], BaseException],
) -> tuple[list[tuple[int, float]], Informer[str, Any]]:
    """An informer of one object `a` run until synced over a server that first answers these
    errors (by (list call, page)): the (status, retry_in) of each retry it logged, and it."""
    kube = ScriptedKube()
    kube.objects = {"a": obj("a", "5")}
    kube.page_errors = page_errors
    fake: Api = kube  # type: ignore[assignment]
    inf = Informer(fake, Cache(SPEC, lambda _o, _n: None), backoff=(0.005, 10.0))
    with structlog.testing.capture_logs() as logs:
        async with running(inf):
            await asyncio.wait_for(kube.idle.wait(), 5)
    retries = [(e["status"], e["retry_in"]) for e in logs if e["event"] == "watch failed; retrying"]
    return retries, inf


async def test_refusals_just_after_an_outage_keep_the_short_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server back from an outage answers 403 while its authorizer warms up: part of the
    outage, so the retries stay at the unreachable cap, not doubling towards backoff[1]."""
    import projector.cache.informer as informer_module

    monkeypatch.setattr(informer_module, "UNREACHABLE_RETRY_MAX", 0.01)
    errors = [ServerError(0, "ClientConnectorError")] + [Forbidden(403, "Forbidden")] * 4
    retries, inf = await retried({(n, 0): e for n, e in enumerate(errors, start=1)})
    assert [s for s, _ in retries] == [0, 403, 403, 403, 403]
    assert all(wait <= 0.01 for _, wait in retries), retries
    assert items(inf) == {"a": "x"}


async def test_a_429_just_after_an_outage_waits_less_than_its_whole_second_of_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted server answers the first request for a custom resource with a 429 "storage
    is (re)initializing", Retry-After 1 s, while that resource's cache fills (milliseconds):
    part of the outage, so the informer retries sooner, doubling up to the Retry-After."""
    import projector.cache.informer as informer_module

    monkeypatch.setattr(informer_module, "UNREACHABLE_RETRY_MAX", 0.01)
    monkeypatch.setattr(informer_module, "WARMING_RETRY", 0.01)
    starting = TooManyRequests(429, "TooManyRequests", "storage is (re)initializing", (), 1.0)
    errors = [ServerError(0, "ClientConnectorError"), starting, starting, starting]
    retries, inf = await retried({(n, 0): e for n, e in enumerate(errors, start=1)})
    assert retries == [(0, 0.01), (429, 0.01), (429, 0.02), (429, 0.04)], retries
    assert items(inf) == {"a": "x"}


async def test_a_429_of_a_server_that_was_answering_waits_its_whole_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not after an outage (the server answered the last request): Retry-After is the wait."""
    import projector.cache.informer as informer_module

    monkeypatch.setattr(informer_module, "WARMING_RETRY", 0.01)
    retries, _ = await retried({(1, 0): TooManyRequests(429, "TooManyRequests", retry_after=0.05)})
    assert retries == [(429, 0.05)], retries
