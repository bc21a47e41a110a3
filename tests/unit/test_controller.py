"""The reconcile shell on the in-memory API double: what it writes and what it tells the queue."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import trace

from projector.cache.caches import Kind
from projector.cache.store import Store
from projector.client.retries import Retries
from projector.config import Config
from projector.control.controller import Controller
from projector.control.queue import WorkQueue
from projector.control.recorder import Recorder
from projector.control.writer import Writer
from projector.core.kinds import EVENTS, GRANTS, NAMESPACES, SECRETS
from projector.core.model import HashKey
from projector.core.plans import Result
from projector.errors import ServerError, TooManyRequests
from projector.telemetry.metrics import Metrics
from tests.unit.factories import managed_fields
from tests.unit.fakeapi import FakeApi
from tests.unit.test_store import copy_obj, grant_obj, ns_obj, source_obj

HASH_KEY = HashKey(b"k" * 32)
"""The install's hash key, as `run` would have read it."""


async def controller(
    api: FakeApi,
    *,
    metrics: Metrics | None = None,
    tracer: trace.Tracer | None = None,
    config: Config | None = None,
) -> Controller:
    """A controller wired as `app` wires it, on the API double, its store loaded once."""
    store = Store(api)
    await store.load()
    metrics = metrics or Metrics()
    writer = Writer(
        api,
        metrics=metrics,
        retries=Retries(4, (0.001, 0.001)),
        tracer=tracer,
        status_retries=Retries(3, (0.001, 0.002)),
    )
    return Controller(
        store,
        config=config or Config(),
        metrics=metrics,
        queue=WorkQueue(),
        writer=writer,
        recorder=Recorder(writer, "test"),
        tracer=tracer,
        hash_key=HASH_KEY,
    )


def world(api: FakeApi, *, grant: dict[str, Any] | None = None) -> None:
    api.add(NAMESPACES, ns_obj("a"))
    api.add(NAMESPACES, ns_obj("src"))
    api.add(SECRETS, source_obj("src", "s"))
    api.add(GRANTS, grant or grant_obj("g", namespaces=["a"]))


def verbs(api: FakeApi) -> list[str]:
    return [f"{verb} {plural}" for verb, plural, _ in api.calls if verb not in ("LIST", "WATCH")]


def condition(api: FakeApi) -> tuple[str, str]:
    status: Any = api.get_object(GRANTS, "", "g")
    ready = next(c for c in status["status"]["conditions"] if c["type"] == "Ready")
    return ready["status"], ready["reason"]


async def test_projects_writes_status_once_and_tells_the_queue_to_forget() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    assert await ctl.reconcile("g") is Result.OK
    assert verbs(api) == ["CREATE secrets", "PATCH_STATUS projectiongrants", "CREATE events"]
    assert api.get_object(SECRETS, "a", "s") is not None
    assert condition(api) == ("True", "Projected")
    assert ctl.metrics.grants.labels("true")._value.get() == 1


async def test_a_cache_behind_the_server_means_no_work_at_all() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    ctl.store.copies.healthy.clear()
    api.calls.clear()
    assert await ctl.reconcile("g") is Result.UNHEALTHY
    assert api.calls == []


async def test_failed_writes_are_retried_with_backoff_and_reported() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    api.fail("CREATE", *[ServerError(503, "ServiceUnavailable")] * 4)
    assert await ctl.reconcile("g") is Result.ERROR
    assert condition(api) == ("False", "WriteFailed")
    assert ctl.metrics.writes.labels("Create", "error")._value.get() == 1
    status: Any = api.get_object(GRANTS, "", "g")
    ready = next(c for c in status["status"]["conditions"] if c["type"] == "Ready")
    assert ready["message"].endswith("; retried with backoff")


class CreatedApi(FakeApi):
    """Tells when a Secret create has gone through."""

    def __init__(self) -> None:
        super().__init__()
        self.created = asyncio.Event()

    async def create(self, res: Any, body: Any, **kw: Any) -> Any:
        out = await super().create(res, body, **kw)
        if res is SECRETS:
            self.created.set()
        return out


async def test_a_throttled_grant_waits_as_long_as_the_server_asked_before_its_next_try() -> None:
    api = CreatedApi()
    world(api)
    ctl = await controller(api)
    api.fail("CREATE", *[TooManyRequests(429, "TooManyRequests", retry_after=0.25)] * 4)
    loop = asyncio.get_running_loop()
    started = loop.time()
    ctl.queue.add_now("g")
    worker = asyncio.create_task(ctl._worker())
    try:
        await asyncio.wait_for(api.created.wait(), 5)
    finally:
        worker.cancel()
    creates = [c for c in api.calls if c[:2] == ("CREATE", SECRETS.plural)]
    assert len(creates) == 5  # 4 throttled tries in the first reconcile, 1 in the next
    # 3 waits of 0.25 s inside the first reconcile, and 0.25 s (not the 5 ms backoff) after it
    assert loop.time() - started >= 4 * 0.25


async def test_an_unreadable_source_is_retried_and_deletes_nothing() -> None:
    api = FakeApi()
    world(api, grant=grant_obj("g", ("src", "other"), namespaces=["a"], name="s"))
    api.add(SECRETS, copy_obj("a", "s", label="g", uid="uid-g"))
    ctl = await controller(api)
    api.fail("GET", ServerError(0, "ReadTimeout"))
    assert await ctl.reconcile("g") is Result.ERROR
    assert "DELETE secrets" not in verbs(api)
    assert condition(api) == ("False", "Unknown")


