"""Tell a producer, once, what it must know: a Warning Event on its object.

A tenant's export-to past its cap (`model.export_to_too_big`) is ignored as a whole, whether or
not a grant names the object; the producer learns it from one Warning Event on the object
itself, not from a log line it cannot read. And when a namespace that held a copy of its
source loses consent (the producer withdrew, an export narrowed, a key left the scope, the
admin untargeted it), the producer is told that the data was readable there, whatever onRevoke
did with the copy: rotating it may be due (`consent_lost`). One Event per (object, what), however
many events or reconciles repeat it: the table of what was told and the queue of what is to
tell are bounded, so a tenant cannot grow them or turn them into a stream of writes.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import structlog

from projector.control.recorder import Recorder
from projector.core.kinds import BY_KIND
from projector.core.model import ObjectKey, Source
from projector.core.plans import Outcome, Plan, Reason
from projector.core.status import Event
from projector.errors import Fenced

log = structlog.get_logger("projector.notices")

EXPORT_TO_IGNORED = "ExportToIgnored"
CONSENT_LOST = "CopyConsentWithdrawn"
LOST = frozenset({Reason.DENIED, Reason.KEY_NOT_EXPORTED, Reason.REVOKED})
"""A grant's own copy stood where one of these says it may no longer: consent was lost there."""
TOLD = 4096
"""(uid, reason) pairs remembered as told; the oldest is forgotten first."""
PENDING = 1024
"""Objects waiting to be told; past it, new ones wait for their next change."""
FENCED_WAIT = 1.0
"""Seconds before trying again after the fence refused (the elector's retry period is 2 s)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """One Warning to record on a producer's object, and what makes it the same one."""

    involved: Mapping[str, str]
    event: Event
    told: tuple[str, str]
    """Told once per this key (an object uid or copy uid, and what about it)."""

    @property
    def namespace(self) -> str:
        """Where the Event is recorded: the producer's object's namespace."""
        return self.involved["namespace"]


def _object(key: ObjectKey, uid: str) -> dict[str, str]:
    resource = BY_KIND[key.kind]
    out = {
        "apiVersion": resource.version,
        "kind": resource.kind,
        "namespace": key.namespace,
        "name": key.name,
    }
    return out | ({"uid": uid} if uid else {})


class Notices:
    """Warning Events to producers, recorded by the leader only."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._pending: dict[Hashable, Notice] = {}
        self._wake = asyncio.Event()

    def source_changed(self, old: Source | None, new: Source | None) -> None:
        """The store's watcher of sources: queue what a bound refused and is not told yet."""
        either = new or old
        if either is None:
            return
        key = either.key
        if new is None or not new.export_to_refused or not new.labelled:
            self._pending.pop(key, None)  # unlabelled (an export's source): its export-to is moot
            return
        message = f"{new.export_to_refused}: this object is exported to nobody"
        event = Event("Warning", EXPORT_TO_IGNORED, message)
        self._queue(key, Notice(_object(key, new.uid), event, (new.uid, new.export_to_refused)))

    def consent_lost(self, plan: Plan, outcomes: Iterable[Outcome]) -> None:
        """After a reconcile: a namespace where the grant's own copy stood lost consent."""
        grant = plan.grant
        if grant is None:
            return
        source = plan.snapshot.source
        for o in outcomes:
            copy = o.step.existing
            if o.reason not in LOST or copy is None or copy.grant_uid != grant.uid:
                continue
            message = (
                f"namespace {o.namespace} held a copy of this {grant.kind.value} (grant "
                f"{grant.name}) and may no longer ({o.reason.value}); its data was readable "
                "there, so rotating it may be due"
            )
            involved = _object(grant.source, source.uid if source is not None else "")
            told = (str(copy.uid), CONSENT_LOST)
            self._queue(told, Notice(involved, Event("Warning", CONSENT_LOST, message), told))

    def _queue(self, key: Hashable, notice: Notice) -> None:
        if notice.told in self._told:
            return
        if key in self._pending or len(self._pending) < PENDING:
            self._pending[key] = notice
            self._wake.set()

    async def run(self, leading: asyncio.Event | None = None) -> None:
        """Record what is pending, while this replica leads (`leading`; None: always)."""
        while True:
            while self._pending:
                if leading is not None:
                    await leading.wait()
                key, notice = next(iter(self._pending.items()))
                try:
                    await self._tell(notice)
                except Fenced:  # the lease ran out: told once this replica leads again
                    await asyncio.sleep(FENCED_WAIT)
                    continue
                if self._pending.get(key) is notice:
                    del self._pending[key]
            self._wake.clear()
            await self._wake.wait()

    async def _tell(self, notice: Notice) -> None:
        await self._recorder.record_on(dict(notice.involved), notice.namespace, notice.event)
        self._told[notice.told] = None
        while len(self._told) > TOLD:
            self._told.popitem(last=False)
        log.info(
            "producer warned",
            object=f"{notice.namespace}/{notice.involved['name']}",
            reason=notice.event.reason,
        )
