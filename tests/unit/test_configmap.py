"""ConfigMap grants in the pure core: the copy is a ConfigMap, and the kind is part of identity.

A grant of `spec.source.kind: ConfigMap` builds a ConfigMap copy (data and binaryData, no
type), and its plan only ever sees places of its own kind: a Secret of the same name in the
same namespace is neither its copy nor in its way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from projector.cache.store import Store
from projector.core.desired import desired_copy
from projector.core.grantspec import parse_grant
from projector.core.model import (
    GRANT_UID_ANNOTATION,
    Copy,
    Grant,
    ObjectKey,
    OnRevoke,
    Source,
    SourceKind,
    content_hash,
    parse_copy,
    parse_source,
)
from projector.core.names import FIELD_MANAGER
from projector.core.plans import Action, Reason
from projector.core.reconcile import plan
from projector.errors import InvalidGrant
from tests.unit.factories import (
    SRC_NAME,
    SRC_NS,
    desired_of,
    foreign_secret,
    make_grant,
    make_snapshot,
    make_source,
    managed_fields,
    namespaces,
    summary,
)
from tests.unit.fakeapi import FakeApi
from tests.unit.test_store import Woken, copy_obj, grant_obj, ns_obj, pop, put, source_obj

CM = SourceKind.CONFIG_MAP


def cm_grant(**kw: Any) -> Grant:
    g = make_grant(**kw)
    return replace(g, source=ObjectKey(g.source.namespace, g.source.name, CM))


def cm_source(data: dict[str, str] | None = None, binary: dict[str, str] | None = None) -> Source:
    s = make_source(data=data if data is not None else {"url": "http://hub:8081"})
    return replace(s, key=ObjectKey(SRC_NS, SRC_NAME, CM), type="", binary_data=binary or {})


def stored(manifest: dict[str, Any], kind: SourceKind = CM) -> Copy:
    """What the API server returns after a write of `manifest` by projector."""
    meta = dict(manifest["metadata"])
    meta |= {"uid": "uid-copy", "resourceVersion": "7"}
    meta["managedFields"] = [managed_fields(FIELD_MANAGER, [GRANT_UID_ANNOTATION])]
    return parse_copy({**manifest, "metadata": meta}, kind)


def test_parse_grant_kind_defaults_to_secret_and_accepts_configmap() -> None:
    base = {
        "metadata": {"name": "g", "uid": "u"},
        "spec": {"source": {"namespace": "src", "name": "hub"}, "target": {"namespaces": ["a"]}},
    }
    assert parse_grant(base).kind is SourceKind.SECRET
    base["spec"]["source"]["kind"] = "ConfigMap"
    g = parse_grant(base)
    assert g.kind is CM and g.source == ObjectKey("src", "hub", CM)
    base["spec"]["source"]["kind"] = "Pod"
    with pytest.raises(InvalidGrant, match="Secret or ConfigMap"):
        parse_grant(base)


def test_a_configmap_copy_is_a_configmap_with_data_and_binary_data() -> None:
    d = desired_of(cm_grant(), cm_source({"url": "http://hub"}, {"logo": "iVBORw0K"}))
    m = d.manifest("a")
    assert m["kind"] == "ConfigMap" and "type" not in m
    assert m["data"] == {"url": "http://hub"} and m["binaryData"] == {"logo": "iVBORw0K"}
    copy = stored(m)
    assert copy.key == ObjectKey("a", SRC_NAME, CM) and d.in_sync(copy)
    # drift in binaryData is drift too
    edited = stored({**m, "binaryData": {"logo": "AAAA"}})
    assert not d.in_sync(edited)


def test_a_secret_copy_is_unchanged_by_configmaps() -> None:
    """A Secret's copy has no binaryData, and its hash is the formula it always had (so an
    upgrade rewrites no Secret copy)."""
    d = desired_of(make_grant(), make_source())
    m = d.manifest("a")
    assert m["kind"] == "Secret" and "binaryData" not in m and m["type"] == "Opaque"
    data, labels, notes = {"k": "v"}, {"l": "1"}, {"n": "2"}
    blob = json.dumps(
        ["Opaque", sorted(data.items()), sorted(labels.items()), sorted(notes.items())],
        separators=(",", ":"),
    )
    before = "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
    assert content_hash("Opaque", data, labels, notes) == before
    assert content_hash("", data, labels, notes, {}) != before


def test_granted_keys_come_from_data_or_binary_data() -> None:
    g = cm_grant(keys=[("url", "hub-url"), ("logo", "logo")])
    d = desired_of(g, cm_source({"url": "http://hub", "other": "x"}, {"logo": "iVBO"}))
    assert dict(d.data) == {"hub-url": "http://hub"} and dict(d.binary_data) == {"logo": "iVBO"}
    assert desired_copy(cm_grant(keys=[("nope", "nope")]), cm_source()) == "nope"


def test_configmap_parsers_key_by_kind() -> None:
    obj = {"metadata": {"namespace": "src", "name": "hub"}, "data": {"a": "1"}}
    assert parse_source(obj, CM).key == ObjectKey("src", "hub", CM)
    assert parse_source(obj).key == ObjectKey("src", "hub")
    assert parse_source(obj, CM).type == "" and parse_copy(obj, CM).type == ""
    assert ObjectKey("src", "hub") != ObjectKey("src", "hub", CM)


def test_a_secret_of_the_same_name_is_neither_the_copy_nor_in_the_way() -> None:
    """Same name, same namespace, other kind: the ConfigMap grant creates its copy regardless."""
    grant, source = cm_grant(), cm_source()
    secret_there = foreign_secret("a")  # an unowned Secret named like the copy
    snap = make_snapshot(grant, source, namespaces=namespaces("a", "b"), copies=[secret_there])
    assert summary(plan(snap), SRC_NAME) == {
        "a": (Action.CREATE, Reason.PROJECTED),
        "b": (Action.CREATE, Reason.PROJECTED),
    }


def test_an_unowned_configmap_in_the_place_is_a_conflict() -> None:
    grant, source = cm_grant(), cm_source()
    theirs = parse_copy({"metadata": {"namespace": "a", "name": SRC_NAME, "uid": "x"}}, CM)
    snap = make_snapshot(grant, source, namespaces=namespaces("a", "b"), copies=[theirs])
    p = plan(snap)
    assert summary(p, SRC_NAME)["a"] == (Action.NOOP, Reason.CONFLICT)
    step = next(s for s in p.steps if s.namespace == "a")
    assert step.message == "a ConfigMap of that name exists and is not owned by this grant"


def test_revoking_a_configmap_grant_deletes_its_configmaps_only() -> None:
    """A deleted grant's plan deletes the copies of its own kind that it holds."""
    grant, source = cm_grant(on_revoke=OnRevoke.DELETE), cm_source()
    mine = stored(desired_of(grant, source).manifest("a"))
    gone = replace(grant, deleting=True)
    snap = make_snapshot(gone, source, namespaces=namespaces("a"), copies=[mine])
    steps = plan(snap).steps
    assert [(s.action, s.existing.key if s.existing else None) for s in steps] == [
        (Action.DELETE, ObjectKey("a", SRC_NAME, CM))
    ]