async def test_invalid_grant_gets_a_status_and_no_write() -> None:
    api = FakeApi()
    world(api, grant=grant_obj("g"))  # no target at all
    ctl = await controller(api)
    assert await ctl.reconcile("g") is Result.OK
    assert verbs(api) == ["PATCH_STATUS projectiongrants", "CREATE events"]  # told once
    assert condition(api) == ("False", "InvalidSpec")


async def test_a_deleted_grant_revokes_its_copies_by_their_recorded_policy() -> None:
    api = FakeApi()
    api.add(NAMESPACES, ns_obj("a"))
    api.add(SECRETS, copy_obj("a", "s", label="g", uid="uid-gone"))  # no policy: Retain
    api.add(SECRETS, copy_obj("a", "t", label="g", uid="uid-gone"))
    api.objects[SECRETS.plural, "a", "t"]["metadata"]["annotations"][
        "projector.nebari.dev/on-revoke"
    ] = "Delete"
    ctl = await controller(api)
    assert await ctl.reconcile("g") is Result.OK
    assert verbs(api) == ["DELETE secrets"]
    assert api.get_object(SECRETS, "a", "s") is not None
    assert api.get_object(SECRETS, "a", "t") is None


async def test_a_refused_event_never_fails_the_reconcile() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    api.fail("CREATE", None, ServerError(500, "Boom"))  # the copy lands, the Event does not
    assert await ctl.reconcile("g") is Result.OK
    assert api.get_object(SECRETS, "a", "s") is not None
    assert not [k for k in api.objects if k[0] == EVENTS.plural]
    assert verbs(api) == ["CREATE secrets", "PATCH_STATUS projectiongrants", "CREATE events"]


async def test_copy_events_share_the_debounce_of_source_events() -> None:
    """Echoes of one reconcile's writes arriving during the next must not cut its window."""
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    ctl.queue = WorkQueue(debounce=1.0, debounce_max=2.0)
    for kind in (Kind.SOURCE, Kind.COPY):
        ctl._enqueue(kind, ["g"])
    assert (len(ctl.queue), ctl.queue.waiting()) == (0, 1)  # debounced, not run at once
    ctl._enqueue(Kind.GRANT, ["g"])
    assert (len(ctl.queue), ctl.queue.waiting()) == (1, 0)  # a grant change runs at once


async def reload(ctl: Controller, api: FakeApi) -> None:
    """Refill the store as the informers would have seen the writes (the double records no
    managedFields: here projector's field manager owns the annotations it wrote)."""
    for (plural, _, _), obj in api.objects.items():
        meta = obj["metadata"]
        if plural == SECRETS.plural and "managedFields" not in meta:
            meta["managedFields"] = [managed_fields("projector", meta.get("annotations") or {})]
    await ctl.store.load()


async def test_a_status_that_could_not_be_written_fails_the_reconcile_and_lands_on_retry() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    api.fail("PATCH_STATUS", *[ServerError(503, "ServiceUnavailable")] * 3)  # every attempt
    assert await ctl.reconcile("g") is Result.ERROR  # never OK with a stale status
    patches = ["PATCH_STATUS projectiongrants"] * 3
    assert verbs(api) == ["CREATE secrets", *patches, "CREATE events"]  # what it did is told
    assert ctl.metrics.status_write_failures.labels("503")._value.get() == 3
    assert "status" not in api.objects[GRANTS.plural, "", "g"]
    api.calls.clear()
    await reload(ctl, api)  # the copy, and no status
    assert await ctl.reconcile("g") is Result.OK
    assert verbs(api) == ["PATCH_STATUS projectiongrants"]
    assert condition(api) == ("True", "Projected")


async def test_a_resync_of_an_in_sync_grant_writes_nothing() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    assert await ctl.reconcile("g") is Result.OK
    await reload(ctl, api)
    api.calls.clear()
    assert ctl.resync_idle() == 1
    assert await ctl.queue.get() == "g"
    assert await ctl.reconcile("g") is Result.OK
    assert verbs(api) == []


async def test_a_resync_leaves_a_backing_off_grant_to_its_backoff() -> None:
    api = FakeApi()
    world(api)
    api.add(GRANTS, grant_obj("h", namespaces=["a"], name="t"))
    ctl = await controller(api)
    ctl.queue = WorkQueue(backoff_base=60.0)
    ctl.queue.add_rate_limited("g")
    assert ctl.resync_idle() == 1  # h only
    assert (len(ctl.queue), ctl.queue.waiting()) == (1, 1)
    assert await ctl.queue.get() == "h"


async def test_a_new_terms_resync_runs_every_grant_now_with_its_backoff_started_over() -> None:
    """Failures while the API server was away grew a grant's backoff; the resync of a new
    term (or of caches current again) runs it at once, and its next failure waits the first
    step of the backoff, not the outage's tenth."""
    api = FakeApi()
    world(api)
    ctl = await controller(api)
    for _ in range(10):  # refused writes during an outage
        ctl.queue.add_rate_limited("g")
    ctl.resync()
    assert (len(ctl.queue), ctl.queue.waiting(), ctl.queue.num_requeues("g")) == (1, 0, 0)
    assert await ctl.queue.get() == "g"
    assert ctl.queue.add_rate_limited("g") == ctl.queue.backoff(0)


async def test_the_resync_queues_every_grant_every_period_until_stopped() -> None:
    api = FakeApi()
    world(api)
    ctl = await controller(api, config=Config(resync_period=0.01))
    resync = asyncio.create_task(ctl._resync_periodically())
    for _ in range(2):  # two periods: each queues the grant again once it is idle
        key = await asyncio.wait_for(ctl.queue.get(), 5)
        assert key == "g"
        ctl.queue.done(key)
    ctl.stop()
    await asyncio.wait_for(resync, 5)
