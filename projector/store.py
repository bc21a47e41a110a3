"""The controller's view of the cluster: six caches, the indexes over them, and snapshots.

Informers fill the caches (`Cache.put` / `Cache.pop`); on every change the store updates its
indexes and tells its listener which grant names the change affects. That is level-based, like
controller-runtime: a change only says *which* grants to look at again, and `snapshot(name)`
then reads everything one reconcile needs into an immutable `reconcile.Snapshot`, from memory
only (a source the cache lacks is read by `probe`, at the edge). No other module keeps an index.

A store works the same without informers: `load()` fills it from one-shot lists, and its
snapshots are those the running controller would take (what `projector explain` plans from).

Sources and copies are cached per kind (Secrets and ConfigMaps, each list and watch filtered
by label), and every key carries its kind (`ObjectKey.kind`): a Secret and a ConfigMap of one
name in one namespace are two sources, two copies, two places, never one.

Indexes keep each lookup proportional to the grants or copies concerned, never to all of them:
grants by source, by listed namespace, with a selector, by uid and by target place (kind and
name: rivals for one copy); copies by place, by grant label and by grant uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Hashable, ItemsView, Iterator
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import structlog

from projector.api import CONFIGMAPS, GRANTS, NAMESPACES, SECRETS, Api, Obj, Resource
from projector.errors import InvalidGrant, ProjectorError
from projector.model import (
    EXPORT_LABEL,
    EXPORT_VALUE,
    GRANT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    Copy,
    Grant,
    GrantRecord,
    Namespace,
    ObjectKey,
    Source,
    SourceKind,
    parse_copy,
    parse_grant_record,
    parse_namespace,
    parse_source,
)
from projector.reconcile import Snapshot, SourceState

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

log = structlog.get_logger("projector.store")


class Kind(StrEnum):
    """The caches projector keeps; a change is reported under its role (the first four)."""

    GRANT = "grants"
    SOURCE = "sources"
    NAMESPACE = "namespaces"
    COPY = "copies"
    CONFIG_SOURCE = "configmap-sources"
    """Contract ConfigMaps; their changes are reported as SOURCE."""
    CONFIG_COPY = "configmap-copies"
    """Projected ConfigMaps; their changes are reported as COPY."""


Place = tuple[SourceKind, str]
"""Where a grant's copies go, but for the namespace: the copy's kind and name."""


Listener = Callable[[Kind, set[str]], None]
"""Told, after each change, which grant names it affects (possibly none)."""

Echo = Callable[[str, Copy], bool]
"""Tells whether a copy event is a grant's own write coming back (`Store.listen`)."""


def _namespaced_key(obj: Obj) -> ObjectKey:
    meta = obj["metadata"]
    return ObjectKey(meta["namespace"], meta["name"])


def _config_map_key(obj: Obj) -> ObjectKey:
    meta = obj["metadata"]
    return ObjectKey(meta["namespace"], meta["name"], SourceKind.CONFIG_MAP)


