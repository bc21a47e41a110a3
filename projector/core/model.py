"""Value types of the projector API: the parsed ProjectionGrant and the cached views of objects.

Everything here is immutable and free of I/O, so the reconcile core can be a pure function of
these values. Raw API payloads are parsed once, at the informer edge, into these types.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import json
import re
import sys
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NamedTuple, NewType

import orjson

from projector.core.names import FIELD_MANAGER as FIELD_MANAGER

GROUP = "projector.nebari.dev"
VERSION = "v1alpha1"
PREFIX = f"{GROUP}/"

EXPORT_LABEL = f"{PREFIX}export"
EXPORT_VALUE = "true"
"""The export label's only opting-in value (`True`, `yes` or `1` are not consent)."""
EXPORT_TO_ANNOTATION = f"{PREFIX}export-to"
EXPORT_KEYS_ANNOTATION = f"{PREFIX}export-keys"
"""On an exported source: the only keys that may leave it (comma-separated); absent: every
key. The producer's key scope, a hard boundary whatever a grant asks for."""
MANAGED_BY_LABEL = f"{PREFIX}managed-by"
MANAGED_BY_VALUE = "projector"
GRANT_LABEL = f"{PREFIX}grant"
GRANT_UID_ANNOTATION = f"{PREFIX}grant-uid"
SOURCE_ANNOTATION = f"{PREFIX}source"
HASH_ANNOTATION = f"{PREFIX}content-hash"
KEYED_HASH = "hmac-sha256:"
"""How the content-hash annotation starts as projector writes it: an HMAC-SHA256 under the
install's hash key (`HashKey`), so that nobody who reads a copy's metadata can test guesses of
a weak value offline."""
UNKEYED_HASH = "sha256:"
"""How it starts as versions before the hash key wrote it (a bare SHA-256): still taken as in
sync when it is exactly the content's, so an upgrade rewrites no copy and rolls no workload."""
HASH_KEY_SECRET = "projector-hash-key"
"""The Secret, in the controller's own namespace, that holds the install's hash key."""
HASH_KEY_FIELD = "key"
"""Its data key."""
HASH_KEY_BYTES = 32
"""Random bytes of a new hash key, and the least a stored one may have."""
ON_REVOKE_ANNOTATION = f"{PREFIX}on-revoke"
ON_SOURCE_DELETED_ANNOTATION = f"{PREFIX}on-source-deleted"
GRANT_METADATA_ANNOTATION = f"{PREFIX}grant-metadata"
"""Which labels/annotations of a copy came from the grant's target, so that keys an admin later
removes from the grant are removed from the copies too, while keys other tools add are kept."""
MAX_EXPORT_TO_ENTRIES = 256
"""More entries than this in an export-to annotation, and it is ignored as a whole (nobody):
a tenant writes it, and every event of its Secret parses it (DESIGN §3, hostile input)."""
MAX_EXPORT_TO_GLOBS = 32
"""More globs than this among the entries, and the annotation is ignored as a whole: the globs
are compiled into one expression when a grant first matches them, which costs about 0.12 ms a
glob (4 ms at the cap, measured in `benchmarks/hostile.py`); names cost a set entry."""
MAX_EXPORT_TO_LENGTH = 16384
"""Characters of an export-to annotation past which it is ignored as a whole (256 entries of
a 63-character namespace name, with their commas, fit)."""
REFUSED_TYPES = frozenset({"kubernetes.io/service-account-token", "bootstrap.kubernetes.io/token"})
"""Secret types that are credentials of the cluster itself: never projected, whatever grants
and opt-ins say (a copy would hand a ServiceAccount's or a node's token to another team)."""
MAX_ANNOTATION_VALUE = 2048
"""Of a grant's extra annotation values (as the CRD says): 64 of them stay well within the API
server's 256 KiB of metadata on a copy, which would otherwise refuse every copy write."""

Uid = NewType("Uid", str)
"""An object's metadata.uid: the only identity that cannot be spoofed by relabelling."""


class SourceKind(StrEnum):
    """What a grant projects (`spec.source.kind`): the copies are always of the source's kind."""

    SECRET = "Secret"
    CONFIG_MAP = "ConfigMap"


class ObjectKey(NamedTuple):
    """Kind, namespace and name of a source or a copy (a tuple: hashed in C, it keys every cache).

    The kind is part of the identity, so a Secret and a ConfigMap of one name in one namespace
    are two keys everywhere (caches, indexes, claims, plans), never one.
    """

    namespace: str
    name: str
    kind: SourceKind = SourceKind.SECRET

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class OnRevoke(StrEnum):
    """What happens to a copy when the grant, the opt-in or the targeting goes away."""

    DELETE = "Delete"
    RETAIN = "Retain"


