"""ProjectionExport: a producer's consent for one source, given without touching the source.

A third-party chart's Secret cannot carry the export label; whoever may manage the namespace
creates an export beside it instead, naming the source (same namespace), the keys that may
leave (`keys`; omitted: every key) and to whom (`to`: names, globs or `*`, as export-to). The
producer's consent for a namespace is the label path (`Source.exports_to`) or any export of
that source whose `to` matches (`consented`); the keys a copy there may hold are the union of
what those consents let leave. A tenant writes every byte of an export, so it is bounded like
the export-to annotation: past `MAX_EXPORT_TO_ENTRIES` entries or `MAX_EXPORT_TO_GLOBS` globs in
`to`, or `MAX_EXPORT_KEYS` keys, the export consents to nothing (`refused` says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from projector.core.model import (
    DEFAULT_SOURCE_KIND,
    MAX_EXPORT_TO_ENTRIES,
    MAX_EXPORT_TO_GLOBS,
    ObjectKey,
    Source,
    SourceKind,
    Uid,
    glob_count,
    in_audience,
    invalid_export_to,
    split_audience,
)

MAX_EXPORT_KEYS: Final = 256
"""Keys an export may list; past it, it lets no key leave (as an oversized export-keys)."""


@dataclass(frozen=True, slots=True)
class Export:
    """A parsed ProjectionExport: which source, which keys, to whom."""

    namespace: str
    name: str
    uid: Uid
    source: ObjectKey
    """Always in the export's own namespace."""
    keys: frozenset[str] | None
    """The keys that may leave; None: every key."""
    to: tuple[str, ...]
    """The valid entries of `spec.to` (names and globs)."""
    generation: int = 0
    ignored_to: tuple[str, ...] = ()
    """Entries that are neither a namespace name nor a glob: they match nothing."""
    refused: str = ""
    """Why the export consents to nothing (over a bound), if it does."""
    status: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The status as stored (what projector last wrote), so an unchanged one is not rewritten."""
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _globs: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names, globs = split_audience(self.to)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_globs", globs)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def exports_to(self, namespace: str) -> bool:
        """Tell whether this export lets a copy of its source into `namespace`."""
        return not self.refused and in_audience(self._names, self._globs, namespace)


def parse_export(obj: Mapping[str, Any]) -> Export:
    """Parse a ProjectionExport as cached; a structurally broken one raises (it is skipped).

    Bounds are checked before anything is split or compiled: an oversized `to` or `keys`
    consents to nothing, and says why.
    """
    meta, spec = obj["metadata"], obj.get("spec") or {}
    src = spec.get("source") or {}
    namespace = meta["namespace"]
    kind = SourceKind(src.get("kind", DEFAULT_SOURCE_KIND))
    source = ObjectKey(namespace, str(src["name"]), kind)
    raw_to = [str(t).strip() for t in spec.get("to") or ()]
    raw_keys = spec.get("keys")
    refused = _too_big(raw_to, raw_keys)
    to = () if refused else tuple(t for t in raw_to if t)
    ignored = invalid_export_to(to)
    return Export(
        namespace=namespace,
        name=meta["name"],
        uid=Uid(meta.get("uid", "")),
        source=source,
        keys=None if raw_keys is None else frozenset(str(k) for k in raw_keys),
        to=tuple(t for t in to if t not in ignored),
        generation=int(meta.get("generation") or 0),
        ignored_to=ignored,
        refused=refused,
        status=obj.get("status") or {},
    )


def _too_big(to: list[str], keys: Iterable[Any] | None) -> str:
    if len(to) > MAX_EXPORT_TO_ENTRIES:
        return f"spec.to has more than {MAX_EXPORT_TO_ENTRIES} entries; the export is ignored"
    if glob_count(to) > MAX_EXPORT_TO_GLOBS:
        return f"spec.to has more than {MAX_EXPORT_TO_GLOBS} globs; the export is ignored"
    if keys is not None and len(list(keys)) > MAX_EXPORT_KEYS:
        return f"spec.keys has more than {MAX_EXPORT_KEYS} keys; the export is ignored"
    return ""


@dataclass(frozen=True, slots=True)
class Consented:
    """The producer's consent in one namespace: which keys may leave, and who said so."""

    keys: frozenset[str] | None
    """None: every key."""
    via: tuple[str, ...]
    """`label`, and `export <namespace>/<name>` for each export that consents."""


LABEL = "label"


def consented(source: Source | None, exports: Sequence[Export], namespace: str) -> Consented | None:
    """The one rule of the producer's say: who consents to a copy in `namespace`, to which keys.

    The label path and every export whose `to` matches; the keys are the union of what each
    consenting path lets leave. None: nobody consents. Asked once per namespace of every plan:
    the label path alone (no export) allocates nothing when every key may leave.
    """
    by_label = source is not None and source.exports_to(namespace)
    if not exports:
        if not by_label:
            return None
        assert source is not None
        keys = source.export_keys
        return _BY_LABEL if keys is None else Consented(keys, (LABEL,))
    via: list[str] = []
    scopes: list[frozenset[str] | None] = []
    if by_label:
        assert source is not None
        via.append(LABEL)
        scopes.append(source.export_keys)
    for e in exports:
        if e.exports_to(namespace):
            via.append(f"export {e}")
            scopes.append(e.keys)
    if not via:
        return None
    if any(s is None for s in scopes):
        return Consented(None, tuple(via))
    return Consented(frozenset().union(*(s for s in scopes if s is not None)), tuple(via))


_BY_LABEL = Consented(None, (LABEL,))