def _name_key(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class Spec(Generic[K, T]):
    """How one kind is listed, watched, keyed and parsed into its cached value."""

    kind: StrEnum
    resource: Resource
    parse: Callable[[Obj], T]
    key: Callable[[Obj], K]
    label_selector: str | None = None
    page: int = 500
    """Objects per list request: a list is parsed one page at a time, so this bounds memory."""

    def key_of(self, obj: Obj) -> K | None:
        """The cache key of a raw object; None (logged, with why) if its metadata lacks it."""
        try:
            return self.key(obj)
        except (KeyError, TypeError, ValueError) as e:
            self._skipped(obj, e)
            return None

    def value_of(self, obj: Obj) -> T | None:
        """The cached value of a raw object; None (logged, with why) if it cannot be parsed."""
        try:
            return self.parse(obj)
        except (KeyError, TypeError, ValueError, ProjectorError) as e:
            self._skipped(obj, e)
            return None

    def entry(self, obj: Obj) -> tuple[K, T] | None:
        """The cache key and value of a raw object; None (logged) if it cannot be parsed.

        One malformed object never stops a list, a watch or a one-shot load.
        """
        if (k := self.key_of(obj)) is None or (value := self.value_of(obj)) is None:
            return None
        return k, value

    def _skipped(self, obj: Obj, error: Exception) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        log.warning(
            "skipping unparseable object",
            kind=self.kind.value,
            object=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            **why(error),
        )

    def entries(self, page: list[Obj]) -> Iterator[tuple[K, T]]:
        """The entries of a list page, emptying the page as it goes.

        Each raw object (a whole 1 MiB Secret) is freed as soon as it is parsed, not when the
        page is done.
        """
        for k, value in self.keyed(page):
            if value is not None:
                yield k, value

    def keyed(self, page: list[Obj]) -> Iterator[tuple[K, T | None]]:
        """Like `entries`, but an object with a key and an unparseable value comes as None.

        It exists on the server, so what the cache knew of it is kept.
        """
        page.reverse()
        while page:
            obj = page.pop()
            if (k := self.key_of(obj)) is not None:
                yield k, self.value_of(obj)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def why(error: Exception) -> dict[str, str]:
    """What a parse failure says, for a log line: the field and the message, never a value.

    A KeyError names the missing field; a refused grant says why in its own words (written
    without values); any other message has its quoted parts (where Python puts values, as in
    `invalid literal for int(): 'x'`) replaced, and is cut to 200 characters.
    """
    if isinstance(error, KeyError) and error.args:
        return {"error": "KeyError", "field": str(error.args[0]), "message": "missing"}
    if isinstance(error, InvalidGrant):
        return {"error": "InvalidGrant", "message": error.why[:200]}
    return {"error": type(error).__name__, "message": _QUOTED.sub("'…'", str(error))[:200]}


SECRET_PAGE = 20
"""Secrets per list page. A Secret may hold 1 MiB of data, 1.4 MiB as JSON: a page of 20 is
at most ~28 MiB on the wire and as much again parsed, within the 200 MiB the Deployment is
given, whatever the sizes; a page of 500 (the default) was 190 MiB for 150 copies of 1 MiB."""

GRANT_SPEC: Spec[str, GrantRecord] = Spec(Kind.GRANT, GRANTS, parse_grant_record, _name_key)
SOURCE_SPEC: Spec[ObjectKey, Source] = Spec(
    Kind.SOURCE,
    SECRETS,
    parse_source,
    _namespaced_key,
    f"{EXPORT_LABEL}={EXPORT_VALUE}",
    SECRET_PAGE,
)
"""Only contract Secrets: the other Secrets of the cluster are never transferred or cached."""
NAMESPACE_SPEC: Spec[str, Namespace] = Spec(Kind.NAMESPACE, NAMESPACES, parse_namespace, _name_key)
COPY_SPEC: Spec[ObjectKey, Copy] = Spec(
    Kind.COPY,
    SECRETS,
    parse_copy,
    _namespaced_key,
    f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
    SECRET_PAGE,
)
"""Copies are read whole (their data is hashed) but cached as metadata and that hash."""
CONFIG_SOURCE_SPEC: Spec[ObjectKey, Source] = Spec(
    Kind.CONFIG_SOURCE,
    CONFIGMAPS,
    functools.partial(parse_source, kind=SourceKind.CONFIG_MAP),
    _config_map_key,
    f"{EXPORT_LABEL}={EXPORT_VALUE}",
    SECRET_PAGE,
)
"""Only contract ConfigMaps, as for Secrets: the cluster's other ConfigMaps cost nothing."""
CONFIG_COPY_SPEC: Spec[ObjectKey, Copy] = Spec(
    Kind.CONFIG_COPY,
    CONFIGMAPS,
    functools.partial(parse_copy, kind=SourceKind.CONFIG_MAP),
    _config_map_key,
    f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}",
    SECRET_PAGE,
)
"""Projected ConfigMaps: like Secret copies, cached as metadata and the hash of their data."""


class Cache(Generic[K, T]):
    """One kind's parsed objects by key; every change passes through here to the indexes.

    `synced` and `healthy` are set by whoever fills the cache (an informer, or `Store.load`):
    synced once it has been filled, healthy while it is known to follow the server.
    """

    def __init__(self, spec: Spec[K, T], on_change: Callable[[T | None, T | None], None]) -> None:
        self.spec = spec
        self._items: dict[K, T] = {}
        self._on_change = on_change
        self.synced = asyncio.Event()
        self.healthy = asyncio.Event()

    def get(self, key: K) -> T | None:
        """The cached object under `key`, if any."""
        return self._items.get(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def items(self) -> ItemsView[K, T]:
        """A live view of the entries (read it, do not keep it across awaits)."""
        return self._items.items()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: K, value: T) -> T | None:
        """Store `value`; the indexes hear of it unless it equals what was there."""
        old = self._items.get(key)
        self._items[key] = value
        if old != value:
            self._on_change(old, value)
        return old

    def pop(self, key: K) -> T | None:
        """Forget `key`; the indexes hear of it if something was there."""
        old = self._items.pop(key, None)
        if old is not None:
            self._on_change(old, None)
        return old


