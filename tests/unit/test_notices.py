"""Notices: one Warning Event per refused input, recorded by the leader, bounded tables."""

from __future__ import annotations

import asyncio
import dataclasses

from projector.control.notices import CONSENT_LOST, EXPORT_TO_IGNORED, PENDING, Notices
from projector.control.recorder import Recorder
from projector.core.kinds import Obj
from projector.core.model import GRANT_UID_ANNOTATION as GRANT_UID
from projector.core.model import ObjectKey, Uid
from projector.core.plans import Outcome
from projector.core.reconcile import plan
from projector.core.status import Event
from projector.errors import Fenced
from tests.unit.factories import (
    SRC_NAME,
    SRC_NS,
    copy_from,
    desired_of,
    make_grant,
    make_snapshot,
    make_source,
    namespaces,
)

G = make_grant(namespaces=("a", "b", "c"))


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


async def test_a_namespace_that_loses_consent_where_a_copy_stood_is_told_once() -> None:
    """The data was readable there: the producer hears it once per copy, whatever onRevoke did
    (Delete or Retain), and never of a namespace that merely never had a copy, nor of a copy
    that is not the grant's own."""
    told = Told()
    notices = Notices(told)
    source = make_source(export_to="a")  # b is no longer allowed
    held = copy_from(desired_of(G, source), "b")
    theirs = dataclasses.replace(copy_from(desired_of(G, source), "c"), uid=Uid("u-their"))
    theirs = dataclasses.replace(theirs, annotations={**theirs.annotations, GRANT_UID: "other"})
    snap = make_snapshot(G, source, namespaces=namespaces("a", "b", "c"), copies=[held, theirs])
    for _ in range(3):  # every reconcile of a retained copy says Denied again
        p = plan(snap)
        notices.consent_lost(p, [Outcome(s, s.reason) for s in p.steps])
        await drain(notices)
    assert told.told == [(f"{SRC_NS}/{SRC_NAME}", "Secret", CONSENT_LOST)]
