"""The writer's error handling, against the in-memory API double (tests/unit/fakeapi.py).

What the real server does on the common paths is proven in tests/integration; here, each error
status the writer can meet, including those a test cannot make a real server produce on demand.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
import pytest

from projector.client.api import Request
from projector.client.retries import MAX_RETRY_AFTER, Retries, retry_delay
from projector.control.writer import Writer, _Budget
from projector.core.desired import Bodies
from projector.core.kinds import EVENTS, GRANTS, SECRETS, Obj
from projector.core.model import Copy, ObjectKey, SourceKind, parse_copy
from projector.core.plans import Action, Plan, Reason
from projector.core.reconcile import plan
from projector.errors import (
    ApiError,
    Conflict,
    Fenced,
    Forbidden,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
)
from projector.telemetry.metrics import Metrics
from tests.unit.factories import (
    SRC_NAME,
    SRC_NS,
    copy_from,
    desired_of,
    make_grant,
    make_snapshot,
    make_source,
    namespaces,
    stored_secret,
)
from tests.unit.fakeapi import FakeApi

G = make_grant(namespaces=("a",))
S = make_source()
TERMINATING = Forbidden(
    403, "Forbidden", "namespace a is being terminated", ("NamespaceTerminating",)
)


def plan_for(*copies: Copy) -> Plan:
    return plan(make_snapshot(G, S, namespaces=namespaces("a"), copies=copies))


class Reads(FakeApi):
    """The API double, noting the objects read whole (not as PartialObjectMetadata)."""

    def __init__(self) -> None:
        super().__init__()
        self.whole: list[str] = []

    async def send(self, req: Request) -> Obj:
        if req.verb == "GET" and "PartialObjectMetadata" not in req.accept:
            self.whole.append(f"{req.namespace}/{req.name}")
        return await super().send(req)


def writer(api: FakeApi) -> tuple[Writer, Metrics]:
    metrics = Metrics()
    return Writer(api, metrics=metrics, retries=Retries(4, (0.001, 0.001))), metrics


def store(api: FakeApi, copy: Copy) -> None:
    """Put the Secret that `copy` describes on the fake server, at the same resourceVersion."""
    api.objects[SECRETS.plural, copy.key.namespace, copy.key.name] = stored_secret(
        copy.key.namespace,
        copy.key.name,
        labels=dict(copy.labels),
        annotations=dict(copy.annotations),
        uid=copy.uid,
        resource_version=copy.resource_version,
    )


def writes(metrics: Metrics, action: str, result: str) -> float:
    return metrics.writes.labels(action, result)._value.get()


async def test_create_lands_and_is_counted() -> None:
    api = FakeApi()
    w, metrics = writer(api)
    (out,) = await w.execute(plan_for())
    assert (out.reason, out.written) == (Reason.PROJECTED, True)
    assert api.get_object(SECRETS, "a", SRC_NAME) is not None
    assert writes(metrics, "Create", "ok") == 1


@pytest.mark.parametrize(
    ("errors", "reason", "calls"),
    [
        pytest.param([TERMINATING], Reason.TERMINATING, 1, id="403-terminating-namespace-skipped"),
        pytest.param(
            [Forbidden(403, "Forbidden", "quota")], Reason.WRITE_FAILED, 1, id="403-not-retried"
        ),
        pytest.param(
            [NotFound(404, "NotFound")], Reason.NAMESPACE_MISSING, 1, id="404-namespace-missing"
        ),
        pytest.param([Invalid(422, "Invalid")], Reason.WRITE_FAILED, 1, id="422-not-retried"),
        pytest.param([ServerError(503, "Unavailable")] * 2, Reason.PROJECTED, 3, id="5xx-retried"),
        pytest.param(
            [ServerError(0, "ReadTimeout")] * 4, Reason.WRITE_FAILED, 4, id="timeouts-give-up"
        ),
        pytest.param([TooManyRequests(429, "TooMany")], Reason.PROJECTED, 2, id="429-retried"),
        pytest.param(
            [ApiError(418, "Teapot")], Reason.WRITE_FAILED, 1, id="unknown-4xx-not-retried"
        ),
    ],
)
async def test_create_errors(errors: list[ApiError], reason: Reason, calls: int) -> None:
    api = FakeApi()
    api.fail("CREATE", *errors)
    w, metrics = writer(api)
    (out,) = await w.execute(plan_for())
    assert out.reason is reason
    assert out.written is (reason is Reason.PROJECTED)
    assert [c[0] for c in api.calls] == ["CREATE"] * calls
    # Counted as ok only if written: a create the server refused is never an ok write.
    result = {Reason.PROJECTED: "ok", Reason.WRITE_FAILED: "error"}.get(reason, "skipped")
    assert writes(metrics, "Create", result) == 1
    assert writes(metrics, "Create", "ok") == (result == "ok")


async def test_retry_after_is_honoured() -> None:
    api = FakeApi()
    api.fail("CREATE", TooManyRequests(429, "TooMany", retry_after=0.2))
    w, _ = writer(api)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    (out,) = await w.execute(plan_for())
    assert out.reason is Reason.PROJECTED
    assert loop.time() - t0 >= 0.2


def test_retry_delays_grow_to_their_cap_and_a_429s_is_capped() -> None:
    gone = ServerError(503, "ServiceUnavailable")
    delays = [retry_delay(gone, n, 0.05, 0.3) for n in (1, 2, 3, 4, 5)]
    floors = (0.05, 0.1, 0.2, 0.3, 0.3)  # doubling, capped; plus up to `initial` of jitter
    assert all(f <= d <= f + 0.05 for d, f in zip(delays, floors, strict=True)), delays
    assert retry_delay(TooManyRequests(429, "TooMany", retry_after=2), 1, 0.05, 0.3) == 2
    hour = TooManyRequests(429, "TooMany", retry_after=3600)
    assert retry_delay(hour, 1, 0.05, 0.3) == MAX_RETRY_AFTER


async def test_stale_update_is_not_forced() -> None:
    api = FakeApi()
    old = copy_from(desired_of(G, make_source(data={"token": "b2xk"})), "a", resource_version="7")
    store(api, old)
    api.objects[SECRETS.plural, "a", SRC_NAME]["metadata"]["resourceVersion"] = "8"  # moved on
    w, metrics = writer(api)
    (out,) = await w.execute(plan_for(old))
    assert out.step.action is Action.UPDATE
    assert out.reason is Reason.WRITE_FAILED  # requeued, decided again on fresh state
    assert [c[0] for c in api.calls] == ["UPDATE"]
    assert writes(metrics, "Update", "error") == 1


async def test_update_of_a_vanished_copy_creates_it() -> None:
    api = FakeApi()
    old = copy_from(desired_of(G, make_source(data={"token": "b2xk"})), "a")
    w, _ = writer(api)
    (out,) = await w.execute(plan_for(old))
    assert (out.reason, out.written) == (Reason.PROJECTED, True)
    assert [c[0] for c in api.calls] == ["UPDATE", "CREATE"]


@pytest.mark.parametrize(
    ("annotations", "reason"),
    [
        pytest.param({}, Reason.CONFLICT, id="foreign-secret-not-overwritten"),
        pytest.param(
            {"projector.nebari.dev/grant-uid": "uid-other"}, Reason.CONFLICT, id="other-grant"
        ),
    ],
)
async def test_create_meeting_an_uncached_secret_asks_the_ownership_rule(
    annotations: dict[str, str], reason: Reason
) -> None:
    api = Reads()
    api.add(SECRETS, stored_secret("a", SRC_NAME, annotations=annotations))
    w, _ = writer(api)
    (out,) = await w.execute(plan_for())
    assert out.reason is reason and not out.written
    assert [c[0] for c in api.calls] == ["CREATE", "GET"]
    assert api.whole == []  # its metadata only: a foreign Secret's data is never read


async def test_create_meeting_our_uncached_copy_updates_it() -> None:
    api = FakeApi()
    ours = copy_from(desired_of(G, make_source(data={"token": "b2xk"})), "a")
    store(api, ours)
    api.objects[SECRETS.plural, "a", SRC_NAME]["metadata"]["managedFields"] = stored_secret(
        "a",
        SRC_NAME,
        annotations=dict(ours.annotations),
        managers={"projector": list(ours.annotations)},
    )["metadata"]["managedFields"]
    w, _ = writer(api)
    (out,) = await w.execute(plan_for())
    assert (out.reason, out.written) == (Reason.PROJECTED, True)
    # its metadata says it is ours; then it is read whole, to compare its content
    assert [c[0] for c in api.calls] == ["CREATE", "GET", "GET", "UPDATE"]


async def test_create_meeting_our_uncached_copy_already_in_sync_writes_nothing() -> None:
    """Our own create whose watch event is late: the next plan's create finds it, not rewrites."""
    api = FakeApi()
    w, metrics = writer(api)
    (first,) = await w.execute(plan_for())
    assert first.written
    stored = api.objects[SECRETS.plural, "a", SRC_NAME]["metadata"]
    stored["managedFields"] = stored_secret(  # as the API server records our create
        "a", SRC_NAME, managers={"projector": list(stored["annotations"])}
    )["metadata"]["managedFields"]
    api.calls.clear()
    (again,) = await w.execute(plan_for())  # the cache has not seen the copy yet
    assert (again.reason, again.written) == (Reason.PROJECTED, False)
    assert [c[0] for c in api.calls] == ["CREATE", "GET", "GET"]
    assert writes(metrics, "Create", "ok") == 1


