"""Events: the manifest of a reason-coded `status.Event`, recorded by the writer.

Events about a cluster-scoped object must live in `default` (API server validation), so that
is where they go, whatever the controller's own namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from projector.api import GRANTS, Obj
from projector.model import GrantRecord
from projector.status import Event
from projector.writer import Writer

EVENTS_NS = "default"
MAX_MESSAGE = 1024


def timestamp() -> str:
    """Now, as Kubernetes writes times (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event(involved: Obj, namespace: str, ev: Event, *, instance: str, now: str) -> Obj:
    """A core/v1 Event about the object `involved` (an involvedObject), in `namespace`.

    The name is unique: Events are never updated.
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


class Recorder:
    """Records Events through the writer, as replica `instance`: the one place they are sent."""

    def __init__(self, writer: Writer, instance: str) -> None:
        self._writer = writer
        self._instance = instance

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
        """Record one Event about the object `involved`, in its `namespace` (best effort too)."""
        body = event(involved, namespace, ev, instance=self._instance, now=timestamp())
        await self._writer.create_event(body, namespace)