class OnSourceDeleted(StrEnum):
    """What happens to the copies when the source Secret is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


DEFAULT_SOURCE_KIND: Final = SourceKind.SECRET
DEFAULT_ON_REVOKE: Final = OnRevoke.DELETE
DEFAULT_ON_SOURCE_DELETED: Final = OnSourceDeleted.RETAIN
"""The policy defaults, written once: the grant parser and `Grant` take them, and a unit test
holds the CRD's schema defaults (what the API server fills in) to them."""


@dataclass(frozen=True, slots=True)
class KeyMapping:
    """One projected key: source key `src` lands as `dst` in the copy."""

    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector (matchLabels and matchExpressions)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Tell whether `labels` satisfy every requirement (an empty selector matches all)."""
        for k, v in self.match_labels:
            if labels.get(k) != v:
                return False
        for k, op, values in self.match_expressions:
            present = k in labels
            if op == "In" and not (present and labels[k] in values):
                return False
            if op == "NotIn" and present and labels[k] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True, slots=True)
class Grant:
    """A parsed ProjectionGrant: what an admin allows to be projected, and where."""

    name: str
    uid: Uid
    generation: int
    created: str
    """creationTimestamp (RFC 3339, so string order is time order): the older grant wins a tie."""
    source: ObjectKey
    keys: tuple[KeyMapping, ...] | None
    """None projects every key of the source."""
    target_name: str
    namespaces: frozenset[str]
    selector: LabelSelector | None
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    on_revoke: OnRevoke = DEFAULT_ON_REVOKE
    on_source_deleted: OnSourceDeleted = DEFAULT_ON_SOURCE_DELETED
    deleting: bool = False

    @property
    def kind(self) -> SourceKind:
        """The kind of the source, hence of every copy."""
        return self.source.kind

    @property
    def seniority(self) -> tuple[str, str]:
        """Sort key among grants competing for one copy: older first, then by name."""
        return (self.created, self.name)

    def targets(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Tell whether the admin's grant aims at this namespace (before the producer's say)."""
        if namespace in self.namespaces:
            return True
        return self.selector is not None and self.selector.matches(labels)


@dataclass(frozen=True, slots=True)
class Source:
    """A cached contract Secret or ConfigMap (label `export=true`), content included.

    Content only while some grant names it (`withheld` otherwise): a tenant's exported
    objects that no grant names cost their metadata, not their data.
    """

    key: ObjectKey
    uid: Uid
    type: str
    """A Secret's type; empty for a ConfigMap, which has none."""
    data: Mapping[str, str] = field(repr=False)
    """Values exactly as the API returned them (a Secret's base64, a ConfigMap's text); never
    logged (not even in a repr)."""
    export_to: tuple[str, ...]
    """The valid patterns of the export-to annotation (names and globs); empty means nobody."""
    ignored_export_to: tuple[str, ...] = ()
    """Entries of the annotation that are neither a namespace name nor a glob (`-foo`, `!foo`,
    `[!a]*`): they match nothing (never handed to fnmatch, which would read `[!a]` as a
    negation), and the grant's status says so rather than ignore them silently."""
    binary_data: Mapping[str, str] = field(default_factory=dict, repr=False)
    """A ConfigMap's binaryData (base64); always empty for a Secret."""
    export_to_refused: str = ""
    """Why the whole export-to annotation is ignored (too many entries, too long), if it is."""
    refused: str = ""
    """Why this object can never be a source, if so: a credential type (`REFUSED_TYPES`), or
    a copy projector wrote (a copy is never projected on)."""
    withheld: bool = False
    """Its data was not kept (no grant named it when it was cached): `data` is empty."""
    export_keys: frozenset[str] | None = None
    """The keys the producer lets leave (`EXPORT_KEYS_ANNOTATION`); None: every key."""
    export_keys_refused: str = ""
    """Why the export-keys annotation is ignored as a whole, if it is: then no key leaves."""
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _globs: tuple[str, ...] = field(init=False, repr=False, compare=False)

    labelled: bool = True
    """It carries the export label (the label path's consent); False: cached only because a
    ProjectionExport names it, and its own export-to and export-keys say nothing."""

    def __post_init__(self) -> None:
        names, globs = split_audience(self.export_to)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_globs", globs)

    def exports_to(self, namespace: str) -> bool:
        """Tell whether its label and export-to allow a copy in `namespace` (default deny)."""
        return self.labelled and in_audience(self._names, self._globs, namespace)