def test_the_store_keeps_a_secret_and_a_configmap_of_one_name_apart() -> None:
    """One name, one namespace, two kinds: two sources, two copies, and no rivalry.

    Grant `s` projects Secret src/x and grant `c` ConfigMap src/x, both as `x` into `a`.
    """
    store = Store(FakeApi())
    secret_grant = grant_obj("s", source=("src", "x"), namespaces=["a"])
    cm = grant_obj("c", source=("src", "x"), namespaces=["a"])
    cm["spec"]["source"]["kind"] = "ConfigMap"
    for obj in (secret_grant, cm):
        put(store.grants, obj)
    put(store.namespaces, ns_obj("a"))
    put(store.sources, source_obj("src", "x"))
    put(store.config_sources, source_obj("src", "x"))
    put(store.copies, copy_obj("a", "x", label="s", uid="uid-s"))
    put(store.config_copies, copy_obj("a", "x", label="c", uid="uid-c"))
    for name, kind in (("s", SourceKind.SECRET), ("c", CM)):
        snap = store.snapshot(name)
        assert snap.rivals == ()  # no rival: the other grant writes another kind
        assert snap.source is not None and snap.source.key == ObjectKey("src", "x", kind)
        assert list(snap.copies) == [ObjectKey("a", "x", kind)]
        assert [s.action for s in plan(snap).steps] == [Action.UPDATE]  # its own copy
    # Deleting one grant's source wakes that grant only.
    woken = Woken(store)
    pop(store.config_sources, source_obj("src", "x"))
    assert woken.take() == {"c"}
