"""ProjectionExport statuses: a producer sees where its Secret goes, from the grants' reconciles.

An export's status is written after a reconcile of a grant of its source (the only moment its
numbers change): whether the source exists, which grants project it, and how many namespaces
hold a copy this export lets in (summed over those grants). Written only when it changes, so a
restart over an up-to-date cluster writes nothing, and never retried in a loop of its own: a
producer's status must not hold a grant's reconcile back (the next reconcile writes it again).
An export no grant uses has no status to report until one does.
"""

from __future__ import annotations

from collections.abc import Sequence

from projector.cache.store import Store
from projector.control.recorder import timestamp
from projector.control.writer import Writer
from projector.core.plans import Outcome, Plan, Reason
from projector.core.status import copies_by_export, export_status, stamped, unchanged

ExportKey = tuple[str, str]
"""(namespace, name) of a ProjectionExport."""


class ExportStatuses:
    """Each export's copies per grant of its source, and the status write when it changes."""

    def __init__(self, store: Store, writer: Writer) -> None:
        self._store = store
        self._writer = writer
        self._copies: dict[ExportKey, dict[str, int]] = {}

    async def after(self, plan: Plan, outcomes: Sequence[Outcome]) -> None:
        """After a grant's reconcile: the statuses of the exports of its source."""
        grant = plan.grant
        if grant is None:
            return
        snap = plan.snapshot
        exports = snap.exports_of(grant.source)
        if not exports:
            return
        projected = [o.namespace for o in outcomes if o.reason is Reason.PROJECTED]
        grants = self._store.grants_of(grant.source)
        let_in = copies_by_export(snap.source, exports, projected)
        for e in exports:
            per = self._copies.setdefault((e.namespace, e.name), {})
            per[grant.name] = let_in[str(e)]
            for gone in [g for g in per if g not in grants]:
                del per[gone]
            status = export_status(e, plan.source_state, grants, sum(per.values()))
            new = stamped(status, e.status, timestamp())
            if not unchanged(new, e.status):
                await self._writer.write_export_status(e.namespace, e.name, new)
        if len(self._copies) > 2 * len(self._store.exports) + 64:  # exports deleted meanwhile
            cached = self._store.exports
            self._copies = {k: v for k, v in self._copies.items() if cached.get(k) is not None}
