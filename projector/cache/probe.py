"""Snapshots for a reconcile: the store's caches, plus one read of a source they lack.

The store answers from memory only. A grant whose source is not in its source cache (which
holds exported Secrets, or exported ConfigMaps, only) needs one metadata-only read to tell
"deleted" (404) from "not exported" from "unknown" (a failed read, or an exported source the
watch has not delivered yet): that API call is made here, at the edge, never inside the store.
A source a ProjectionExport names is its narrow watch's (`cache.exported`), or, in a one-shot
store, read whole here.
"""

from __future__ import annotations

import structlog

from projector.cache.store import Store
from projector.client.api import Api
from projector.core.kinds import BY_KIND
from projector.core.model import ObjectKey, Source, is_exported, parse_source
from projector.core.plans import Snapshot, SourceState
from projector.errors import ApiError, NotFound

log = structlog.get_logger("projector.store")


async def snapshot(store: Store, name: str, api: Api | None = None) -> Snapshot:
    """Everything one reconcile of grant `name` reads, as immutable values.

    The grant is read once; a source missing from the cache is probed through `api` (by
    default the API the store was filled from).
    """
    record = store.grants.get(name)
    grant = record.grant if record is not None else None
    if grant is None or not store.serves(grant.kind):
        return store.snapshot(name)
    if store.needs_content(grant.source):  # cached without its data: no grant named it
        return store.snapshot(name, uncached=await fill(store, api or store.api, grant.source))
    if store.source(grant.source) is not None:
        return store.snapshot(name)
    if (watched := store.watched_state(grant.source)) is not None:
        return store.snapshot(name, uncached=watched)  # an export's watch: no read needed
    if store.exports_of(grant.source):  # a one-shot store: the exported source, read whole
        state, read = await whole_source(api or store.api, grant.source)
        return store.snapshot(name, uncached=state, read=read)
    state = await source_state(api or store.api, grant.source)
    return store.snapshot(name, uncached=state)


async def whole_source(api: Api, key: ObjectKey) -> tuple[SourceState, Source | None]:
    """A source an export names, read whole (it carries no label to be cached by)."""
    try:
        obj = await api.get(BY_KIND[key.kind], key.name, namespace=key.namespace)
    except NotFound:
        return SourceState.MISSING, None
    except ApiError as e:
        log.warning("source read failed", source=str(key), status=e.status)
        return SourceState.UNKNOWN, None
    return SourceState.AVAILABLE, parse_source(obj, key.kind)


async def fill(store: Store, api: Api, key: ObjectKey) -> SourceState:
    """Read a source whole that a grant has just come to name, into the store's cache.

    What the read says of it if it cannot be cached (gone, no longer exported, unreadable).
    """
    try:
        obj = await api.get(BY_KIND[key.kind], key.name, namespace=key.namespace)
    except NotFound:
        return SourceState.MISSING
    except ApiError as e:
        log.warning("source read failed", source=str(key), status=e.status)
        return SourceState.UNKNOWN
    if not is_exported((obj.get("metadata") or {}).get("labels") or {}):
        return SourceState.NOT_EXPORTED
    store.fill(parse_source(obj, key.kind))
    return SourceState.UNKNOWN  # what the cache holds now is what the snapshot reads


async def source_state(api: Api, key: ObjectKey) -> SourceState:
    """What one metadata-only read says of a source (Secret or ConfigMap) the cache lacks."""
    try:
        obj = await api.get(
            BY_KIND[key.kind], key.name, namespace=key.namespace, metadata_only=True
        )
    except NotFound:
        return SourceState.MISSING
    except ApiError as e:
        log.warning("source read failed", source=str(key), status=e.status)
        return SourceState.UNKNOWN
    if is_exported((obj.get("metadata") or {}).get("labels") or {}):
        return SourceState.UNKNOWN  # exported but not cached yet: the watch is behind
    return SourceState.NOT_EXPORTED
