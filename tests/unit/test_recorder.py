"""Events are aggregated as client-go's recorder does (issue 36): the same Event again counts on
the one recorded (a merge patch of count and lastTimestamp), never a new object each time; the
table that remembers them is bounded (least recently recorded forgotten first)."""

from __future__ import annotations

import asyncio
from typing import Any

from projector.client.api import Request
from projector.control.recorder import EVENTS_NS, Recorder
from projector.control.writer import Writer
from projector.core.kinds import EVENTS, Obj
from projector.core.model import GrantRecord, Uid
from projector.core.status import Event
from projector.errors import NotFound, ServerError
from projector.telemetry.metrics import Metrics
from tests.unit.fakeapi import FakeApi

REC = GrantRecord("g", Uid("uid-g"), 1, None, "bad")
TAKEN = Event("Warning", "Conflict", "a: a Secret of that name exists")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorder(api: FakeApi, **kw: Any) -> tuple[Recorder, Clock]:
    clock = Clock()
    return Recorder(Writer(api, metrics=Metrics()), "test", clock=clock, **kw), clock


def stored(api: FakeApi) -> list[dict[str, Any]]:
    return [o for (plural, ns, _), o in api.objects.items() if plural == EVENTS.plural]


def verbs(api: FakeApi) -> list[str]:
    return [verb for verb, _, _ in api.calls]


async def test_the_same_event_again_counts_on_the_one_recorded() -> None:
    api = FakeApi()
    rec, clock = recorder(api)
    await rec.record(REC, [TAKEN])
    for _ in range(3):  # three more reconciles that tell the same
        clock.now += 30
        await rec.record(REC, [TAKEN])
    (ev,) = stored(api)
    assert ev["count"] == 4 and ev["reason"] == "Conflict"
    assert ev["metadata"]["namespace"] == EVENTS_NS
    assert verbs(api) == ["CREATE", "PATCH", "PATCH", "PATCH"]


async def test_another_object_reason_or_message_is_another_event() -> None:
    api = FakeApi()
    rec, _ = recorder(api)
    other = GrantRecord("h", Uid("uid-h"), 1, None, "bad")
    await rec.record(REC, [TAKEN, Event("Warning", "Conflict", "b: taken")])
    await rec.record(other, [TAKEN])
    await rec.record(REC, [Event("Normal", "Created", "created 1 copy")])
    assert [e["count"] for e in stored(api)] == [1, 1, 1, 1]
    assert verbs(api) == ["CREATE"] * 4


async def test_past_the_window_the_event_is_recorded_anew() -> None:
    api = FakeApi()
    rec, clock = recorder(api, window=600)
    await rec.record(REC, [TAKEN])
    clock.now += 601
    await rec.record(REC, [TAKEN])
    assert verbs(api) == ["CREATE", "CREATE"]
    assert [e["count"] for e in stored(api)] == [1, 1]


async def test_the_table_is_bounded_and_forgets_the_least_recently_recorded() -> None:
    api = FakeApi()
    rec, _ = recorder(api, size=2)
    first, second, third = (Event("Warning", "Conflict", f"{n}: taken") for n in "abc")
    await rec.record(REC, [first, second])
    await rec.record(REC, [first])  # first is now the most recently recorded
    await rec.record(REC, [third])  # forgets second
    assert len(rec._recorded) == 2
    await rec.record(REC, [first, second])
    assert verbs(api) == ["CREATE", "CREATE", "PATCH", "CREATE", "PATCH", "CREATE"]


async def test_an_event_the_server_expired_is_recorded_anew() -> None:
    api = FakeApi()
    rec, _ = recorder(api)
    await rec.record(REC, [TAKEN])
    api.fail("PATCH", NotFound(404, "NotFound"))  # the server's event TTL ran out
    await rec.record(REC, [TAKEN])
    await rec.record(REC, [TAKEN])
    assert verbs(api) == ["CREATE", "PATCH", "CREATE", "PATCH"]


async def test_an_event_not_created_is_not_counted_on() -> None:
    api = FakeApi()
    rec, _ = recorder(api)
    api.fail("CREATE", ServerError(500, "InternalError"))
    await rec.record(REC, [TAKEN])  # best effort: logged, not raised
    await rec.record(REC, [TAKEN])
    assert verbs(api) == ["CREATE", "CREATE"]
    assert [e["count"] for e in stored(api)] == [1]


class HeldCreates(FakeApi):
    """Holds every create until `go` is set: an Event still being created when told again."""

    def __init__(self) -> None:
        super().__init__()
        self.held, self.go = asyncio.Event(), asyncio.Event()

    async def send(self, req: Request) -> Obj:
        if req.verb == "CREATE":
            self.held.set()
            await self.go.wait()
        return await super().send(req)


async def test_the_same_event_told_while_it_is_created_counts_on_it() -> None:
    """Under load a create takes a while and other workers tell the same Event meanwhile: they
    wait for it and count on it, in order, never patching it before it exists (a 404 there
    was taken for an expired Event and recorded a twin)."""
    api = HeldCreates()
    rec, _ = recorder(api)
    first = asyncio.create_task(rec.record(REC, [TAKEN]))
    await api.held.wait()
    repeats = [asyncio.create_task(rec.record(REC, [TAKEN])) for _ in range(3)]
    api.go.set()
    await asyncio.gather(first, *repeats)
    (ev,) = stored(api)
    assert ev["count"] == 4
    assert verbs(api) == ["CREATE", "PATCH", "PATCH", "PATCH"]
