"""Which grants wake up for which change: the indexes of projector.triggers."""

from __future__ import annotations

from typing import Any

from projector.model import (
    GRANT_LABEL,
    GRANT_UID_ANNOTATION,
    Copy,
    Namespace,
    ObjectKey,
    Source,
    Uid,
    parse_grant_record,
)
from projector.triggers import Triggers


def grant(grant_name: str, **target: Any) -> Any:
    name = grant_name
    src = target.pop("source", ("src", "s"))
    return parse_grant_record(
        {
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "generation": 1,
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"source": {"namespace": src[0], "name": src[1]}, "target": target},
        }
    )


def source(ns: str, name: str) -> Source:
    return Source(ObjectKey(ns, name), Uid("u"), "Opaque", {}, ("*",))


def copy(ns: str, name: str, *, label: str | None = None, uid: str | None = None) -> Copy:
    return Copy(
        ObjectKey(ns, name),
        Uid("c"),
        "1",
        "Opaque",
        {GRANT_LABEL: label} if label else {},
        {GRANT_UID_ANNOTATION: uid} if uid else {},
        "sha256:x",
    )


def test_grant_change_wakes_itself_and_rivals_for_the_same_copy() -> None:
    t = Triggers()
    assert t.grant_changed(None, grant("a", namespaces=["x"], name="shared")) == {"a"}
    assert t.grant_changed(None, grant("b", namespaces=["y"], name="shared")) == {"a", "b"}
    assert t.grant_changed(None, grant("c", namespaces=["y"], name="other")) == {"c"}
    assert {g.name for g in t.rivals(grant("a", namespaces=["x"], name="shared").grant)} == {"b"}


def test_source_change_wakes_the_grants_that_project_it() -> None:
    t = Triggers()
    t.grant_changed(None, grant("a", namespaces=["x"], source=("p", "s")))
    t.grant_changed(None, grant("b", namespaces=["x"], source=("q", "s")))
    assert t.source_changed(None, source("p", "s")) == {"a"}
    assert t.source_changed(source("q", "s"), None) == {"b"}
    assert t.source_changed(None, source("r", "s")) == set()


def test_namespace_change_wakes_listed_and_selector_grants_before_and_after() -> None:
    t = Triggers()
    t.grant_changed(None, grant("listed", namespaces=["ns"]))
    t.grant_changed(None, grant("sel", namespaceSelector={"matchLabels": {"pack": "x"}}))
    t.grant_changed(None, grant("other", namespaceSelector={"matchLabels": {"pack": "y"}}))
    plain, labelled = Namespace("ns"), Namespace("ns", {"pack": "x"})
    assert t.namespace_changed(None, plain) == {"listed"}
    assert t.namespace_changed(plain, labelled) == {"listed", "sel"}
    assert t.namespace_changed(labelled, plain) == {"listed", "sel"}  # relabelled out


def test_copy_change_wakes_its_label_and_its_uid_owner() -> None:
    t = Triggers()
    t.grant_changed(None, grant("a", namespaces=["x"]))
    assert t.copy_changed(None, copy("x", "s", label="a")) == {"a"}
    assert t.copy_changed(None, copy("x", "s", uid="uid-a")) == {"a"}
    assert t.copy_changed(None, copy("x", "s", label="gone")) == {"gone"}  # orphan: its name
    assert t.copy_changed(None, copy("x", "s")) == set()


def test_deleted_grant_leaves_no_trace_in_the_indexes() -> None:
    t = Triggers()
    rec = grant("a", namespaces=["ns"], source=("p", "s"))
    t.grant_changed(None, rec)
    assert t.live_uids() == {"uid-a"}
    assert t.grant_changed(rec, None) == {"a"}
    assert t.live_uids() == frozenset()
    assert t.source_changed(None, source("p", "s")) == set()
    assert t.namespace_changed(None, Namespace("ns")) == set()
    assert list(t.grant_names()) == []


def test_invalid_grant_is_live_but_not_indexed() -> None:
    t = Triggers()
    bad = parse_grant_record(
        {
            "metadata": {"name": "bad", "uid": "uid-bad"},
            "spec": {"source": {"namespace": "p", "name": "s"}, "target": {}},
        }
    )
    assert bad.grant is None and bad.invalid
    assert t.grant_changed(None, bad) == {"bad"}
    assert t.live_uids() == {"uid-bad"}  # its copies are not orphans: nothing is revoked
    assert list(t.grant_names()) == []
