"""Tell a producer, once, that a bound refused what it wrote: a Warning Event on its object.

A tenant's export-to past its cap (`model.export_to_too_big`) is ignored as a whole, whether or
not a grant names the object; the producer learns it from one Warning Event on the object
itself, not from a log line it cannot read. One per (object uid, reason), whatever the number
of events of that object: the table of what was told and the queue of what is to tell are
bounded, so a tenant cannot grow them or turn them into a stream of writes.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import structlog

from projector.control.recorder import Recorder
from projector.core.kinds import BY_KIND
from projector.core.model import ObjectKey, Source
from projector.core.status import Event
from projector.errors import Fenced

log = structlog.get_logger("projector.notices")

EXPORT_TO_IGNORED = "ExportToIgnored"
TOLD = 4096
"""(uid, reason) pairs remembered as told; the oldest is forgotten first."""
PENDING = 1024
"""Objects waiting to be told; past it, new ones wait for their next change."""
FENCED_WAIT = 1.0
"""Seconds before trying again after the fence refused (the elector's retry period is 2 s)."""


class Notices:
    """Warning Events about refused producer input, recorded by the leader only."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._pending: dict[ObjectKey, Source] = {}
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
        if (new.uid, new.export_to_refused) in self._told:
            return
        if key in self._pending or len(self._pending) < PENDING:
            self._pending[key] = new
            self._wake.set()

    async def run(self, leading: asyncio.Event | None = None) -> None:
        """Record what is pending, while this replica leads (`leading`; None: always)."""
        while True:
            while self._pending:
                if leading is not None:
                    await leading.wait()
                key, source = next(iter(self._pending.items()))
                try:
                    await self._tell(source)
                except Fenced:  # the lease ran out: told once this replica leads again
                    await asyncio.sleep(FENCED_WAIT)
                    continue
                if self._pending.get(key) is source:
                    del self._pending[key]
            self._wake.clear()
            await self._wake.wait()

    async def _tell(self, source: Source) -> None:
        resource = BY_KIND[source.key.kind]
        involved = {
            "apiVersion": resource.version,
            "kind": resource.kind,
            "namespace": source.key.namespace,
            "name": source.key.name,
            "uid": source.uid,
        }
        message = f"{source.export_to_refused}: this object is exported to nobody"
        await self._recorder.record_on(
            involved, source.key.namespace, Event("Warning", EXPORT_TO_IGNORED, message)
        )
        self._told[(source.uid, source.export_to_refused)] = None
        while len(self._told) > TOLD:
            self._told.popitem(last=False)
        log.info("producer warned", object=str(source.key), reason=EXPORT_TO_IGNORED)
