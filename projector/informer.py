"""Informers: list, then watch, into an in-memory cache; ours, because kr8s has none.

The reflector loop is client-go's: LIST (paginated), then WATCH from the list's
resourceVersion with bookmarks and a server timeout; a watch that ends normally resumes from
the last resourceVersion seen; a 410 Gone relists and turns what vanished into deletions; any
other failure backs off (0.8 s doubling to 30 s) and retries. A client read deadline turns a
silently stalled connection into an error, so a watch can never hang unnoticed.

`healthy` is cleared whenever the cache may be behind the server (before the first list, while
relisting, after a broken watch) and set again once a list or watch succeeds; the controller
makes no delete while any informer is unhealthy.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import structlog

from projector.errors import ApiError, Gone, ProjectorError
from projector.kube import Kube, Obj, Resource

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

Handler = Callable[[Any, Any], None]
"""Called with (old, new) parsed objects; old is None on add, new is None on delete."""

log = structlog.get_logger("projector.informer")


class Informer(Generic[K, T]):
    """A cache of one kind, kept current by list+watch, calling `on_change` for every change."""

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        parse: Callable[[Obj], T],
        key: Callable[[Obj], K],
        label_selector: str | None = None,
        on_change: Handler | None = None,
        timeout_seconds: int = 300,
        read_deadline: float = 90.0,
        on_event: Callable[[str, str], None] | None = None,
        backoff: tuple[float, float] = (0.8, 30.0),
    ) -> None:
        self.kube = kube
        self._backoff = backoff
        self.resource = resource
        self.label_selector = label_selector
        self._parse = parse
        self._key = key
        self._on_change = on_change
        self._on_event = on_event
        self._timeout_seconds = timeout_seconds
        self._read_deadline = read_deadline
        self._items: dict[K, T] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        """Set once the first list is in the cache; never cleared."""
        self.healthy = asyncio.Event()
        """Set while the cache is known to follow the server."""

    @property
    def name(self) -> str:
        """The kind this informer caches, for logs and metrics."""
        return self.resource.plural

    def get(self, key: K) -> T | None:
        """The cached object under `key`, if any."""
        return self._items.get(key)

    @property
    def items(self) -> Mapping[K, T]:
        """A read-only view of the cache (not a copy: read it, do not keep it across awaits)."""
        return self._items

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))

    def __len__(self) -> int:
        return len(self._items)

    def _emit(self, kind: str, old: T | None, new: T | None) -> None:
        if self._on_event is not None:
            self._on_event(self.name, kind)
        if self._on_change is not None and old != new:
            try:
                self._on_change(old, new)
            except Exception:  # a handler bug must not kill the informer; it is logged loudly
                log.exception("informer handler failed", kind=self.name)

    def _parse_safe(self, obj: Obj) -> tuple[K, T] | None:
        try:
            return self._key(obj), self._parse(obj)
        except (KeyError, TypeError, ValueError, ProjectorError) as e:
            meta = obj.get("metadata") or {}
            log.warning(
                "skipping unparseable object",
                kind=self.name,
                object=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                error=type(e).__name__,
            )
            return None

    async def _relist(self) -> None:
        """Replace the cache with a fresh list; what vanished is reported as deleted."""
        objs, rv = await self.kube.list(self.resource, label_selector=self.label_selector)
        fresh: dict[K, T] = {}
        for obj in objs:
            parsed = self._parse_safe(obj)
            if parsed is not None:
                fresh[parsed[0]] = parsed[1]
        old_items, self._items = self._items, fresh
        for k, new in fresh.items():
            old = old_items.get(k)
            if old != new:
                self._emit("ADDED" if old is None else "MODIFIED", old, new)
        for k, old in old_items.items():
            if k not in fresh:
                self._emit("DELETED", old, None)
        self.resource_version = rv
        if self._on_event is not None:
            self._on_event(self.name, "RELIST")

    def _apply(self, kind: str, obj: Obj) -> None:
        parsed = self._parse_safe(obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        if parsed is None:
            return
        k, new = parsed
        old = self._items.get(k)
        if kind == "DELETED":
            if old is not None:
                del self._items[k]
                self._emit(kind, old, None)
        else:
            self._items[k] = new
            self._emit(kind, old, new)

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        delay = 0.0
        need_list = True
        while True:
            try:
                if need_list:
                    self.healthy.clear()
                    await self._relist()
                    need_list = False
                    self.synced.set()
                    self.healthy.set()
                async for kind, obj in self.kube.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    label_selector=self.label_selector,
                    timeout_seconds=self._timeout_seconds
                    + random.randint(0, self._timeout_seconds // 2),
                    read_deadline=self._read_deadline,
                ):
                    self.healthy.set()
                    delay = 0.0
                    if kind == "OPEN":
                        continue
                    if kind == "BOOKMARK":
                        rv = (obj.get("metadata") or {}).get("resourceVersion")
                        if rv:
                            self.resource_version = str(rv)
                        continue
                    self._apply(kind, obj)
                # A normal end (server timeout): resume from the last resourceVersion.
                if self._on_event is not None:
                    self._on_event(self.name, "WATCH_RESTART")
            except Gone:
                log.info("watch expired; relisting", kind=self.name)
                need_list = True
            except ApiError as e:
                self.healthy.clear()
                delay = min(self._backoff[1], max(self._backoff[0], delay * 2))
                log.warning(
                    "watch failed; retrying",
                    kind=self.name,
                    status=e.status,
                    reason=e.reason,
                    retry_in=round(delay, 2),
                )
                if self._on_event is not None:
                    self._on_event(self.name, "ERROR")
                await asyncio.sleep(delay)
                if not self.resource_version:
                    need_list = True
