"""The store: which grants wake up for which change, and the snapshots it hands out."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import pytest

from projector.cache import probe
from projector.cache.caches import Cache, Kind
from projector.cache.store import Echo, Store
from projector.core.desired import Desired, desired_copy
from projector.core.kinds import GRANTS, NAMESPACES, SECRETS, Obj
from projector.core.model import (
    EXPORT_LABEL,
    EXPORT_TO_ANNOTATION,
    GRANT_LABEL,
    GRANT_UID_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ObjectKey,
)
from projector.core.plans import Snapshot, SourceState
from projector.core.reconcile import plan
from projector.errors import ServerError
from tests.unit.factories import managed_fields
from tests.unit.fakeapi import FakeApi


def grant_obj(grant_name: str, source: tuple[str, str] = ("src", "s"), **target: Any) -> Obj:
    name = grant_name
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": f"2026-01-01T00:00:0{len(name) % 10}Z",
        },
        "spec": {"source": {"namespace": source[0], "name": source[1]}, "target": target},
    }


def source_obj(ns: str, name: str, export_to: str = "*", exported: bool = True) -> Obj:
    labels = {EXPORT_LABEL: "true"} if exported else {}
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{ns}-{name}",
            "labels": labels,
            "annotations": {EXPORT_TO_ANNOTATION: export_to},
        },
        "data": {"k": "dg=="},
    }


def ns_obj(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": labels}}


def copy_obj(ns: str, name: str, *, label: str | None = None, uid: str | None = None) -> Obj:
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE} | ({GRANT_LABEL: label} if label else {})
    notes = {GRANT_UID_ANNOTATION: uid} if uid else {}
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-copy-{ns}-{name}",
            "resourceVersion": "1",
            "labels": labels,
            "annotations": notes,
            "managedFields": [managed_fields("projector", notes)],
        },
        "data": {},
    }


def put(cache: Cache[Any, Any], obj: Obj) -> None:
    cache.put(cache.spec.key(obj), cache.spec.parse(obj))


def pop(cache: Cache[Any, Any], obj: Obj) -> None:
    cache.pop(cache.spec.key(obj))


class Woken:
    """The store's listener: every (kind, names) it was told, drained by `take`."""

    def __init__(self, store: Store, echo: Echo | None = None) -> None:
        self.seen: list[tuple[Kind, set[str]]] = []
        store.listen(lambda kind, names: self.seen.append((kind, set(names))), echo=echo)

    def take(self) -> set[str]:
        names = set().union(*(n for _, n in self.seen)) if self.seen else set()
        self.seen.clear()
        return names


@pytest.fixture
def store() -> Store:
    return Store(FakeApi())


def test_grant_change_wakes_itself_and_rivals_for_the_same_copy(store: Store) -> None:
    woken = Woken(store)
    put(store.grants, grant_obj("a", namespaces=["x"], name="shared"))
    assert woken.take() == {"a"}
    put(store.grants, grant_obj("b", namespaces=["y"], name="shared"))
    assert woken.take() == {"a", "b"}
    put(store.grants, grant_obj("c", namespaces=["y"], name="other"))
    assert woken.take() == {"c"}


def test_status_only_change_of_a_grant_wakes_nobody(store: Store) -> None:
    woken = Woken(store)
    obj = grant_obj("a", namespaces=["x"])
    put(store.grants, obj)
    woken.take()
    put(store.grants, {**obj, "status": {"observedGeneration": 1}})
    assert woken.take() == set()
    record = store.grants.get("a")
    assert record is not None and record.status == {"observedGeneration": 1}  # still stored


def test_source_change_wakes_the_grants_that_project_it(store: Store) -> None:
    put(store.grants, grant_obj("a", ("p", "s"), namespaces=["x"]))
    put(store.grants, grant_obj("b", ("q", "s"), namespaces=["x"]))
    woken = Woken(store)
    put(store.sources, source_obj("p", "s"))
    assert woken.take() == {"a"}
    pop(store.sources, source_obj("p", "s"))
    assert woken.take() == {"a"}
    put(store.sources, source_obj("r", "s"))
    assert woken.take() == set()


def test_namespace_change_wakes_listed_and_selector_grants_before_and_after(store: Store) -> None:
    put(store.grants, grant_obj("listed", namespaces=["ns"]))
    put(store.grants, grant_obj("sel", namespaceSelector={"matchLabels": {"pack": "x"}}))
    put(store.grants, grant_obj("other", namespaceSelector={"matchLabels": {"pack": "y"}}))
    woken = Woken(store)
    put(store.namespaces, ns_obj("ns"))
    assert woken.take() == {"listed"}
    put(store.namespaces, ns_obj("ns", pack="x"))
    assert woken.take() == {"listed", "sel"}
    put(store.namespaces, ns_obj("ns"))
    assert woken.take() == {"listed", "sel"}  # relabelled out