@dataclass(frozen=True, slots=True)
class Namespace:
    """A cached Namespace: its labels decide selectors, its phase decides whether to write."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class Copy:
    """A cached copy (Secret or ConfigMap). Its data is reduced to `observed_hash` at the edge."""

    key: ObjectKey
    uid: Uid
    resource_version: str
    type: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    observed_hash: str
    """Hash of what is really stored (type, data, projector's own metadata), so edits of data
    are seen as drift; labels and annotations that others add are not ours to police."""
    deleting: bool = False
    immutable: bool = False
    marked_by_projector: bool = True
    """managedFields say projector itself wrote the grant-uid annotation: a manifest copied by
    hand from a real copy carries the same annotation, but not this proof."""

    @property
    def grant_uid(self) -> str | None:
        """The authoritative owner mark: the grant-uid annotation, if projector wrote it."""
        return self.annotations.get(GRANT_UID_ANNOTATION) if self.marked_by_projector else None


# --- parsing ------------------------------------------------------------------------------------

_EXPORT_PATTERN = re.compile(r"[a-z0-9*?\[][-a-z0-9*?\[\]]*")
"""A namespace name, or a shell glob over namespace names (no negation: `!` is refused)."""
_GLOB = re.compile(r"[*?\[]")


@functools.lru_cache(maxsize=256)
def _globs_regex(globs: tuple[str, ...]) -> re.Pattern[str]:
    """One expression that matches a namespace when any of `globs` does.

    Bounded: at most 256 sets are kept, each of at most `MAX_EXPORT_TO_GLOBS` globs.
    """
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))


def glob_count(patterns: Iterable[str]) -> int:
    """How many of `patterns` are globs (each costs a part of a compiled expression)."""
    return sum(_GLOB.search(p) is not None for p in patterns)


def split_audience(patterns: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """Namespace names and globs, apart: the names are a set lookup, the globs one regex."""
    names = frozenset(p for p in patterns if not _GLOB.search(p))
    return names, tuple(p for p in patterns if p not in names)


def in_audience(names: frozenset[str], globs: tuple[str, ...], namespace: str) -> bool:
    """Tell whether a namespace is among `names` or matches one of `globs` (`split_audience`).

    Never one fnmatch per pattern per namespace: the globs are one regular expression,
    compiled once per set of globs (`_globs_regex`).
    """
    if namespace in names or "*" in globs:
        return True
    return bool(globs) and _globs_regex(globs).fullmatch(namespace) is not None


def is_exported(labels: Mapping[str, str]) -> bool:
    """Tell whether a Secret's labels opt it in as a contract (the producer's first consent)."""
    return labels.get(EXPORT_LABEL) == EXPORT_VALUE


def parse_export_to(value: str | None) -> tuple[str, ...]:
    """Split the producer's export-to annotation; missing or blank means nobody."""
    if not value:
        return ()
    return tuple(p for p in (part.strip() for part in value.split(",")) if p)


def export_to_too_big(value: str | None) -> str:
    """Why an export-to annotation is ignored as a whole (nobody), or "" if it is not.

    Checked before anything is split, so a hostile annotation costs two linear scans.
    """
    if not value:
        return ""
    if len(value) > MAX_EXPORT_TO_LENGTH:
        return f"export-to is longer than {MAX_EXPORT_TO_LENGTH} characters; ignored as a whole"
    if value.count(",") >= MAX_EXPORT_TO_ENTRIES:
        return f"export-to has more than {MAX_EXPORT_TO_ENTRIES} entries; ignored as a whole"
    return ""


