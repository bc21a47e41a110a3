"""The desired copy: what a grant's copy holds, its hash, and the object sent for it.

Pure: built once per grant from its source (`desired_copy`), identical in every namespace but
for metadata.namespace; `Desired.in_sync` tells from a cached copy's metadata alone whether it
already holds exactly this; `Bodies` serializes it into each copy's request body, the shared
parts once per plan.

The content-hash annotation written is keyed (`model.HashKey`); the unkeyed one that earlier
versions wrote over the same content still counts as in sync, compared exactly, so an upgrade
rewrites nothing until the content changes. Without a key (`projector explain`, which never
needs it) the hash is the unkeyed one, and a keyed annotation, which cannot be recomputed then,
is taken as in sync when the content it covers is (the unkeyed core hash, the grant's extras).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import orjson

from projector.core.kinds import BY_KIND
from projector.core.model import (
    GRANT_LABEL,
    GRANT_METADATA_ANNOTATION,
    GRANT_UID_ANNOTATION,
    HASH_ANNOTATION,
    KEYED_HASH,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ON_REVOKE_ANNOTATION,
    ON_SOURCE_DELETED_ANNOTATION,
    PREFIX,
    SOURCE_ANNOTATION,
    UNKEYED_HASH,
    Copy,
    Grant,
    HashKey,
    Source,
    SourceKind,
    content_bytes,
    content_hash,
)

_EMPTY: Mapping[str, str] = MappingProxyType({})


def _stamped(value: str | None, hash_: str, legacy: str) -> bool:
    """The content-hash annotation `value` is what a copy of this content carries.

    The keyed hash, or exactly the unkeyed one of earlier versions; without a key (`hash_` is
    the unkeyed one), any keyed annotation, which only the key could check.
    """
    if not value:
        return False
    if value in (hash_, legacy):
        return True
    return hash_ == legacy and value.startswith(KEYED_HASH)


def _holds(
    copy: Copy,
    core_hash: str,
    hash_: str,
    legacy: str,
    extra_labels: Mapping[str, str],
    extra_annotations: Mapping[str, str],
) -> bool:
    if copy.observed_hash != core_hash:
        return False
    notes = copy.annotations
    if not _stamped(notes.get(HASH_ANNOTATION), hash_, legacy):
        return False
    if extra_labels:
        labels = copy.labels
        if any(labels.get(k) != v for k, v in extra_labels.items()):
            return False
    return not extra_annotations or all(notes.get(k) == v for k, v in extra_annotations.items())


@dataclass(frozen=True, slots=True)
class Echo:
    """A `Desired` without its values, labels or annotations: enough to tell an echo.

    The controller keeps one per grant to tell its own writes' echoes, so it holds no Secret
    values outside the caches (RSS: no change measurable; memory-before-after-3-echo in
    docs/benchmarks.md's history).
    """

    core_hash: str
    hash: str
    legacy_hash: str
    extra_labels: Mapping[str, str]
    extra_annotations: Mapping[str, str]

    def in_sync(self, copy: Copy) -> bool:
        """Tell whether a stored copy holds what the `Desired` this came from holds."""
        return _holds(
            copy,
            self.core_hash,
            self.hash,
            self.legacy_hash,
            self.extra_labels,
            self.extra_annotations,
        )


@dataclass(frozen=True, slots=True)
class Desired:
    """The copy a grant wants; identical in every namespace but for metadata.namespace."""

    name: str
    type: str
    data: Mapping[str, str] = field(repr=False)
    """The Secret's values: never in a log, an error message or a repr."""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    hash: str
    """Over everything written: the content-hash annotation (keyed, `model.HashKey`)."""
    core_hash: str
    """Over type, data and projector's own metadata: compared with a copy's observed hash."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    extra_annotations: Mapping[str, str] = field(default_factory=dict)
    kind: SourceKind = SourceKind.SECRET
    """The source's kind, hence the copy's: a Secret's copy is a Secret, a ConfigMap's a
    ConfigMap."""
    binary_data: Mapping[str, str] = field(default_factory=dict, repr=False)
    """A ConfigMap copy's binaryData; empty for a Secret."""
    legacy_hash: str = ""
    """The unkeyed hash over what `hash` covers, as versions before the hash key wrote it: a
    copy carrying exactly this is in sync too (an upgrade rewrites nothing). Equal to `hash`
    when built without a key."""

    def payload(self) -> dict[str, Mapping[str, str]]:
        """The fields that carry values: `data`, and a ConfigMap's `binaryData`."""
        if self.kind is SourceKind.SECRET:
            return {"data": self.data}
        return {"data": self.data, "binaryData": self.binary_data}

    def in_sync(self, copy: Copy) -> bool:
        """Tell whether a stored copy already holds exactly this content and our metadata."""
        return _holds(
            copy,
            self.core_hash,
            self.hash,
            self.legacy_hash,
            self.extra_labels,
            self.extra_annotations,
        )

    def stamped(self, value: str | None) -> bool:
        """Tell whether a content-hash annotation is one a copy of this content carries."""
        return _stamped(value, self.hash, self.legacy_hash)

    def echo(self) -> Echo:
        """What a copy in sync with this holds in its metadata, without the values."""
        return Echo(
            self.core_hash,
            self.hash,
            self.legacy_hash,
            self.extra_labels or _EMPTY,
            self.extra_annotations or _EMPTY,
        )

    def manifest(
        self,
        namespace: str,
        resource_version: str | None = None,
        keep: Copy | None = None,
        *,
        with_data: bool = True,
    ) -> dict[str, object]:
        """The object to send; with a resourceVersion, a PUT that fails if the copy moved on.

        Labels and annotations others added to `keep` (the stored copy) are carried over:
        a PUT must not erase what other tools wrote, only restore what is ours. Without data,
        for a writer that serializes the data once for every namespace.
        """
        labels, annotations = dict(self.labels), dict(self.annotations)
        if keep is not None:
            kept_labels, kept_annotations = kept_metadata(keep)
            labels = kept_labels | labels
            annotations = kept_annotations | annotations
        meta: dict[str, object] = {
            "name": self.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        out: dict[str, object] = {"apiVersion": "v1", "kind": self.kind.value, "metadata": meta}
        if self.kind is SourceKind.SECRET:
            out["type"] = self.type
        if with_data:
            out.update((k, dict(v)) for k, v in self.payload().items())
        return out


def kept_metadata(keep: Copy) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations of a stored copy that a PUT of it must carry over.

    Those other tools wrote: neither projector's own nor ones a grant wrote before.
    """
    was = _grant_metadata(keep)
    return (
        _foreign(keep.labels, was.get("labels", ())),
        _foreign(keep.annotations, was.get("annotations", ())),
    )


def _foreign(metadata: Mapping[str, str], grants: Iterable[str]) -> dict[str, str]:
    """Keys other tools wrote: neither projector's own nor ones a grant wrote before."""
    skip = set(grants)
    return {k: v for k, v in metadata.items() if not k.startswith(PREFIX) and k not in skip}


_NOTHING_RECORDED: Mapping[str, list[str]] = MappingProxyType({})


def _grant_metadata(copy: Copy) -> Mapping[str, list[str]]:
    """The label and annotation keys a grant recorded on the copy (read-only).

    Read on every Update of a copy: most copies record none (no JSON to parse), and the copies
    of one grant record the same string, parsed once (`_recorded`).
    """
    raw = copy.annotations.get(GRANT_METADATA_ANNOTATION)
    return _NOTHING_RECORDED if raw is None else _recorded(raw)


@functools.lru_cache(maxsize=256)
def _recorded(raw: str) -> Mapping[str, list[str]]:
    try:
        recorded = json.loads(raw)
    except ValueError:
        return _NOTHING_RECORDED
    return MappingProxyType(recorded) if isinstance(recorded, dict) else _NOTHING_RECORDED


def unexported_key(grant: Grant, scope: frozenset[str] | None) -> str:
    """The first key the grant names that the producer's scope does not let leave.

    "" if none, or if there is no scope (every key may leave).
    """
    if scope is None or grant.keys is None:
        return ""
    return next((k.src for k in grant.keys if k.src not in scope), "")


def _select(
    grant: Grant, source: Source, scope: frozenset[str] | None
) -> tuple[dict[str, str], dict[str, str], bool] | str:
    """The granted keys of `data` and `binaryData`, renamed, and whether that is all of them.

    Or the first granted key the source lacks. A grant that names no keys takes the keys the
    producer's `scope` lets leave (None: every key); a grant that names keys outside it is
    refused before this (`unexported_key`).
    """
    if grant.keys is None:
        if scope is None:
            return dict(source.data), dict(source.binary_data), True
        kept = {k: v for k, v in source.data.items() if k in scope}
        kept_binary = {k: v for k, v in source.binary_data.items() if k in scope}
        whole = len(kept) + len(kept_binary) == len(source.data) + len(source.binary_data)
        return kept, kept_binary, whole
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    for k in grant.keys:
        if k.src in source.data:
            data[k.dst] = source.data[k.src]
        elif k.src in source.binary_data:
            binary[k.dst] = source.binary_data[k.src]
        else:
            return k.src
    whole = {k.src for k in grant.keys} == set(source.data) | set(source.binary_data) and all(
        k.src == k.dst for k in grant.keys
    )
    return data, binary, whole


def desired_copy(
    grant: Grant,
    source: Source,
    hash_key: HashKey | None = None,
    scope: frozenset[str] | None = None,
) -> Desired | str:
    """Build the copy for a grant, or name the first key the source lacks.

    Only the keys the producer's `scope` lets leave (None: every key) are copied; filtered,
    the copy is Opaque. `hash_key` signs the content-hash annotation; None: the unkeyed hash
    (explain, tests).
    """
    selected = _select(grant, source, scope)
    if isinstance(selected, str):
        return selected
    data, binary, whole = selected
    type_ = source.type if whole else "Opaque"
    if source.key.kind is not SourceKind.SECRET:
        type_ = ""  # a ConfigMap has no type
    ours = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, GRANT_LABEL: grant.name}
    our_notes = {
        GRANT_UID_ANNOTATION: grant.uid,
        SOURCE_ANNOTATION: str(source.key),
        ON_REVOKE_ANNOTATION: grant.on_revoke.value,
        ON_SOURCE_DELETED_ANNOTATION: grant.on_source_deleted.value,
    }
    # Reserved keys are refused by parse_grant; dropping them here keeps in_sync reachable.
    extra_labels = {k: v for k, v in grant.labels if not k.startswith(PREFIX)}
    extra_notes = {k: v for k, v in grant.annotations if not k.startswith(PREFIX)}
    if extra_labels or extra_notes:
        our_notes[GRANT_METADATA_ANNOTATION] = json.dumps(
            {"labels": sorted(extra_labels), "annotations": sorted(extra_notes)},
            separators=(",", ":"),
        )
    labels = extra_labels | ours
    annotations = extra_notes | our_notes
    cm_binary = None if source.key.kind is SourceKind.SECRET else binary
    blob = content_bytes(type_, data, labels, annotations, cm_binary)
    legacy = UNKEYED_HASH + hashlib.sha256(blob).hexdigest()
    digest = hash_key.sign(blob) if hash_key is not None else legacy
    core = content_hash(type_, data, ours, our_notes, cm_binary)
    annotations[HASH_ANNOTATION] = digest
    return Desired(
        grant.target_name,
        type_,
        data,
        labels,
        annotations,
        digest,
        core,
        extra_labels,
        extra_notes,
        source.key.kind,
        binary,
        legacy,
    )


class Bodies:
    """The copy's request bodies: its data is serialized once per plan, however many copies."""

    def __init__(self, desired: Desired) -> None:
        self.desired = desired
        self.kind = desired.kind
        self.resource = BY_KIND[desired.kind]
        """Where the copy is written: a Secret's copy to secrets, a ConfigMap's to configmaps."""
        self._data: bytes | None = None

    @property
    def data(self) -> bytes:
        """The value fields as JSON members, serialized on first use.

        `"data":{..}`, and a ConfigMap's `"binaryData":{..}`.
        """
        if self._data is None:
            payload = {k: dict(v) for k, v in self.desired.payload().items()}
            self._data = orjson.dumps(payload)[1:-1]
        return self._data

    def body(
        self, namespace: str, resource_version: str | None = None, keep: Copy | None = None
    ) -> bytes:
        """The request body of the copy in `namespace` (a PUT's, with `resource_version`).

        A copy that carries nothing of other tools (the usual case) gets the metadata this
        plan wants for every copy, serialized once: only its namespace and resourceVersion are
        serialized per write. Otherwise `Desired.manifest` merges what the copy keeps.
        """
        if keep is not None:
            kept_labels, kept_annotations = kept_metadata(keep)
            if kept_labels or kept_annotations:
                head = orjson.dumps(
                    self.desired.manifest(namespace, resource_version, keep, with_data=False)
                )
                return head[:-1] + b"," + self.data + b"}"
        version = b""
        if resource_version:
            version = b',"resourceVersion":' + orjson.dumps(resource_version)
        return b"".join((self.head, orjson.dumps(namespace), version, self.tail, self.data, b"}"))

    @functools.cached_property
    def head(self) -> bytes:
        """`{"apiVersion":..,"kind":..,("type":..,)"metadata":{"namespace":`, once per plan."""
        d = self.desired
        start: dict[str, object] = {"apiVersion": "v1", "kind": d.kind.value}
        if d.kind is SourceKind.SECRET:
            start["type"] = d.type
        return orjson.dumps(start)[:-1] + b',"metadata":{"namespace":'

    @functools.cached_property
    def tail(self) -> bytes:
        """`,"name":..,"labels":..,"annotations":..},` once per plan."""
        d = self.desired
        meta = {"name": d.name, "labels": dict(d.labels), "annotations": dict(d.annotations)}
        return b"," + orjson.dumps(meta)[1:] + b","