def test_copy_change_wakes_its_label_and_its_uid_owner_and_a_deletion_its_rivals(
    store: Store,
) -> None:
    put(store.grants, grant_obj("a", namespaces=["x"], name="s"))
    put(store.grants, grant_obj("rival", namespaces=["y"], name="s"))
    woken = Woken(store)
    put(store.copies, copy_obj("x", "t", label="a"))
    assert woken.take() == {"a"}
    put(store.copies, copy_obj("x", "u", uid="uid-a"))
    assert woken.take() == {"a"}
    put(store.copies, copy_obj("x", "v", label="gone"))
    assert woken.take() == {"gone"}  # an orphan wakes the name it carries
    put(store.copies, copy_obj("x", "w"))
    assert woken.take() == set()
    pop(store.copies, copy_obj("y", "s", uid="uid-rival"))
    assert woken.take() == set()  # nothing was there
    put(store.copies, copy_obj("y", "s", uid="uid-rival"))
    woken.take()
    pop(store.copies, copy_obj("y", "s", uid="uid-rival"))
    assert woken.take() == {"a", "rival"}  # a freed place: every grant aiming at it


def test_deleted_grant_leaves_no_trace(store: Store) -> None:
    obj = grant_obj("a", ("p", "s"), namespaces=["ns"])
    put(store.grants, obj)
    pop(store.grants, obj)
    woken = Woken(store)
    put(store.sources, source_obj("p", "s"))
    put(store.namespaces, ns_obj("ns"))
    assert woken.take() == set()
    assert store._live() == frozenset()


async def test_invalid_grant_is_live_but_not_indexed(store: Store) -> None:
    bad = grant_obj("bad", ("p", "s"))  # no namespaces, no selector
    put(store.grants, bad)
    record = store.grants.get("bad")
    assert record is not None and record.grant is None and record.invalid
    woken = Woken(store)
    put(store.sources, source_obj("p", "s"))
    assert woken.take() == set()
    snap = await probe.snapshot(store, "bad")
    assert snap.live_grant_uids == {"uid-bad"}  # its copies are no orphans: nothing revoked
    assert snap.record == record


async def test_snapshot_holds_what_the_grant_touches_and_never_changes_after(store: Store) -> None:
    for obj in (ns_obj("a"), ns_obj("b", pack="x"), ns_obj("c"), ns_obj("src")):
        put(store.namespaces, obj)
    put(
        store.grants,
        grant_obj("g", namespaces=["a"], namespaceSelector={"matchLabels": {"pack": "x"}}),
    )
    put(store.sources, source_obj("src", "s"))
    at_target = copy_obj("c", "s")  # another's Secret at the target name: a conflict to see
    labelled = copy_obj("c", "old-name", label="g")
    elsewhere = copy_obj("c", "unrelated")
    for obj in (at_target, labelled, elsewhere):
        put(store.copies, obj)
    snap = await probe.snapshot(store, "g")
    assert snap.source_state is SourceState.AVAILABLE
    assert set(snap.namespaces) == {"a", "b"}
    assert set(snap.copies) == {ObjectKey("c", "s"), ObjectKey("c", "old-name")}
    before = values(snap)
    put(store.namespaces, ns_obj("d", pack="x"))
    pop(store.copies, labelled)
    put(store.copies, copy_obj("a", "s", uid="uid-g"))
    assert values(snap) == before
    assert set(snap.namespaces) == {"a", "b"} and ObjectKey("c", "old-name") in snap.copies
    with pytest.raises(TypeError):
        snap.namespaces["x"] = snap.namespaces["a"]