def invalid_export_to(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The entries that can never match a namespace, as written (reported, never guessed at)."""
    return tuple(p for p in patterns if _EXPORT_PATTERN.fullmatch(p) is None)


def parse_export_keys(value: str | None) -> tuple[frozenset[str] | None, str]:
    """The producer's key scope from its export-keys annotation, and why it is refused if so.

    Absent: None (every key). Present, it fails closed: blank, or past the same bounds as
    export-to (`export_to_too_big`), no key leaves; an entry that is not a key name matches no
    key. A tenant writes it, so it costs two linear scans and one split.
    """
    if value is None:
        return None, ""
    if too_big := export_to_too_big(value).replace("export-to", "export-keys"):
        return frozenset(), too_big
    return frozenset(k for k in (p.strip() for p in value.split(",")) if k), ""


def refused_source(obj: Mapping[str, Any], kind: SourceKind) -> str:
    """Why an object may never be a source whatever its opt-in says, or "" if it may."""
    meta = obj.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE or GRANT_UID_ANNOTATION in notes:
        return "the source is a copy projector wrote; a copy is never projected on"
    type_ = object_type(obj, kind)
    if type_ in REFUSED_TYPES:
        return f"the source's type {type_} is a credential of the cluster; never projected"
    return ""


def object_type(obj: Mapping[str, Any], kind: SourceKind) -> str:
    """A Secret's type (Opaque when unset); a ConfigMap has none (empty)."""
    return (obj.get("type") or "Opaque") if kind is SourceKind.SECRET else ""


def binary_data(obj: Mapping[str, Any], kind: SourceKind) -> dict[str, str] | None:
    """A ConfigMap's binaryData (empty when unset); None for a Secret, which has no such field."""
    return dict(obj.get("binaryData") or {}) if kind is SourceKind.CONFIG_MAP else None


def parse_source(
    obj: Mapping[str, Any], kind: SourceKind = SourceKind.SECRET, *, content: bool = True
) -> Source:
    """Parse a contract Secret or ConfigMap as cached: copies are built from its content.

    `content=False` keeps its metadata only (`Source.withheld`): no grant names it. Linear in
    the object's metadata, and bounded (`export_to_too_big`): a tenant writes all of it.
    """
    meta = obj["metadata"]
    value = (meta.get("annotations") or {}).get(EXPORT_TO_ANNOTATION)
    too_big = export_to_too_big(value)
    patterns = () if too_big else parse_export_to(value)
    if glob_count(patterns) > MAX_EXPORT_TO_GLOBS:
        too_big = f"export-to has more than {MAX_EXPORT_TO_GLOBS} globs; ignored as a whole"
        patterns = ()
    ignored = invalid_export_to(patterns)
    bad = set(ignored)
    keys, keys_refused = parse_export_keys(
        (meta.get("annotations") or {}).get(EXPORT_KEYS_ANNOTATION)
    )
    return Source(
        key=ObjectKey(meta["namespace"], meta["name"], kind),
        uid=Uid(meta.get("uid", "")),
        type=object_type(obj, kind),
        data=dict(obj.get("data") or {}) if content else {},
        export_to=tuple(p for p in patterns if p not in bad),
        ignored_export_to=ignored,
        binary_data=(binary_data(obj, kind) or {}) if content else {},
        export_to_refused=too_big,
        refused=refused_source(obj, kind),
        withheld=not content,
        export_keys=keys,
        export_keys_refused=keys_refused,
        labelled=is_exported(meta.get("labels") or {}),
    )


def parse_namespace(obj: Mapping[str, Any]) -> Namespace:
    """Parse a Namespace; a deletionTimestamp or phase Terminating means do not write there."""
    meta = obj["metadata"]
    phase = (obj.get("status") or {}).get("phase")
    return Namespace(
        name=sys.intern(meta["name"]),
        labels={k: sys.intern(v) for k, v in (meta.get("labels") or {}).items()},
        terminating=bool(meta.get("deletionTimestamp")) or phase == "Terminating",
    )


def content_bytes(
    type_: str,
    data: Mapping[str, str],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    binary: Mapping[str, str] | None = None,
) -> bytes:
    """What a copy holds, as the bytes its hashes are taken over (`content_hash`, `HashKey`).

    The content-hash annotation itself is left out, so the hash of a stored copy can be
    recomputed from the copy and compared with the annotation and with the desired hash.
    `binary` is a ConfigMap's binaryData (None for a Secret, whose hash is unchanged by it).
    The bytes are json.dumps's, as they always were (a stored copy's hash must keep matching
    across versions); orjson writes the same bytes seven times faster wherever its output is
    ASCII without DEL, the only characters json escapes and it does not.
    """
    meta = {k: v for k, v in annotations.items() if k != HASH_ANNOTATION}
    parts: list[object] = [type_, sorted(data.items()), sorted(labels.items())]
    parts.append(sorted(meta.items()))
    if binary is not None:
        parts.append(sorted(binary.items()))
    blob = orjson.dumps(parts)
    if not blob.isascii() or b"\x7f" in blob:  # orjson leaves these unescaped; json does not
        blob = json.dumps(parts, separators=(",", ":")).encode()
    return blob


def content_hash(
    type_: str,
    data: Mapping[str, str],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    binary: Mapping[str, str] | None = None,
) -> str:
    """Hash what a copy holds, unkeyed: the diff key between what we want and what is stored.

    Kept in memory only (`Copy.observed_hash`, `Desired.core_hash`), and the annotation of
    copies written before the hash key (`UNKEYED_HASH`); what projector writes now is keyed.
    """
    blob = content_bytes(type_, data, labels, annotations, binary)
    return UNKEYED_HASH + hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True, slots=True)
