"""Builders for the pure core's values: defaults that make one working projection.

A grant `g` projects `src/hub` (every key, type Opaque, exported to `*`) into namespaces `a`
and `b`; tests override only what their case is about. Copies are built the way the informer
builds them, through `parse_copy` of a stored Secret (for our copies: the manifest the writer
sends, `Desired.manifest`), so `observed_hash` is what it would be in a cluster (type, data and
projector's own metadata only), and so is the ownership proof: the managedFields that say
projector's field manager wrote the grant-uid annotation. `simulate` applies a plan's writes the
way the writer would (an Update keeps what others added to the copy), to check convergence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from projector.core.desired import Desired, desired_copy
from projector.core.exports import Export
from projector.core.model import (
    GRANT_LABEL,
    GRANT_UID_ANNOTATION,
    Copy,
    Grant,
    KeyMapping,
    LabelSelector,
    Namespace,
    ObjectKey,
    OnRevoke,
    OnSourceDeleted,
    Source,
    SourceKind,
    Uid,
    parse_copy,
    parse_export_to,
    refused_source,
)
from projector.core.names import FIELD_MANAGER
from projector.core.plans import Action, Plan, Reason, Snapshot, SourceState
from tests.bed.kube import b64 as b64  # the unit tests take it from here

SRC_NS = "src"
SRC_NAME = "hub"
T0 = "2024-01-01T00:00:00Z"
T1 = "2024-06-01T00:00:00Z"
BY_HAND = "kubectl-client-side-apply"
"""The field manager of a Secret someone wrote with kubectl (say, copied from a real copy)."""


def make_grant(
    name: str = "g",
    *,
    uid: str | None = None,
    created: str = T0,
    generation: int = 1,
    source: tuple[str, str] = (SRC_NS, SRC_NAME),
    namespaces: Iterable[str] = ("a", "b"),
    selector: LabelSelector | Mapping[str, str] | None = None,
    keys: Iterable[tuple[str, str]] | None = None,
    target_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    on_revoke: OnRevoke = OnRevoke.DELETE,
    on_source_deleted: OnSourceDeleted = OnSourceDeleted.RETAIN,
    deleting: bool = False,
) -> Grant:
    if selector is not None and not isinstance(selector, LabelSelector):
        selector = LabelSelector(tuple(sorted(selector.items())))
    return Grant(
        name=name,
        uid=Uid(uid if uid is not None else f"uid-{name}"),
        generation=generation,
        created=created,
        source=ObjectKey(*source),
        keys=None if keys is None else tuple(KeyMapping(s, d) for s, d in keys),
        target_name=target_name or source[1],
        namespaces=frozenset(namespaces),
        selector=selector,
        labels=tuple(sorted((labels or {}).items())),
        annotations=tuple(sorted((annotations or {}).items())),
        on_revoke=on_revoke,
        on_source_deleted=on_source_deleted,
        deleting=deleting,
    )


def make_source(
    namespace: str = SRC_NS,
    name: str = SRC_NAME,
    *,
    data: Mapping[str, str] | None = None,
    type_: str = "Opaque",
    export_to: str | tuple[str, ...] = "*",
    export_keys: frozenset[str] | None = None,
    labelled: bool = True,
) -> Source:
    return Source(
        key=ObjectKey(namespace, name),
        uid=Uid(f"uid-secret-{namespace}-{name}"),
        type=type_,
        data=dict(data if data is not None else {"token": b64("t0"), "url": b64("http://hub")}),
        export_to=parse_export_to(export_to) if isinstance(export_to, str) else export_to,
        refused=refused_source({"type": type_}, SourceKind.SECRET),
        export_keys=export_keys,
        labelled=labelled,
    )


def make_ns(
    name: str, labels: Mapping[str, str] | None = None, *, terminating: bool = False
) -> Namespace:
    return Namespace(name=name, labels=dict(labels or {}), terminating=terminating)


def namespaces(*items: str | Namespace) -> dict[str, Namespace]:
    """Index namespaces by name; a bare string is an existing, unlabelled namespace."""
    out: dict[str, Namespace] = {}
    for item in items:
        ns = make_ns(item) if isinstance(item, str) else item
        out[ns.name] = ns
    return out


def desired_of(grant: Grant, source: Source) -> Desired:
    built = desired_copy(grant, source)
    assert isinstance(built, Desired), f"source lacks key {built!r}"
    return built


def stored_secret(
    namespace: str,
    name: str,
    *,
    type_: str = "Opaque",
    data: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    uid: str = "uid-secret",
    resource_version: str = "1",
    deleting: bool = False,
    immutable: bool = False,
    managers: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Any]:
    """A Secret as the API server returns it.

    `managers` maps a field manager to the annotation keys it owns (managedFields); each
    manager also owns the data, the type and the labels it is listed with.
    """
    meta: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "uid": uid,
        "resourceVersion": resource_version,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if managers:
        meta["managedFields"] = [
            managed_fields(manager, keys, labels=meta["labels"], data=data or {})
            for manager, keys in managers.items()
        ]
    if deleting:
        meta["deletionTimestamp"] = T1
    obj: dict[str, Any] = {"metadata": meta, "type": type_, "data": dict(data or {})}
    if immutable:
        obj["immutable"] = True
    return obj


def managed_fields(
    manager: str,
    annotations: Iterable[str],
    *,
    labels: Iterable[str] = (),
    data: Iterable[str] = (),
) -> dict[str, Any]:
    """One managedFields entry (an Update, FieldsV1) owning these keys."""
    meta: dict[str, Any] = {}
    if labels:
        meta["f:labels"] = {".": {}, **{f"f:{k}": {} for k in labels}}
    notes = list(annotations)
    if notes:
        meta["f:annotations"] = {".": {}, **{f"f:{k}": {} for k in notes}}
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": T0,
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:data": {f"f:{k}": {} for k in data},
            "f:metadata": meta,
            "f:type": {},
        },
    }


def _patched(base: Mapping[str, str], changes: Mapping[str, str | None] | None) -> dict[str, str]:
    out = dict(base)
    for k, v in (changes or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def copy_from(desired: Desired, namespace: str, **edits: Any) -> Copy:
    """The copy a writer stored from `desired` (its manifest), then optionally edited by someone.

    `edits` are `stored_manifest`'s: `labels`/`annotations` patch the stored metadata (a None
    value removes the key); the grant-uid annotation, whatever its value, was written by
    projector unless `uid_written_by` names another field manager (a mark written by hand).
    """
    return parse_copy(stored_manifest(desired.manifest(namespace), **edits))


def stored_manifest(
    manifest: Mapping[str, Any],
    *,
    name: str | None = None,
    data: Mapping[str, str] | None = None,
    type_: str | None = None,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
    deleting: bool = False,
    immutable: bool = False,
    resource_version: str = "7",
    uid_written_by: str = FIELD_MANAGER,
) -> dict[str, Any]:
    """A manifest the writer sent (with fieldManager=projector), as the API server then
    returns it; `labels`... are edits made since, and `uid_written_by` owns the grant-uid mark."""
    meta = manifest["metadata"]
    namespace = meta["namespace"]
    name = name or meta["name"]
    stored_notes = _patched(meta["annotations"], annotations)
    ours = [k for k in stored_notes if k != GRANT_UID_ANNOTATION]
    uid_mark = [GRANT_UID_ANNOTATION] if GRANT_UID_ANNOTATION in stored_notes else []
    managers: dict[str, list[str]] = {FIELD_MANAGER: ours}
    managers[uid_written_by] = managers.get(uid_written_by, []) + uid_mark
    return stored_secret(
        namespace,
        name,
        type_=type_ or manifest["type"],
        data=manifest["data"] if data is None else data,
        labels=_patched(meta["labels"], labels),
        annotations=stored_notes,
        uid=f"uid-copy-{namespace}-{name}",
        resource_version=resource_version,
        deleting=deleting,
        immutable=immutable,
        managers=managers,
    )


def foreign_secret(
    namespace: str,
    name: str = SRC_NAME,
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    type_: str = "Opaque",
    deleting: bool = False,
    immutable: bool = False,
) -> Copy:
    """A Secret that someone else wrote (with kubectl) at a place a grant may write."""
    return parse_copy(
        stored_secret(
            namespace,
            name,
            type_=type_,
            data={"password": b64("not-ours")},
            labels=labels,
            annotations=annotations,
            uid=f"uid-foreign-{namespace}-{name}",
            deleting=deleting,
            immutable=immutable,
            managers={BY_HAND: list(annotations or {})},
        )
    )


def claim(grant_name: str | None, grant_uid: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """The (labels, annotations) by which a Secret claims to belong to a grant."""
    labels = {} if grant_name is None else {GRANT_LABEL: grant_name}
    annotations = {} if grant_uid is None else {GRANT_UID_ANNOTATION: grant_uid}
    return labels, annotations


def make_snapshot(
    grant: Grant | None,
    source: Source | None,
    *,
    state: SourceState = SourceState.AVAILABLE,
    namespaces: Mapping[str, Namespace] | None = None,
    copies: Iterable[Copy] = (),
    extra_live: Iterable[str] = (),
    rivals: Iterable[Grant] = (),
    rival_sources: Mapping[ObjectKey, Source] | None = None,
    grant_name: str | None = None,
    exports: Iterable[Export] = (),
) -> Snapshot:
    """A snapshot; live grant uids are the grant's, the rivals' and `extra_live`."""
    rivals = tuple(rivals)
    live = {str(r.uid) for r in rivals} | set(extra_live)
    if grant is not None:
        live.add(grant.uid)
    if grant_name is None:
        assert grant is not None, "name the grant of a deleted-grant snapshot"
        grant_name = grant.name
    return Snapshot(
        grant_name=grant_name,
        grant=grant,
        source=source,
        source_state=state,
        namespaces=namespaces if namespaces is not None else {},
        copies={c.key: c for c in copies},
        live_grant_uids=frozenset(live),
        rivals=rivals,
        rival_sources=dict(rival_sources or {}),
        exports=_by_source(exports),
    )


def _by_source(exports: Iterable[Export]) -> dict[ObjectKey, tuple[Export, ...]]:
    out: dict[ObjectKey, tuple[Export, ...]] = {}
    for e in exports:
        out[e.source] = (*out.get(e.source, ()), e)
    return out


def make_export(
    to: tuple[str, ...] = ("*",),
    keys: frozenset[str] | None = None,
    *,
    name: str = "hub-token",
    namespace: str = SRC_NS,
    source: str = SRC_NAME,
    refused: str = "",
) -> Export:
    """A ProjectionExport of the default source (its namespace), to `to`, of `keys`."""
    return Export(
        namespace=namespace,
        name=name,
        uid=Uid(f"uid-export-{namespace}-{name}"),
        source=ObjectKey(namespace, source),
        keys=keys,
        to=to,
        refused=refused,
    )


def summary(p: Plan, target_name: str) -> dict[str, tuple[Action, Reason]]:
    """Steps by namespace (or `namespace/name` for a Secret other than the target name)."""
    out: dict[str, tuple[Action, Reason]] = {}
    for s in p.steps:
        key = s.namespace if s.name == target_name else f"{s.namespace}/{s.name}"
        assert key not in out, f"two steps for {key}"
        out[key] = (s.action, s.reason)
    return out


def simulate(snap: Snapshot, p: Plan) -> Snapshot:
    """The snapshot after the writer did a plan's writes.

    Like the writer: a Create or a Replace (delete, then create) stores `manifest(ns)`; an
    Update is a PUT of `manifest(ns, resourceVersion, keep=existing)`, which carries over the
    labels and annotations that others added to the copy.
    """
    copies = dict(snap.copies)
    for s in p.writes:
        key = ObjectKey(s.namespace, s.name)
        if s.action is Action.DELETE:
            copies.pop(key, None)
            continue
        assert p.desired is not None
        if s.action is Action.UPDATE:
            assert s.existing is not None
            manifest = p.desired.manifest(s.namespace, s.existing.resource_version, keep=s.existing)
        else:
            manifest = p.desired.manifest(s.namespace)
        copies[key] = parse_copy(stored_manifest(manifest, resource_version="8"))
    return replace(snap, copies=copies)
