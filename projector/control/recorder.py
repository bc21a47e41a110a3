"""Events: the manifest of a reason-coded `status.Event`, recorded by the writer.

Events about a cluster-scoped object must live in `default` (API server validation), so that
is where they go, whatever the controller's own namespace.

The same Event again (same object, type, reason and message) within `AGGREGATE_WINDOW` of its
last occurrence is counted on the object already recorded, as client-go's EventRecorder does:
a merge patch of its `count` and `lastTimestamp`, never a new object per reconcile. What was
recorded is remembered in a table of at most `MAX_AGGREGATED` entries, the least recently
recorded dropped first; an Event the server has expired meanwhile (404) is recorded anew.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from projector.control.writer import Writer
from projector.core.kinds import GRANTS, Obj
from projector.core.model import GrantRecord
from projector.core.status import Event

EVENTS_NS = "default"
MAX_MESSAGE = 1024
AGGREGATE_WINDOW = 600.0
"""Seconds after an Event's last occurrence within which the same Event is counted on it
(client-go aggregates similar Events over the same 10 minutes)."""
MAX_AGGREGATED = 1024
"""Events remembered for aggregation; the least recently recorded is forgotten first (a few
hundred kilobytes at most)."""


def timestamp() -> str:
    """Now, as Kubernetes writes times (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(involved: Obj, namespace: str, ev: Event, *, instance: str, now: str) -> Obj:
    """A core/v1 Event about the object `involved` (an involvedObject), in `namespace`.

    The name is unique; the same Event again is counted on this object (`Recorder`).
    """
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": involved,
        "type": ev.type,
        "reason": ev.reason,
        "message": ev.message[:MAX_MESSAGE],
        "source": {"component": "projector"},
        "reportingComponent": "projector.nebari.dev/projector",
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


@dataclass(slots=True)
class _Recorded:
    """An Event recorded: its name, count, last occurrence (monotonic) and whether it is stored.

    Its create and each count are sent under its lock, one at a time: a repeat never patches
    an Event still being created, nor sends its count out of order.
    """

    name: str
    count: int
    last: float
    stored: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _key(involved: Obj, namespace: str, ev: Event) -> bytes:
    """What makes two Events the same one, digested (a message is up to 1 KiB)."""
    parts = (
        namespace,
        str(involved.get("kind", "")),
        str(involved.get("namespace", "")),
        str(involved.get("name", "")),
        str(involved.get("uid", "")),
        ev.type,
        ev.reason,
        ev.message[:MAX_MESSAGE],
    )
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=16).digest()


class Recorder:
    """Records Events through the writer, as replica `instance`: the one place they are sent."""

    def __init__(
        self,
        writer: Writer,
        instance: str,
        *,
        window: float = AGGREGATE_WINDOW,
        size: int = MAX_AGGREGATED,
        clock: Callable[[], float] = time.monotonic,  # a fake one for tests
    ) -> None:
        self._writer = writer
        self._instance = instance
        self._window = window
        self._size = size
        self._clock = clock
        self._recorded: dict[bytes, _Recorded] = {}
        """Insertion-ordered, least recently recorded first: the aggregation table (LRU)."""

    async def record(self, rec: GrantRecord, events: Iterable[Event]) -> None:
        """Record each Event about grant `rec` (best effort: a refusal is logged, not raised)."""
        involved = {
            "apiVersion": GRANTS.version,
            "kind": GRANTS.kind,
            "name": rec.name,
            "uid": rec.uid,
        }
        for ev in events:
            await self.record_on(involved, EVENTS_NS, ev)

    async def record_on(self, involved: Obj, namespace: str, ev: Event) -> None:
        """Record one Event about the object `involved`, in its `namespace` (best effort too).

        Counted on the same Event if it was recorded within the window, else created.
        """
        key, now = _key(involved, namespace, ev), self._clock()
        seen = self._recorded.pop(key, None)
        if seen is not None and now - seen.last <= self._window:
            seen.count += 1
            seen.last = now
            self._recorded[key] = seen  # the most recently recorded, last
            async with seen.lock:
                if seen.stored:
                    patch = {"count": seen.count, "lastTimestamp": timestamp()}
                    if await self._writer.patch_event(seen.name, namespace, patch):
                        return
            if self._recorded.get(key) is seen:  # not created, or expired by the server:
                del self._recorded[key]  # recorded anew
        body = event(involved, namespace, ev, instance=self._instance, now=timestamp())
        entry = self._recorded[key] = _Recorded(str(body["metadata"]["name"]), 1, now)
        while len(self._recorded) > self._size:
            del self._recorded[next(iter(self._recorded))]
        async with entry.lock:  # a repeat meanwhile waits, then counts on it
            entry.stored = await self._writer.create_event(body, namespace)