@pytest.mark.parametrize(
    ("error", "reason", "written"),
    [
        pytest.param(None, Reason.REVOKED, True, id="deleted"),
        pytest.param(NotFound(404, "NotFound"), Reason.REVOKED, True, id="404-already-gone"),
        pytest.param(Conflict(409, "Conflict"), Reason.WRITE_FAILED, False, id="409-precondition"),
    ],
)
async def test_delete(error: ApiError | None, reason: Reason, written: bool) -> None:
    api = FakeApi()
    gone = make_grant(namespaces=())
    copy = copy_from(desired_of(G, S), "a")
    store(api, copy)
    if error is not None:
        api.fail("DELETE", error)
    w, _ = writer(api)
    p = plan(make_snapshot(None, None, copies=[copy], grant_name=gone.name))
    (out,) = await w.execute(p)
    assert out.step.action is Action.DELETE
    assert (out.reason, out.written) == (reason, written)


async def test_type_change_replaces_delete_then_create() -> None:
    api = FakeApi()
    tls = make_source(type_="kubernetes.io/tls")
    old = copy_from(desired_of(G, S), "a")
    store(api, old)
    w, _ = writer(api)
    p = plan(make_snapshot(G, tls, namespaces=namespaces("a"), copies=[old]))
    (out,) = await w.execute(p)
    assert out.step.action is Action.REPLACE and out.written
    assert [c[0] for c in api.calls] == ["DELETE", "CREATE"]
    stored: Any = api.get_object(SECRETS, "a", SRC_NAME)
    assert stored["type"] == "kubernetes.io/tls"


