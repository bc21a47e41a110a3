"""Parsing a ProjectionGrant into a `Grant`: the re-checks of its spec the reconcile relies on.

The CRD validates first; these checks cover what the controller depends on and grants stored
before a CRD rule existed. An invalid spec raises `InvalidGrant` (a terminal error), or, for the
cache, is recorded in a `GrantRecord` to be reported in the grant's status.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from projector.core.model import (
    DEFAULT_ON_REVOKE,
    DEFAULT_ON_SOURCE_DELETED,
    DEFAULT_SOURCE_KIND,
    GROUP,
    MAX_ANNOTATION_VALUE,
    PREFIX,
    Grant,
    GrantRecord,
    KeyMapping,
    LabelSelector,
    ObjectKey,
    OnRevoke,
    OnSourceDeleted,
    SourceKind,
    Uid,
    interned,
)
from projector.core.names import (
    is_label,
    is_label_value,
    is_qualified_name,
    is_secret_key,
    is_subdomain,
)
from projector.errors import InvalidGrant

_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def _strings(value: object, what: str, grant: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidGrant(grant, f"{what} must be a list of strings")
    return value


def parse_grant(obj: Mapping[str, Any]) -> Grant:
    """Parse a ProjectionGrant object; the CRD validates first, this re-checks what we rely on.

    Raises:
        InvalidGrant: the object cannot be projected as written (a terminal error).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name", ""))
    src = spec.get("source") or {}
    target = spec.get("target") or {}
    policy = spec.get("policy") or {}
    if not src.get("namespace") or not src.get("name"):
        raise InvalidGrant(name, "spec.source.namespace and spec.source.name are required")
    try:
        kind = SourceKind(src.get("kind", DEFAULT_SOURCE_KIND))
    except ValueError:
        raise InvalidGrant(name, "spec.source.kind must be Secret or ConfigMap") from None
    if not is_label(src["namespace"]) or not is_subdomain(src["name"]):
        raise InvalidGrant(name, f"spec.source must name a valid namespace and {kind.value}")
    keys = _parse_keys(spec.get("keys"), name)
    namespaces = frozenset(
        map(sys.intern, _strings(target.get("namespaces") or [], "namespaces", name))
    )
    sel = target.get("namespaceSelector")
    selector = None if sel is None else _parse_selector(sel, name)
    if not namespaces and selector is None:
        raise InvalidGrant(name, "target needs namespaces or namespaceSelector")
    target_name = target.get("name") or src["name"]
    if not is_subdomain(target_name):
        raise InvalidGrant(name, f"target.name {target_name!r} is not a DNS-1123 subdomain")
    for ns in namespaces:
        if not is_label(ns):
            raise InvalidGrant(name, f"target namespace {ns!r} is not a DNS-1123 label")
    labels, annotations = _parse_metadata(target, name)
    try:
        on_revoke = OnRevoke(policy.get("onRevoke", DEFAULT_ON_REVOKE))
        on_source_deleted = OnSourceDeleted(
            policy.get("onSourceDeleted", DEFAULT_ON_SOURCE_DELETED)
        )
    except ValueError as e:
        raise InvalidGrant(name, str(e)) from None
    return Grant(
        name=name,
        uid=Uid(str(meta.get("uid", ""))),
        generation=int(meta.get("generation", 0)),
        created=str(meta.get("creationTimestamp", "")),
        source=ObjectKey(sys.intern(src["namespace"]), sys.intern(src["name"]), kind),
        keys=keys,
        target_name=sys.intern(target_name),
        namespaces=namespaces,
        selector=selector,
        labels=labels,
        annotations=annotations,
        on_revoke=on_revoke,
        on_source_deleted=on_source_deleted,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _parse_keys(raw_keys: Any, name: str) -> tuple[KeyMapping, ...] | None:
    """spec.keys: None (every key), or at least one valid mapping with unique targets."""
    if raw_keys is None:
        return None
    if not isinstance(raw_keys, list) or not raw_keys:
        raise InvalidGrant(name, "keys, when given, must list at least one key")
    if not all(isinstance(k, dict) and k.get("from") for k in raw_keys):
        raise InvalidGrant(name, "every keys[] entry needs `from`")
    keys = tuple(KeyMapping(k["from"], k.get("to") or k["from"]) for k in raw_keys)
    for k in keys:
        for key in (k.src, k.dst):
            if not is_secret_key(key):
                raise InvalidGrant(name, f"invalid Secret key name {key!r}")
    if len({k.dst for k in keys}) != len(keys):
        raise InvalidGrant(name, "keys[].to must be unique")
    return keys


Pairs = tuple[tuple[str, str], ...]


def _parse_metadata(target: Mapping[str, Any], name: str) -> tuple[Pairs, Pairs]:
    """target.labels and target.annotations, sorted; keys projector reserves are refused."""
    labels = tuple(sorted((target.get("labels") or {}).items()))
    annotations = tuple(sorted((target.get("annotations") or {}).items()))
    for k, _ in labels + annotations:
        if not is_qualified_name(k):
            raise InvalidGrant(name, f"target metadata key {k!r} is not a qualified name")
        if k.startswith(PREFIX) or k.split("/")[0].endswith("." + GROUP):
            raise InvalidGrant(name, f"target metadata key {k!r} is reserved for projector")
    for k, v in labels:
        if not is_label_value(v):
            raise InvalidGrant(name, f"target label {k!r} has an invalid value")
    for k, v in annotations:
        if not isinstance(v, str) or len(v) > MAX_ANNOTATION_VALUE:
            raise InvalidGrant(
                name, f"target annotation {k!r}: at most {MAX_ANNOTATION_VALUE} characters"
            )
    return labels, annotations


def _parse_selector(sel: Any, grant: str) -> LabelSelector:
    """A namespaceSelector, refused when empty: an empty selector would select every namespace.

    The CRD refuses it too; this re-check covers grants stored before that rule existed.
    """
    if not isinstance(sel, Mapping):
        raise InvalidGrant(grant, "namespaceSelector must be an object")
    match_labels = sel.get("matchLabels") or {}
    raw = sel.get("matchExpressions") or ()
    if not match_labels and not raw:
        raise InvalidGrant(
            grant, "namespaceSelector needs at least one matchLabels or matchExpressions entry"
        )
    for k, v in match_labels.items():
        if not is_qualified_name(k) or not is_label_value(v):
            raise InvalidGrant(grant, f"namespaceSelector.matchLabels entry {k!r} is invalid")
    exprs = tuple(
        (e.get("key", ""), e.get("operator", ""), tuple(e.get("values") or ())) for e in raw
    )
    for key, op, values in exprs:
        if op not in _OPERATORS:
            raise InvalidGrant(grant, f"selector operators must be one of {sorted(_OPERATORS)}")
        if not is_qualified_name(key) or not all(is_label_value(v) for v in values):
            raise InvalidGrant(grant, f"namespaceSelector expression on {key!r} is invalid")
        if bool(values) != (op in ("In", "NotIn")):
            raise InvalidGrant(
                grant,
                "selector values must be non-empty for In and NotIn, "
                "and empty for Exists and DoesNotExist",
            )
    return LabelSelector(tuple(sorted(match_labels.items())), exprs)


def parse_grant_record(obj: Mapping[str, Any]) -> GrantRecord:
    """Parse a grant for the cache; an invalid spec is recorded, not raised, to be reported."""
    meta = obj.get("metadata") or {}
    try:
        grant: Grant | None = parse_grant(obj)
        invalid = None
    except InvalidGrant as e:
        grant, invalid = None, e.why
    return GrantRecord(
        name=str(meta.get("name", "")),
        uid=Uid(str(meta.get("uid", ""))),
        generation=int(meta.get("generation", 0)),
        grant=grant,
        invalid=invalid,
        status=interned(obj.get("status") or {}),
    )
