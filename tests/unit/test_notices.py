"""Notices: one Warning Event per refused input, recorded by the leader, bounded tables."""

from __future__ import annotations

import asyncio
import dataclasses

from projector.control.notices import EXPORT_TO_IGNORED, PENDING, Notices
from projector.control.recorder import Recorder
from projector.core.kinds import Obj
from projector.core.model import ObjectKey, Uid
from projector.core.status import Event
from projector.errors import Fenced
from tests.unit.factories import make_source


class Told(Recorder):
    """A recorder that keeps what it was asked to record (and refuses while `fenced`)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, str]] = []
        self.fenced = False

    async def record_on(self, involved: Obj, namespace: str, ev: Event) -> None:
        if self.fenced:
            raise Fenced("no lease")
        self.told.append((f"{namespace}/{involved['name']}", involved["kind"], ev.reason))


BOMB = dataclasses.replace(make_source("t", "bomb"), export_to_refused="export-to has more")


async def drain(notices: Notices, leading: asyncio.Event | None = None) -> None:
    task = asyncio.create_task(notices.run(leading))
    for _ in range(20):  # let it run until nothing is pending (a few loop turns)
        await asyncio.sleep(0)
    task.cancel()


async def test_a_refused_export_to_is_told_once_per_object_and_reason() -> None:
    told = Told()
    notices = Notices(told)
    for _ in range(5):  # every event of the hostile object
        notices.source_changed(None, BOMB)
        await drain(notices)
    assert told.told == [("t/bomb", "Secret", EXPORT_TO_IGNORED)]
    notices.source_changed(BOMB, dataclasses.replace(BOMB, uid=Uid("re-created")))
    notices.source_changed(None, make_source("t", "fine"))  # nothing refused: nothing told
    await drain(notices)
    assert len(told.told) == 2


async def test_only_the_leader_tells_and_what_waits_is_bounded() -> None:
    told = Told()
    notices = Notices(told)
    leading = asyncio.Event()
    for i in range(PENDING + 50):
        key = ObjectKey("t", f"bomb-{i}")
        notices.source_changed(None, dataclasses.replace(BOMB, key=key, uid=Uid(f"u{i}")))
    await drain(notices, leading)
    assert told.told == []  # a standby records nothing
    told.fenced = True
    leading.set()
    await drain(notices, leading)
    assert told.told == []  # refused by the fence: kept for the next term
    told.fenced = False
    notices.source_changed(None, dataclasses.replace(BOMB, key=ObjectKey("t", "b2"), uid=Uid("x")))
    await drain(notices, leading)
    assert len(told.told) == PENDING  # the pending table never grew past its bound
