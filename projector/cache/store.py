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

import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Hashable
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import Any, TypeVar

import structlog

from projector.cache.caches import (
    CONFIG_COPY_SPEC,
    CONFIG_SOURCE_SPEC,
    COPY_SPEC,
    EXPORT_SPEC,
    GRANT_SPEC,
    NAMESPACE_SPEC,
    SOURCE_SPEC,
    Cache,
    Kind,
    Spec,
)
from projector.cache.exported import ExportedSources
from projector.client.api import Api
from projector.core.exports import Export
from projector.core.kinds import Obj
from projector.core.model import (
    GRANT_LABEL,
    Copy,
    Grant,
    GrantRecord,
    Namespace,
    ObjectKey,
    Source,
    SourceKind,
    parse_source,
)
from projector.core.plans import Snapshot, SourceState

__all__ = ["Echo", "Listener", "Store"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

log = structlog.get_logger("projector.store")


Listener = Callable[[Kind, set[str]], None]
"""Told, after each change, which grant names it affects (possibly none)."""

Echo = Callable[[str, Copy], bool]
"""Tells whether a copy event is a grant's own write coming back (`Store.listen`)."""

Place = tuple[SourceKind, str]
"""Where a grant's copies go, but for the namespace: the copy's kind and name."""


class Store:
    """The caches of grants, contract Secrets, namespaces and copies, and their indexes."""

    def __init__(
        self, api: Api, protected: AbstractSet[str] = frozenset(), *, configmaps: bool = True
    ) -> None:
        self.api = api
        """What `load` lists from (and `probe.snapshot` reads an uncached source from)."""
        self.protected = protected
        """Namespaces never written into (`Config.protected`), handed to every snapshot."""
        self.configmaps = configmaps
        """ConfigMap grants are served (`Config.configmaps`); if not, their source is refused."""
        self._echo: Echo = _never
        self._listener: Listener | None = None
        self._copy_watchers: list[Callable[[Copy | None, Copy | None], None]] = []
        self._source_watchers: list[Callable[[Source | None, Source | None], None]] = []
        self.grants = Cache(GRANT_SPEC, self._grant_changed)
        self.sources = Cache(self._named_only(SOURCE_SPEC), self.source_changed)
        self.namespaces = Cache(NAMESPACE_SPEC, self._namespace_changed)
        self.copies = Cache(COPY_SPEC, self._copy_changed)
        self.config_sources = Cache(self._named_only(CONFIG_SOURCE_SPEC), self.source_changed)
        self.config_copies = Cache(CONFIG_COPY_SPEC, self._copy_changed)
        self.exports = Cache(EXPORT_SPEC, self._export_changed)
        self.caches: tuple[Cache[Any, Any], ...] = (
            self.grants,
            self.sources,
            self.namespaces,
            self.copies,
            self.config_sources,
            self.config_copies,
            self.exports,
        )
        self.exported: ExportedSources | None = None
        """The narrow watches of the sources exports name (`track_exported`); None in a
        one-shot store (`load`), which reads such a source when asked (`probe`)."""
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
        self._exports_by_source: defaultdict[ObjectKey, set[tuple[str, str]]] = defaultdict(set)

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

    def watch_sources(self, watcher: Callable[[Source | None, Source | None], None]) -> None:
        """Also tell `watcher` of every change of a source (old, new), e.g. to warn its producer."""
        self._source_watchers.append(watcher)

    def track_exported(self, exported: ExportedSources) -> None:
        """Read exported sources from `exported`'s watches, and tell it which to watch."""
        self.exported = exported
        exported.want(self._exported_wanted())

    def grants_of(self, key: ObjectKey) -> frozenset[str]:
        """The names of the valid grants whose source is `key`."""
        return frozenset(self._by_source.get(key, ()))

    def exports_of(self, key: ObjectKey) -> tuple[Export, ...]:
        """The cached ProjectionExports that name source `key`, in name order."""
        names = sorted(self._exports_by_source.get(key, ()))
        return tuple(e for n in names if (e := self.exports.get(n)) is not None)

    def _exported_wanted(self) -> frozenset[ObjectKey]:
        """Sources both an export and a grant name: each gets a narrow watch."""
        return frozenset(
            k for k, names in self._exports_by_source.items() if self._by_source.get(k)
        )

    def _rewatch(self) -> None:
        if self.exported is not None:
            self.exported.want(self._exported_wanted())

    def grant_names(self) -> list[str]:
        """Every cached grant name, valid or not."""
        return list(self.grants)

    def owner(self, copy: Copy) -> str | None:
        """The live grant whose copy this is, by the grant cache, or None.

        Its uid is the copy's owner mark and its target is the copy's place. Never the copy's
        grant label, which anyone who writes the copy sets: a name from here is always one of
        the cached grants.
        """
        name = self._uids.get(copy.grant_uid or "")
        grant = self._valid.get(name) if name is not None else None
        if grant is None or _place(grant) != (copy.key.kind, copy.key.name):
            return None
        return name

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

    # --- sources: content only while a grant names them -------------------------------------------

    def _named_only(self, spec: Spec[ObjectKey, Source]) -> Spec[ObjectKey, Source]:
        """`spec`, parsing a source with its content only if some grant names it.

        Every export-labelled object is cached, so that a grant created later finds it at once;
        but a tenant's exported objects that no grant names cost their metadata, not their
        data (DESIGN §3: 120 of 700 KiB must not cost 84 MB).
        """
        key_of = spec.key  # the spec's own key function knows the kind

        def parse(obj: Obj) -> Source:
            key = key_of(obj)
            return parse_source(obj, key.kind, content=bool(self._by_source.get(key)))

        return dataclasses.replace(spec, parse=parse)

    def needs_content(self, key: ObjectKey) -> bool:
        """Tell whether the source is cached without the content a grant now needs."""
        source = self.source(key)
        return source is not None and source.withheld

    def fill(self, source: Source) -> bool:
        """Cache a source read whole at the edge (`probe`), if the cache still lacks its content.

        Once a grant names a source, the informer parses its every event whole: a cached
        entry with content is at least as new as this read, and is kept.
        """
        if source.withheld or not self.needs_content(source.key):
            return False
        cache = self.sources if source.key.kind is SourceKind.SECRET else self.config_sources
        cache.put(source.key, source)
        return True

    def _withhold(self, key: ObjectKey) -> None:
        """Drop a source's content once no grant names it any more."""
        source = self.source(key)
        if source is None or source.withheld or self._by_source.get(key):
            return
        cache = self.sources if key.kind is SourceKind.SECRET else self.config_sources
        cache.put(key, dataclasses.replace(source, data={}, binary_data={}, withheld=True))

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot(
        self, name: str, uncached: SourceState = SourceState.UNKNOWN, read: Source | None = None
    ) -> Snapshot:
        """Everything one reconcile of grant `name` reads, as immutable values, from memory.

        `uncached` is the state of a source the cache lacks, as a read of it told
        (`probe.snapshot` makes that read), and `read` the source that read returned whole
        (one an export names, in a one-shot store); a cached source is AVAILABLE.
        """
        record = self.grants.get(name)
        grant = record.grant if record is not None else None
        source = self.source(grant.source) if grant is not None else None
        if source is None and grant is not None and read is not None and read.key == grant.source:
            source = read
        if source is not None and source.withheld:  # its content must be read first (`fill`)
            source = None
        if grant is None:
            state = SourceState.UNKNOWN
        elif not self.serves(grant.kind):
            state = SourceState.REFUSED  # its caches are never filled: nothing is known there
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
        named = {g.source for g in (grant, *rivals) if g is not None}
        exports = {k: found for k in named if (found := self.exports_of(k))}
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
            protected=self.protected,
            exports=MappingProxyType(exports),
        )

    def serves(self, kind: SourceKind) -> bool:
        """Whether grants of this kind are served (ConfigMaps only with --configmaps)."""
        return self.configmaps or kind is SourceKind.SECRET

    def source(self, key: ObjectKey) -> Source | None:
        """The cached source under `key`: a labelled one, else one an export's watch holds.

        Its kind says which labelled cache.
        """
        cache = self.sources if key.kind is SourceKind.SECRET else self.config_sources
        found = cache.get(key)
        if found is None and self.exported is not None:
            return self.exported.get(key)
        return found

    def watched_state(self, key: ObjectKey) -> SourceState | None:
        """What an export's narrow watch knows of a source the caches lack.

        MISSING once it has listed without it, UNKNOWN before; None if no such watch is meant
        to hold it.
        """
        if self.exported is None or not self.exported.watches(key):
            return None
        return SourceState.MISSING if self.exported.known(key) else SourceState.UNKNOWN

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
        if old is not None and old.grant is not None:
            self._withhold(old.grant.source)
        self._rewatch()
        self._notify(Kind.GRANT, names)

    def source_changed(self, old: Source | None, new: Source | None) -> None:
        """Affected: the grants that project this source."""
        src = new or old
        if src is not None:
            self._notify(Kind.SOURCE, set(self._by_source.get(src.key, ())))
        for watcher in self._source_watchers:
            watcher(old, new)

    def _export_changed(self, old: Export | None, new: Export | None) -> None:
        """Affected: the grants that project the source it names (before or after)."""
        names: set[str] = set()
        for e, add in ((old, False), (new, True)):
            if e is None:
                continue
            names |= self._by_source.get(e.source, set())
            _update(self._exports_by_source, e.source, (e.namespace, e.name), add)
        self._rewatch()
        self._notify(Kind.SOURCE, names)

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


def _update(index: defaultdict[Any, set[Any]], k: Hashable, key: Hashable, add: bool) -> None:
    if add:
        index[k].add(key)
        return
    keys = index.get(k)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[k]