class HashKey:
    """The install's key of the content-hash annotation (the Secret `HASH_KEY_SECRET`).

    Never in a repr, a log, an Event, a status, a metric or a trace: whoever holds it can
    test guesses of a copy's values against its annotation, as anyone could before it.
    """

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < HASH_KEY_BYTES:
            raise ValueError(f"a hash key has at least {HASH_KEY_BYTES} bytes")

    def sign(self, blob: bytes) -> str:
        """The content-hash annotation of the content `blob` (`content_bytes`)."""
        return KEYED_HASH + hmac.new(self.secret, blob, hashlib.sha256).hexdigest()


def own_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """The labels or annotations under projector's reserved prefix."""
    return {k: v for k, v in metadata.items() if k.startswith(PREFIX)}


def marked_by_projector(meta: Mapping[str, Any]) -> bool:
    """Tell whether projector's field manager owns the copy's grant-uid annotation."""
    field_ = f"f:{GRANT_UID_ANNOTATION}"
    for entry in meta.get("managedFields") or ():
        if entry.get("manager") != FIELD_MANAGER:
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations")
        if fields and field_ in fields:
            return True
    return False


class SharedMetadata(dict[str, str]):
    """Labels or annotations that every cached copy holding the same ones shares (`shared`).

    Never modified once made (a copy's fields are read-only `Mapping`s); weakly referenced
    by the table of `shared`, so it lives exactly as long as a copy holds it.
    """

    __slots__ = ("__weakref__",)


_SHARED: weakref.WeakValueDictionary[tuple[tuple[str, str], ...], SharedMetadata] = (
    weakref.WeakValueDictionary()
)


def shared(metadata: Mapping[str, str]) -> Mapping[str, str]:
    """One object for equal labels (or annotations), however many cached copies carry them.

    A grant's copies carry the same labels and annotations (content hash, grant uid, source,
    policies) in every namespace: 10,000 copies of 1,000 grants hold 1,000 of each, not
    10,000. Keys and values are interned, so equal strings are one object too.
    """
    items = tuple((sys.intern(k), sys.intern(v)) for k, v in metadata.items())
    found = _SHARED.get(items)
    if found is None:
        found = _SHARED[items] = SharedMetadata(items)
    return found


def parse_copy(obj: Mapping[str, Any], kind: SourceKind = SourceKind.SECRET) -> Copy:
    """Reduce a copy (Secret or ConfigMap) to metadata plus the hash of what it really stores.

    The data is dropped here, so the cache of copies holds no value. What copies have in
    common is one object: their labels and annotations (`shared`), the namespace, name, type
    and observed hash (interned); only uid and resourceVersion are a copy's own.
    """
    meta = obj["metadata"]
    labels = shared(meta.get("labels") or {})
    annotations = shared(meta.get("annotations") or {})
    type_ = sys.intern(object_type(obj, kind))
    immutable = bool(obj.get("immutable"))
    return Copy(
        key=ObjectKey(sys.intern(meta["namespace"]), sys.intern(meta["name"]), kind),
        uid=Uid(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        type=type_,
        labels=labels,
        annotations=annotations,
        observed_hash=sys.intern(
            content_hash(
                type_,
                obj.get("data") or {},
                own_metadata(labels),
                own_metadata(annotations),
                binary_data(obj, kind),
            )
        ),
        deleting=bool(meta.get("deletionTimestamp")),
        immutable=immutable,
        marked_by_projector=marked_by_projector(meta),
    )


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """A cached ProjectionGrant: parsed spec (or why it is invalid) plus its stored status."""

    name: str
    uid: Uid
    generation: int
    grant: Grant | None
    invalid: str | None
    status: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Compared with a freshly computed status so unchanged statuses are never rewritten."""


def interned(value: Any) -> Any:
    """A JSON value with its strings interned, equal to the value itself.

    A grant's stored status repeats the reasons, messages and timestamps of every other
    grant's; interned, each string is kept once.
    """
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {k: interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned(v) for v in value]
    return value
