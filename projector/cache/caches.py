"""The caches informers fill: each kind's resource and parser (`Spec`), and the `Cache` itself.

A Cache holds parsed values by key and tells its owner (the store) of every change; an object
that cannot be parsed is skipped and logged (`why` says so without quoting its values), never
cached half-read.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Hashable, ItemsView, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

import structlog

from projector.core.exports import Export, parse_export
from projector.core.grantspec import parse_grant_record
from projector.core.kinds import BY_KIND, EXPORTS, GRANTS, NAMESPACES, Obj, Resource
from projector.core.model import (
    EXPORT_LABEL,
    EXPORT_VALUE,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    GrantRecord,
    Namespace,
    ObjectKey,
    SourceKind,
    parse_copy,
    parse_namespace,
    parse_source,
)
from projector.errors import InvalidGrant, ProjectorError

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
    EXPORT = "exports"
    """ProjectionExports; their changes are reported as SOURCE (the producer's say changed)."""


def _namespaced_key(obj: Obj, kind: SourceKind = SourceKind.SECRET) -> ObjectKey:
    meta = obj["metadata"]
    return ObjectKey(meta["namespace"], meta["name"], kind)


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


def _export_key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (str(meta["namespace"]), str(meta["name"]))


EXPORT_SPEC: Spec[tuple[str, str], Export] = Spec(Kind.EXPORT, EXPORTS, parse_export, _export_key)
"""Every ProjectionExport (small objects a tenant writes, each bounded by `parse_export`)."""


def namespaced(
    kind: StrEnum, of: SourceKind, parse: Callable[..., T], selector: str | None
) -> Spec[ObjectKey, T]:
    """Secrets or ConfigMaps (`of`) of one label (None: any), by kind, namespace and name.

    Listed `SECRET_PAGE` at a time: a ConfigMap, too, may hold 1 MiB.
    """
    return Spec(
        kind,
        BY_KIND[of],
        functools.partial(parse, kind=of),
        functools.partial(_namespaced_key, kind=of),
        selector,
        SECRET_PAGE,
    )


EXPORTED = f"{EXPORT_LABEL}={EXPORT_VALUE}"
MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
SOURCE_SPEC = namespaced(Kind.SOURCE, SourceKind.SECRET, parse_source, EXPORTED)
"""Only contract Secrets: the other Secrets of the cluster are never transferred or cached."""
NAMESPACE_SPEC: Spec[str, Namespace] = Spec(Kind.NAMESPACE, NAMESPACES, parse_namespace, _name_key)
COPY_SPEC = namespaced(Kind.COPY, SourceKind.SECRET, parse_copy, MANAGED)
"""Copies are read whole (their data is hashed) but cached as metadata and that hash."""
CONFIG_SOURCE_SPEC = namespaced(Kind.CONFIG_SOURCE, SourceKind.CONFIG_MAP, parse_source, EXPORTED)
"""Only contract ConfigMaps, as for Secrets: the cluster's other ConfigMaps cost nothing."""
CONFIG_COPY_SPEC = namespaced(Kind.CONFIG_COPY, SourceKind.CONFIG_MAP, parse_copy, MANAGED)
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