def status_writer(api: FakeApi, attempts: int = 3) -> tuple[Writer, Metrics]:
    metrics = Metrics()
    w = Writer(api, metrics=metrics, status_retries=Retries(attempts, (0.001, 0.002)))
    return w, metrics


def status_failures(metrics: Metrics, code: str) -> float:
    return metrics.status_write_failures.labels(code)._value.get()


async def test_a_failed_status_write_is_retried_counted_and_then_lands() -> None:
    api = FakeApi()
    api.add(GRANTS, {"metadata": {"name": "g"}})
    api.fail(
        "PATCH_STATUS",
        ServerError(503, "Unavailable"),
        TooManyRequests(429, "TooMany", retry_after=0),
    )
    w, metrics = status_writer(api)
    assert await w.write_status("g", {"observedGeneration": 1}) is True
    assert [c[0] for c in api.calls] == ["PATCH_STATUS"] * 3
    assert (status_failures(metrics, "503"), status_failures(metrics, "429")) == (1, 1)
    assert metrics.status_writes._value.get() == 1
    assert api.objects[GRANTS.plural, "", "g"]["status"] == {"observedGeneration": 1}


@pytest.mark.parametrize(
    ("errors", "calls"),
    [
        pytest.param([ServerError(500, "Boom")] * 3, 3, id="transient-until-out-of-attempts"),
        pytest.param([Forbidden(403, "Forbidden")], 1, id="403-not-retried"),
        pytest.param([Invalid(422, "Invalid")], 1, id="422-not-retried"),
    ],
)
async def test_a_status_that_could_not_be_written_is_never_reported_as_written(
    errors: list[ApiError], calls: int
) -> None:
    api = FakeApi()
    api.add(GRANTS, {"metadata": {"name": "g"}})
    api.fail("PATCH_STATUS", *errors)
    w, metrics = status_writer(api)
    assert await w.write_status("g", {"observedGeneration": 1}) is False
    assert len(api.calls) == calls
    assert sum(status_failures(metrics, str(e.status)) for e in set(errors)) == calls
    assert metrics.status_writes._value.get() == 0
    assert "status" not in api.objects[GRANTS.plural, "", "g"]


