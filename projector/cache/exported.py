"""Sources a ProjectionExport names: one narrow watch each, so their changes arrive as events.

A source exported by a ProjectionExport carries no label, so the label-filtered sources
informer never sees it, and caching every Secret to find it would cost what the label exists
to avoid. Instead each such source that some grant also names (`Store.exported_wanted`: a
tenant's exports that no grant uses cost only their own small object) gets an informer of its
own over exactly one object: its namespace, `fieldSelector=metadata.name=<name>`, its whole
content (it is projected). Its events reach the store as a labelled source's do, so the copies
follow with the same latency and debouncing; its cache answers `get` once listed, and says
nothing (`known` is False) before: a source not yet listed is uncertainty, never absence.

The number of watches is bounded by the admins' grants (one per distinct source both a grant
and an export name), never by what a tenant writes. Watches run for the life of the process,
like every informer, and close when no grant or export names their source any more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import structlog

from projector.cache.caches import Cache, namespaced
from projector.cache.informer import Informer
from projector.client.api import Api
from projector.client.narrow import OneName
from projector.core.model import ObjectKey, Source, parse_source

log = structlog.get_logger("projector.store")


class Watched(StrEnum):
    """What an export's source watch follows, as informers' logs name it."""

    SOURCE = "exported-source"


@dataclass(eq=False)
class _Watch:
    cache: Cache[ObjectKey, Source]
    task: asyncio.Task[None] | None = None


class ExportedSources:
    """The narrow watches of exported sources; the store reads their caches (`get`, `known`)."""

    def __init__(
        self,
        api: Api,
        on_change: Callable[[Source | None, Source | None], None],
        *,
        timeout_seconds: int = 300,
        read_deadline: float = 90.0,
    ) -> None:
        self._api = api
        self._on_change = on_change
        self._timeout_seconds = timeout_seconds
        self._read_deadline = read_deadline
        self._wanted: frozenset[ObjectKey] = frozenset()
        self._watches: dict[ObjectKey, _Watch] = {}
        self._changed = asyncio.Event()

    def want(self, keys: frozenset[ObjectKey]) -> None:
        """Watch exactly these sources from now on (opened and closed by `run`)."""
        if keys != self._wanted:
            self._wanted = keys
            self._changed.set()

    def watches(self, key: ObjectKey) -> bool:
        """Tell whether `key` is (to be) watched here: the store then asks nobody else of it."""
        return key in self._wanted

    def known(self, key: ObjectKey) -> bool:
        """Tell whether `key`'s watch has listed and follows the server: `get` is the truth."""
        watch = self._watches.get(key)
        return watch is not None and watch.cache.synced.is_set() and watch.cache.healthy.is_set()

    def get(self, key: ObjectKey) -> Source | None:
        """The watched source, if its watch holds it."""
        watch = self._watches.get(key)
        return watch.cache.get(key) if watch is not None else None

    async def run(self) -> None:
        """Open and close watches as `want` says, until cancelled (then every watch closes)."""
        try:
            while True:
                self._changed.clear()
                await self._arrange()
                await self._changed.wait()
        finally:
            tasks = [w.task for w in self._watches.values() if w.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._watches.clear()

    async def _arrange(self) -> None:
        for key in [k for k in self._watches if k not in self._wanted]:
            watch = self._watches.pop(key)
            if watch.task is not None:
                watch.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch.task
            log.info("exported source unwatched", source=str(key))
        for key in self._wanted:
            if key not in self._watches:
                self._open(key)

    def _open(self, key: ObjectKey) -> None:
        spec = namespaced(Watched.SOURCE, key.kind, parse_source, None)  # one object: one page
        watch = _Watch(Cache(spec, self._on_change))
        informer: Informer[ObjectKey, Source] = Informer(
            OneName(self._api, key.name, namespace=key.namespace),
            watch.cache,
            timeout_seconds=self._timeout_seconds,
            read_deadline=self._read_deadline,
        )
        watch.task = asyncio.create_task(self._follow(key, informer), name=f"exported-{key}")
        self._watches[key] = watch
        log.info("exported source watched", source=str(key))

    async def _follow(self, key: ObjectKey, informer: Informer[ObjectKey, Source]) -> None:
        """Run one source's informer; a bug ends this watch alone (its grants stay uncertain)."""
        try:
            await informer.run()
        except Exception:
            informer.cache.healthy.clear()  # `known` no more: uncertainty, never absence
            log.exception("exported source watch failed", source=str(key))