def values(snap: Snapshot) -> dict[str, Any]:
    """A deep copy of everything a snapshot holds, sharing no object with it."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(snap):
        v = getattr(snap, f.name)
        out[f.name] = (
            dict(v) if isinstance(v, Mapping) else set(v) if isinstance(v, AbstractSet) else v
        )
    return copy.deepcopy(out)


async def test_a_store_loaded_once_gives_the_snapshot_the_running_store_gives() -> None:
    api = FakeApi()
    objs = [
        (NAMESPACES, ns_obj("a")),
        (NAMESPACES, ns_obj("b", pack="x")),
        (
            GRANTS,
            grant_obj("g", namespaces=["a"], namespaceSelector={"matchLabels": {"pack": "x"}}),
        ),
        (GRANTS, grant_obj("rival", namespaces=["b"], name="s")),
        (SECRETS, source_obj("src", "s")),
        (SECRETS, source_obj("src", "private", exported=False)),
        (SECRETS, copy_obj("a", "s", uid="uid-g")),
        (SECRETS, copy_obj("b", "s", uid="uid-rival")),
    ]
    for res, obj in objs:
        api.add(res, obj)
    loaded = Store(api)
    await loaded.load()
    assert loaded.synced() and loaded.healthy()
    live = Store(api)  # filled one event at a time, in another order, as informers would
    for cache in reversed(live.caches):
        objs_of_kind, _ = await api.list(
            cache.spec.resource, label_selector=cache.spec.label_selector
        )
        for obj in objs_of_kind:
            put(cache, obj)
    assert len(loaded.sources) == 1  # the private Secret is never cached
    one, two = await probe.snapshot(loaded, "g"), await probe.snapshot(live, "g")
    assert one == two
    assert plan(one) == plan(two)


@pytest.mark.parametrize(
    ("stored", "error", "state"),
    [
        pytest.param(None, None, SourceState.MISSING, id="404-is-missing"),
        pytest.param(
            source_obj("src", "s", exported=False), None, SourceState.NOT_EXPORTED, id="unlabelled"
        ),
        pytest.param(
            source_obj("src", "s"), None, SourceState.UNKNOWN, id="exported-not-cached-yet"
        ),
        pytest.param(
            None, ServerError(503, "ServiceUnavailable"), SourceState.UNKNOWN, id="5xx-unknown"
        ),
        pytest.param(
            None, ServerError(0, "ReadTimeout"), SourceState.UNKNOWN, id="timeout-unknown"
        ),
    ],
)
async def test_a_source_absent_from_the_cache_is_probed(
    stored: Obj | None, error: ServerError | None, state: SourceState
) -> None:
    api = FakeApi()
    if stored is not None:
        api.add(SECRETS, stored)
    if error is not None:
        api.fail("GET", error)
    store = Store(api)
    put(store.grants, grant_obj("g", namespaces=["a"]))
    snap = await probe.snapshot(store, "g")
    assert (snap.source, snap.source_state) == (None, state)
    assert api.calls == [("GET", "secrets", "s")]


def test_the_echo_of_our_own_write_wakes_nobody_but_drift_does(store: Store) -> None:
    grant = grant_obj("g", namespaces=["a"])
    put(store.grants, grant)
    put(store.sources, source_obj("src", "s"))
    record = store.grants.get("g")
    source = store.sources.get(ObjectKey("src", "s"))
    assert record is not None and record.grant is not None and source is not None
    desired = desired_copy(record.grant, source)
    assert isinstance(desired, Desired)
    wanted = {"g": desired}  # the controller's memory of what each grant last planned
    woken = Woken(store, echo=lambda n, c: n in wanted and wanted[n].in_sync(c))
    written = desired.manifest("a")
    written["metadata"] |= {  # type: ignore[operator]
        "uid": "u1",
        "resourceVersion": "5",
        "managedFields": [managed_fields("projector", desired.annotations)],
    }
    put(store.copies, written)
    assert woken.take() == set()  # our own write's echo
    drifted = {**written, "data": {**desired.data, "k": "ZHJpZnQ="}}
    put(store.copies, drifted)
    assert woken.take() == {"g"}  # someone else's edit
    del wanted["g"]
    put(store.copies, written)
    assert woken.take() == {"g"}  # nothing recorded: every event is news


async def test_a_one_shot_load_skips_an_unparseable_object_like_an_informer() -> None:
    api = FakeApi()
    api.add(NAMESPACES, ns_obj("a"))
    api.objects[NAMESPACES.plural, "", "broken"] = {"metadata": {"resourceVersion": "1"}}
    store = Store(api)
    await store.load()
    assert list(store.namespaces) == ["a"]
    assert store.synced()


async def test_an_exported_source_no_grant_names_is_cached_without_its_data() -> None:
    """A tenant's exported Secrets cost their metadata; a grant that comes to name one has its
    data read once, and the data is dropped again when no grant names it (DESIGN §3)."""
    api = FakeApi()
    obj = source_obj("src", "s")
    api.add(SECRETS, obj)
    store = Store(api)
    put(store.sources, obj)
    cached = store.sources.get(ObjectKey("src", "s"))
    assert cached is not None and cached.withheld and cached.data == {}
    assert cached.exports_to("a")  # its consent is still known, for explain and rivals

    put(store.grants, grant_obj("g", namespaces=["a"]))
    assert store.snapshot("g").source is None  # withheld is not content: never planned on
    snap = await probe.snapshot(store, "g")
    assert snap.source_state is SourceState.AVAILABLE
    assert snap.source is not None and dict(snap.source.data) == {"k": "dg=="}
    assert api.calls == [("GET", "secrets", "s")]  # a whole read, once
    put(store.sources, obj)  # later events are parsed whole: the grant names it
    assert (await probe.snapshot(store, "g")).source == snap.source
    assert len(api.calls) == 1

    pop(store.grants, grant_obj("g", namespaces=["a"]))
    cached = store.sources.get(ObjectKey("src", "s"))
    assert cached is not None and cached.withheld and cached.data == {}


async def test_a_fill_never_replaces_content_the_informer_delivered() -> None:
    store = Store(FakeApi())
    put(store.grants, grant_obj("g", namespaces=["a"]))
    newer = source_obj("src", "s") | {"data": {"k": "bmV3"}}
    put(store.sources, newer)
    older = store.sources.spec.parse(source_obj("src", "s"))
    assert not store.fill(older)
    cached = store.sources.get(ObjectKey("src", "s"))
    assert cached is not None and dict(cached.data) == {"k": "bmV3"}