async def test_the_status_of_a_deleted_grant_needs_no_write() -> None:
    api = FakeApi()  # no grant "g": 404
    w, metrics = status_writer(api)
    assert await w.write_status("g", {"observedGeneration": 1}) is True
    assert [c[0] for c in api.calls] == ["PATCH_STATUS"]
    assert metrics.status_writes._value.get() == 0


@pytest.mark.parametrize(
    "error", [NotFound(404, "NotFound"), ServerError(500, "Boom"), Forbidden(403, "Forbidden")]
)
async def test_event_failures_never_raise(error: ApiError) -> None:
    api = FakeApi()
    api.fail("CREATE", error)
    w, _ = writer(api)
    await w.create_event({"metadata": {"name": "g.1"}}, "default")
    assert api.get_object(EVENTS, "default", "g.1") is None
    await w.create_event({"metadata": {"name": "g.1"}}, "default")
    assert api.get_object(EVENTS, "default", "g.1") is not None


async def test_a_closed_fence_refuses_every_write_before_it_is_sent() -> None:
    api = FakeApi()
    api.add(GRANTS, {"metadata": {"name": "g"}})

    def closed() -> float:
        raise Fenced("no valid lease")

    w = Writer(api, metrics=Metrics(), fence=closed)
    with pytest.raises(Fenced):
        await w.execute(plan_for())
    with pytest.raises(Fenced):
        await w.write_status("g", {"observedGeneration": 1})
    with pytest.raises(Fenced):
        await w.create_event({"metadata": {"name": "g.1"}}, "default")
    assert api.calls == []