class Store:
    """The caches of grants, contract Secrets and ConfigMaps, namespaces and copies, indexed."""

    def __init__(self, api: Api) -> None:
        self.api = api
        """What `load` lists from (and `probe.snapshot` reads an uncached source from)."""
        self._echo: Echo = _never
        self._listener: Listener | None = None
        self._copy_watchers: list[Callable[[Copy | None, Copy | None], None]] = []
        self.grants = Cache(GRANT_SPEC, self._grant_changed)
        self.sources = Cache(SOURCE_SPEC, self._source_changed)
        self.namespaces = Cache(NAMESPACE_SPEC, self._namespace_changed)
        self.copies = Cache(COPY_SPEC, self._copy_changed)
        self.config_sources = Cache(CONFIG_SOURCE_SPEC, self._source_changed)
        self.config_copies = Cache(CONFIG_COPY_SPEC, self._copy_changed)
        self.caches: tuple[Cache[Any, Any], ...] = (
            self.grants,
            self.sources,
            self.namespaces,
            self.copies,
            self.config_sources,
            self.config_copies,
        )
        self._valid: dict[str, Grant] = {}
        self._uids: dict[str, str] = {}
        self._live_uids: frozenset[str] | None = frozenset()
        self._by_source: defaultdict[ObjectKey, set[str]] = defaultdict(set)
        self._by_namespace: defaultdict[str, set[str]] = defaultdict(set)
        self._by_target: defaultdict[Place, set[str]] = defaultdict(set)
        self._with_selector: set[str] = set()
        self._copies_by_place: defaultdict[Place, set[ObjectKey]] = defaultdict(set)
        self._copies_by_label: defaultdict[str, set[ObjectKey]] = defaultdict(set)
        self._copies_by_uid: defaultdict[str, set[ObjectKey]] = defaultdict(set)

    def listen(self, listener: Listener, echo: Echo | None = None) -> None:
        """Tell `listener` which grant names each later change affects.

        `echo(name, copy)` says a copy event is the echo of grant `name`'s own write (the copy
        holds what it last planned): no news, so it does not wake the grant again and cannot
        defeat the debounce of a burst.
        """
        self._listener = listener
        self._echo = echo or _never

    def watch_copies(self, watcher: Callable[[Copy | None, Copy | None], None]) -> None:
        """Also tell `watcher` of every change of a copy (old, new), e.g. to roll its readers."""
        self._copy_watchers.append(watcher)

    def grant_names(self) -> list[str]:
        """Every cached grant name, valid or not."""
        return list(self.grants)

    def synced(self) -> bool:
        """Every cache has been filled at least once."""
        return all(c.synced.is_set() for c in self.caches)

    def healthy(self) -> bool:
        """Every cache is known to follow the server right now: deletes are allowed."""
        return all(c.healthy.is_set() for c in self.caches)

    async def load(self) -> None:
        """Fill every cache from one list of each kind (no watch): a store for one question."""
        for cache in self.caches:
            spec = cache.spec
            pages = self.api.pages(
                spec.resource, label_selector=spec.label_selector, limit=spec.page
            )
            async with contextlib.aclosing(pages):
                async for page, _ in pages:
                    for entry in spec.entries(page):
                        cache.put(*entry)
            cache.synced.set()
            cache.healthy.set()

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot(self, name: str, uncached: SourceState = SourceState.UNKNOWN) -> Snapshot:
        """Everything one reconcile of grant `name` reads, as immutable values, from memory.

        `uncached` is the state of a source the cache lacks, as a read of it told
        (`probe.snapshot` makes that read); a cached source is AVAILABLE.
        """
        record = self.grants.get(name)
        grant = record.grant if record is not None else None
        source = self.source(grant.source) if grant is not None else None
        if grant is None:
            state = SourceState.UNKNOWN
        else:
            state = SourceState.AVAILABLE if source is not None else uncached
        keys = set(self._copies_by_label.get(name, ()))
        namespaces: dict[str, Namespace] = {}
        rivals: tuple[Grant, ...] = ()
        if grant is not None:
            keys |= self._copies_by_uid.get(grant.uid, set())
            keys |= self._copies_by_place.get(_place(grant), set())
            namespaces = self._targeted(grant)
            rivals = tuple(
                self._valid[n] for n in self._by_target.get(_place(grant), ()) if n != name
            )
        copies = {k: c for k in keys if (c := self.copy(k)) is not None}
        rival_sources = {r.source: s for r in rivals if (s := self.source(r.source)) is not None}
        return Snapshot(
            grant_name=name,
            grant=grant,
            source=source,
            source_state=state,
            namespaces=MappingProxyType(namespaces),
            copies=MappingProxyType(copies),
            live_grant_uids=self._live(),
            rivals=rivals,
            rival_sources=MappingProxyType(rival_sources),
            record=record,
        )

    def source(self, key: ObjectKey) -> Source | None:
        """The cached contract Secret or ConfigMap under `key` (its kind says which cache)."""
        cache = self.sources if key.kind is SourceKind.SECRET else self.config_sources
        return cache.get(key)

    def copy(self, key: ObjectKey) -> Copy | None:
        """The cached copy under `key` (its kind says which cache)."""
        cache = self.copies if key.kind is SourceKind.SECRET else self.config_copies
        return cache.get(key)

    def _targeted(self, grant: Grant) -> dict[str, Namespace]:
        """The existing namespaces a grant aims at: its list, and its selector's matches."""
        out = {n: ns for n in grant.namespaces if (ns := self.namespaces.get(n)) is not None}
        selector = grant.selector
        if selector is not None:
            out.update((n, ns) for n, ns in self.namespaces.items() if selector.matches(ns.labels))
        return out

    def _live(self) -> frozenset[str]:
        """Uids of every grant that exists (valid or not); rebuilt only when that set changes."""
        if self._live_uids is None:
            self._live_uids = frozenset(self._uids)
        return self._live_uids

    # --- indexes: each change says which grant names to look at again ---------------------------

    def _notify(self, kind: Kind, names: set[str]) -> None:
        if self._listener is not None and names:
            self._listener(kind, names)

    def _unindex(self, name: str) -> None:
        g = self._valid.pop(name, None)
        if g is None:
            return
        self._by_source[g.source].discard(name)
        self._by_target[_place(g)].discard(name)
        for ns in g.namespaces:
            self._by_namespace[ns].discard(name)
        self._with_selector.discard(name)

    def _grant_changed(self, old: GrantRecord | None, new: GrantRecord | None) -> None:
        """Re-index a grant; affected: itself and the grants it competes with for copies."""
        names: set[str] = set()
        for rec in (old, new):
            if rec is None:
                continue
            names.add(rec.name)
            if rec.grant is not None:
                names |= self._by_target.get(_place(rec.grant), set())
        if old is not None:
            self._uids.pop(old.uid, None)
            self._unindex(old.name)
        if new is not None:
            self._uids[new.uid] = new.name
            g = new.grant
            if g is not None:
                self._valid[new.name] = g
                self._by_source[g.source].add(new.name)
                self._by_target[_place(g)].add(new.name)
                for ns in g.namespaces:
                    self._by_namespace[ns].add(new.name)
                if g.selector is not None:
                    self._with_selector.add(new.name)
        if old is None or new is None or old.uid != new.uid:
            self._live_uids = None
        self._notify(Kind.GRANT, names)

    def _source_changed(self, old: Source | None, new: Source | None) -> None:
        """Affected: the grants that project this source."""
        src = new or old
        if src is not None:
            self._notify(Kind.SOURCE, set(self._by_source.get(src.key, ())))

    def _namespace_changed(self, old: Namespace | None, new: Namespace | None) -> None:
        """Affected: grants that list the namespace, or whose selector matched it (before/after)."""
        ns = new or old
        if ns is None:
            return
        names = set(self._by_namespace.get(ns.name, ()))
        for name in self._with_selector:
            g = self._valid[name]
            if any(n is not None and g.targets(n.name, n.labels) for n in (old, new)):
                names.add(name)
        self._notify(Kind.NAMESPACE, names)

    def _copy_changed(self, old: Copy | None, new: Copy | None) -> None:
        """Affected: the grant a copy names in its label, and the grant that owns it by uid.

        Rivals for the same copy are woken only when a copy is deleted (its place is free);
        other copy events stay O(1) however many grants share a target name.
        """
        names: set[str] = set()
        for c, add in ((old, False), (new, True)):
            if c is None:
                continue
            label, uid = c.labels.get(GRANT_LABEL), c.grant_uid
            place: Place = (c.key.kind, c.key.name)
            _update(self._copies_by_place, place, c.key, add)
            for index, k in ((self._copies_by_label, label), (self._copies_by_uid, uid)):
                if k:
                    _update(index, k, c.key, add)
            if label:
                names.add(label)
            owner = self._uids.get(uid or "")
            if owner:
                names.add(owner)
        if old is not None and new is None:  # a freed place: a waiting rival may take it now
            names |= self._by_target.get((old.key.kind, old.key.name), set())
        elif new is not None:  # a copy that holds what its grant wants is no news to it
            names = {n for n in names if not self._echo(n, new)}
        self._notify(Kind.COPY, names)
        for watcher in self._copy_watchers:
            watcher(old, new)


def _never(_name: str, _copy: Copy) -> bool:
    return False


def _place(grant: Grant) -> Place:
    return (grant.kind, grant.target_name)


def _update(
    index: defaultdict[Any, set[ObjectKey]], k: Hashable, key: ObjectKey, add: bool
) -> None:
    if add:
        index[k].add(key)
        return
    keys = index.get(k)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[k]