class SlowApi(FakeApi):
    """Creates that take a moment, counting how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak = 0

    async def create(self, res: Any, body: Any, **kw: Any) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0.01)  # allowed-sleep: a create that takes time, so writes overlap
        self.in_flight -= 1
        return await super().create(res, body, **kw)


@pytest.mark.parametrize(
    ("size", "peak"),
    [
        pytest.param(6 * 1024 * 1024, 2, id="big-copies-two-at-a-time"),
        pytest.param(1024, 8, id="small-copies-all-at-once"),
    ],
)
async def test_copy_data_in_flight_is_bounded_in_bytes(size: int, peak: int) -> None:
    """Writes of big copies wait for bytes in flight to fall under WRITE_BYTES (16 MiB)."""
    targets = [f"n{i}" for i in range(8)]
    grant = make_grant(namespaces=tuple(targets))
    source = make_source(data={"blob": "A" * size})
    api = SlowApi()
    w, _ = writer(api)
    outcomes = await w.execute(plan(make_snapshot(grant, source, namespaces=namespaces(*targets))))
    assert {o.reason for o in outcomes} == {Reason.PROJECTED}
    assert api.peak == peak


class ThrottledApi(FakeApi):
    """Creates into namespace `throttled` are answered 429 (Retry-After: the cap); other creates
    land."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0
        self.refused_once = asyncio.Event()

    async def create(self, res: Any, body: Any, *, namespace: str | None = None, **kw: Any) -> Any:
        if namespace == "throttled":
            self.refused += 1
            self.refused_once.set()
            raise TooManyRequests(429, "TooManyRequests", retry_after=MAX_RETRY_AFTER)
        return await super().create(res, body, namespace=namespace, **kw)


async def test_a_write_sleeping_on_retry_after_holds_no_write_slot_nor_bytes() -> None:
    """One write slot and a byte budget too small for two copies: a throttled write that
    waits out its Retry-After must let another grant's whole fan-out through meanwhile."""
    api = ThrottledApi()
    w = Writer(api, metrics=Metrics(), concurrency=1, write_bytes=1024)  # one copy at a time
    blob = {"blob": "A" * 1000}
    throttled = make_grant(name="slow", namespaces=("throttled",))
    other_ns = [f"n{i}" for i in range(5)]
    other = make_grant(name="fast", namespaces=tuple(other_ns))
    source = make_source(data=blob)
    slow = asyncio.create_task(
        w.execute(plan(make_snapshot(throttled, source, namespaces=namespaces("throttled"))))
    )
    await api.refused_once.wait()
    fast = await w.execute(plan(make_snapshot(other, source, namespaces=namespaces(*other_ns))))
    assert {o.reason for o in fast} == {Reason.PROJECTED}
    assert api.refused == 1 and not slow.done()  # still asleep on its Retry-After
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow


class FencedMidFanOut(FakeApi):
    """The fence closes during a fan-out: one create is refused, the others are in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = asyncio.Event()

    async def create(self, res: Any, body: Any, *, namespace: str | None = None, **kw: Any) -> Any:
        if namespace == "n0":
            self.refused.set()
            raise Fenced("no valid lease")
        await asyncio.Event().wait()  # in flight until cancelled


async def test_a_fan_out_cancelled_as_its_fence_closes_ends_cancelled_not_fenced() -> None:
    """The lease is lost: a write raises Fenced and, at once, the term's workers are cancelled.
    asyncio.TaskGroup then raises the children's errors over the cancellation; were Fenced
    passed on, the worker would take it for a refused write and go on as a zombie of the old
    term (the outage test's next change then waited out a grown backoff: about 42 s)."""
    api = FencedMidFanOut()
    w = Writer(api, metrics=Metrics())
    ns = [f"n{i}" for i in range(3)]
    grant = make_grant(name="fan", namespaces=tuple(ns))
    task = asyncio.create_task(w.execute(plan(make_snapshot(grant, S, namespaces=namespaces(*ns)))))
    await api.refused.wait()
    task.cancel()  # the term ends while the TaskGroup is still cancelling the other writes
    with pytest.raises(asyncio.CancelledError):
        await task


async def _turn() -> None:
    await asyncio.sleep(0)  # allowed-sleep: one loop turn, so a task reaches its first await


async def test_the_byte_budget_lets_what_fits_through_and_wakes_waiters_in_order() -> None:
    budget = _Budget(100)
    assert await budget.acquire(60) == 60
    big = asyncio.create_task(budget.acquire(500))  # over the limit: waits to be alone
    small = asyncio.create_task(budget.acquire(30))
    await _turn()
    assert not big.done() and small.done()  # what fits goes at once, as with a condition
    budget.release(60)
    await _turn()
    assert not big.done()  # 30 still in flight
    budget.release(await small)
    assert await big == 100


async def test_a_cancelled_byte_budget_waiter_holds_nothing() -> None:
    budget = _Budget(100)
    await budget.acquire(100)
    waiting = asyncio.create_task(budget.acquire(50))
    await _turn()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    budget.release(100)
    granted = asyncio.create_task(budget.acquire(80))
    await _turn()
    assert await granted == 80
    # Granted, then cancelled before it ran: the bytes go back.
    late = asyncio.create_task(budget.acquire(50))
    await _turn()
    budget.release(80)  # grants `late` its 50...
    late.cancel()  # ...and it is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await late
    assert budget._used == 0


class FencedAlone(FakeApi):
    async def create(self, res: Any, body: Any, **kw: Any) -> Any:
        raise Fenced("no valid lease")


class Hanging(FakeApi):
    def __init__(self) -> None:
        super().__init__()
        self.sent = asyncio.Event()

    async def create(self, res: Any, body: Any, **kw: Any) -> Any:
        self.sent.set()
        await asyncio.Event().wait()  # in flight until cancelled


async def test_a_lone_write_raises_its_error_and_ends_cancelled_when_cancelled() -> None:
    """One copy is written in the reconcile's own task: its error and cancellation are it."""
    grant = make_grant(name="one", namespaces=("n0",))
    one = plan(make_snapshot(grant, S, namespaces=namespaces("n0")))
    with pytest.raises(Fenced):
        await Writer(FencedAlone(), metrics=Metrics()).execute(one)
    api = Hanging()
    task = asyncio.create_task(Writer(api, metrics=Metrics()).execute(one))
    await api.sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("kind", ["Secret", "ConfigMap"])
@pytest.mark.parametrize("grant_metadata", [False, True], ids=["plain-grant", "grant-metadata"])
@pytest.mark.parametrize(
    "edits",
    [
        {},
        {"labels": {"team": "x"}},
        {"annotations": {"note": "kept"}},
    ],
    ids=["ours-only", "foreign-label", "foreign-annotation"],
)
def test_a_copys_body_is_its_manifest_whatever_path_builds_it(
    kind: str, grant_metadata: bool, edits: dict[str, Any]
) -> None:
    """The body serialized once per plan is byte for byte what the manifest path would send,
    as JSON: for a create, and for a PUT of a stored copy with or without others' metadata."""
    grant = (
        make_grant(labels={"tier": "web"}, annotations={"a": "b"})
        if grant_metadata
        else make_grant()
    )
    source = make_source(data={"k": "dg=="})
    if kind == "ConfigMap":
        cm = SourceKind.CONFIG_MAP
        grant = dataclasses.replace(grant, source=ObjectKey(SRC_NS, SRC_NAME, cm))
        source = dataclasses.replace(
            source, key=ObjectKey(SRC_NS, SRC_NAME, cm), type="", binary_data={"b": "AA=="}
        )
    desired = desired_of(grant, source)
    bodies = Bodies(desired)
    assert orjson.loads(bodies.body("n1")) == desired.manifest("n1")
    manifest = desired.manifest("n1")
    meta: dict[str, Any] = dict(manifest["metadata"])  # type: ignore[call-overload]
    meta["labels"] = {**meta["labels"], **edits.get("labels", {})}
    meta["annotations"] = {**meta["annotations"], **edits.get("annotations", {})}
    meta |= {"uid": "uid-copy", "resourceVersion": "7"}
    stored = parse_copy({**manifest, "metadata": meta}, desired.kind)
    got = orjson.loads(bodies.body("n1", "42", keep=stored))
    assert got == desired.manifest("n1", "42", keep=stored)
    kept = {**edits.get("labels", {}), **edits.get("annotations", {})}
    assert all(k in got["metadata"]["labels"] or k in got["metadata"]["annotations"] for k in kept)
