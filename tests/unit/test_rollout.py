"""Opt-in rollouts: the pure decision (table + properties), progress, the cache filter, the edge.

The edge test drives `Rollouts` over the in-memory API double; the real API server and the
real node prove the same rules in tests/integration/test_rollout.py and tests/node/.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from projector import config
from projector.cache.store import Store
from projector.client.api import APPLY_PATCH, Request
from projector.control.queue import WorkQueue
from projector.control.recorder import Recorder
from projector.control.writer import Writer
from projector.core.kinds import DEPLOYMENTS, EVENTS, Obj
from projector.core.model import GRANT_LABEL, GRANT_UID_ANNOTATION, HASH_ANNOTATION, GrantRecord
from projector.rollout.decide import (
    MAX_ROLLOUT_ON_ENTRIES,
    MAX_ROLLOUT_ON_LENGTH,
    ROLLOUT_ON,
    Decision,
    Ref,
    Workload,
    WorkloadKind,
    asked_for,
    decide,
    manifest,
    parser,
    progressing,
    rollout_on,
    seen_key,
    stamp_key,
    stamp_of,
)
from projector.rollout.wing import OptedIn, Rollouts, spec
from projector.telemetry.metrics import Metrics
from tests.unit.factories import copy_from, desired_of, make_grant, make_source
from tests.unit.fakeapi import FakeApi

D = WorkloadKind.DEPLOYMENT
REF = Ref(D, "app", "web")


def workload(
    copies: tuple[str, ...] = ("db",),
    *,
    stamps: dict[str, str] | None = None,
    seen: dict[str, str] | None = None,
    busy: bool = False,
) -> Workload:
    return Workload(
        REF,
        "uid-web",
        copies,
        tuple(sorted((stamps or {}).items())),
        tuple(sorted((seen or {}).items())),
        busy,
    )


S, B = stamp_key("db"), seen_key("db")


@pytest.mark.parametrize(
    ("w", "hashes", "stamps", "seen", "rolled", "held"),
    [
        pytest.param(workload(), {"db": "h1"}, {}, {B: "h1"}, (), (), id="first-sight-baseline"),
        pytest.param(workload(seen={B: "h1"}), {"db": "h1"}, {}, {B: "h1"}, (), (), id="baseline"),
        pytest.param(
            workload(stamps={S: "h1"}, seen={B: "h0"}),
            {"db": "h1"},
            {S: "h1"},
            {B: "h0"},
            (),
            (),
            id="stamped-same",
        ),
        pytest.param(
            workload(seen={B: "h1"}),
            {"db": "h2"},
            {S: "h2"},
            {B: "h2"},
            ("db",),
            (),
            id="changed-since-baseline",
        ),
        pytest.param(
            workload(stamps={S: "h1"}, seen={B: "h1"}),
            {"db": "h2"},
            {S: "h2"},
            {B: "h2"},
            ("db",),
            (),
            id="changed-since-stamp",
        ),
        pytest.param(
            workload(stamps={S: "h1"}, seen={B: "h1"}, busy=True),
            {"db": "h2"},
            {S: "h1"},
            {B: "h1"},
            (),
            ("db",),
            id="held-while-progressing",
        ),
        pytest.param(
            workload(busy=True), {"db": "h1"}, {}, {B: "h1"}, (), (), id="baseline-while-busy"
        ),
        pytest.param(
            workload(stamps={S: "h1"}, seen={B: "h1"}),
            {},
            {S: "h1"},
            {B: "h1"},
            (),
            (),
            id="not-ours-or-gone-left-alone",
        ),
        pytest.param(
            workload(("db", "oidc"), stamps={S: "h1", stamp_key("old"): "x"}, seen={B: "h1"}),
            {"db": "h1", "oidc": "o1"},
            {S: "h1", stamp_key("old"): "x"},
            {B: "h1", seen_key("oidc"): "o1"},
            (),
            (),
            id="stamps-of-copies-no-longer-named-kept",
        ),
    ],
)
def test_decide(
    w: Workload,
    hashes: dict[str, str],
    stamps: dict[str, str],
    seen: dict[str, str],
    rolled: tuple[str, ...],
    held: tuple[str, ...],
) -> None:
    d = decide(w, hashes)
    assert dict(d.stamps) == stamps and dict(d.seen) == seen
    assert d.rolled == rolled and d.held == held


def test_no_copy_name_makes_a_stamp_key_that_is_the_opt_in() -> None:
    """A copy named `on` would stamp `rollout-<copy>` = rollout-on: the user's opt-in."""
    assert stamp_key("on") != ROLLOUT_ON and stamp_key("on").startswith(ROLLOUT_ON + "-")
    assert len(stamp_key("on").split("/", 1)[1]) <= 63
    assert stamp_key("on-x") == ROLLOUT_ON + "-x" and stamp_key("one") == ROLLOUT_ON + "e"


def test_keys_of_long_copy_names_fit_an_annotation_and_stay_distinct() -> None:
    a, b = "x" * 250 + "a", "x" * 250 + "b"
    for key in (stamp_key(a), stamp_key(b), seen_key(a), seen_key(b)):
        assert len(key.split("/", 1)[1]) <= 63 and key[-1].isalnum()
    assert stamp_key(a) != stamp_key(b) and seen_key(a) != seen_key(b)
    assert stamp_key("jupyterhub-contract") == "projector.nebari.dev/rollout-jupyterhub-contract"


def test_the_apply_body_carries_only_projectors_annotations() -> None:
    w = workload(seen={B: "h1"})
    body = manifest(w, decide(w, {"db": "h2"}))
    assert body == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "app", "annotations": {B: "h2"}},
        "spec": {"template": {"metadata": {"annotations": {S: "h2"}}}},
    }


names = st.sampled_from(["db", "oidc", "hub", "x" * 80])
hashes_st = st.dictionaries(names, st.sampled_from(["h1", "h2", "h3"]), max_size=4)
marks = st.dictionaries(names, st.sampled_from(["h1", "h2", "h3"]), max_size=4)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    copies = tuple(draw(st.lists(names, unique=True, max_size=4)))
    stamps = {stamp_key(c): h for c, h in draw(marks).items()}
    seen = {seen_key(c): h for c, h in draw(marks).items()}
    return workload(copies, stamps=stamps, seen=seen, busy=draw(st.booleans()))


def applied(w: Workload, d: Decision, *, busy: bool) -> Workload:
    return Workload(w.ref, w.uid, w.copies, d.stamps, d.seen, busy)


@given(workloads(), hashes_st, st.booleans())
def test_no_content_change_means_no_rollout(
    w: Workload, hashes: dict[str, str], busy: bool
) -> None:
    """A restart, failover, resync or relist decides again on the same hashes: nothing rolls."""
    first = decide(w, hashes)
    again = decide(applied(w, first, busy=busy), hashes)
    # only what the first decision held back (a rollout was progressing) may go out later
    assert set(again.rolled) <= set(first.held)
    if not first.held:
        assert not again.needed(applied(w, first, busy=busy))
    # and only a copy whose hash differs from what its pods were started with ever rolls
    for c in first.rolled:
        started = dict(w.stamps).get(stamp_key(c)) or dict(w.seen).get(seen_key(c))
        assert started is not None and started != hashes[c] and not w.busy


@given(workloads(), hashes_st)
def test_no_stamp_is_ever_dropped_and_unnamed_copies_are_untouched(
    w: Workload, hashes: dict[str, str]
) -> None:
    d = decide(w, hashes)
    assert set(dict(w.stamps)) <= set(dict(d.stamps))  # an apply dropping one would roll
    assert set(dict(w.seen)) <= set(dict(d.seen))
    for c in set(hashes) - set(w.copies):
        assert dict(d.stamps).get(stamp_key(c)) == dict(w.stamps).get(stamp_key(c))


def deployment(
    *,
    replicas: int = 2,
    generation: int = 2,
    annotations: dict[str, str] | None = None,
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "app",
            "name": "web",
            "uid": "uid-web",
            "generation": generation,
            "resourceVersion": "9",
            "annotations": {ROLLOUT_ON: "db", **(annotations or {})},
        },
        "spec": {"replicas": replicas, "template": {"metadata": {"annotations": {}}}},
        "status": {"observedGeneration": 2, **status},
    }


DONE: dict[str, Any] = {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}


@pytest.mark.parametrize(
    ("obj", "busy"),
    [
        pytest.param(deployment(**DONE), False, id="done"),
        pytest.param(deployment(generation=3, **DONE), True, id="spec-not-observed"),
        pytest.param(deployment(replicas=2, updatedReplicas=1, availableReplicas=1), True, id="up"),
        pytest.param(
            deployment(replicas=3, updatedReplicas=2, availableReplicas=2), True, id="old"
        ),
        pytest.param(deployment(replicas=2, updatedReplicas=2, availableReplicas=1), True, id="av"),
        pytest.param(
            deployment(
                replicas=1,
                updatedReplicas=1,
                conditions=[{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}],
            ),
            False,
            id="stuck-past-its-deadline",
        ),
        pytest.param(deployment(replicas=0), False, id="scaled-to-zero"),
    ],
)
def test_deployment_progress(obj: dict[str, Any], busy: bool) -> None:
    assert progressing(D, obj) is busy


def test_statefulset_and_daemonset_progress() -> None:
    sts = deployment(replicas=2, readyReplicas=2, currentRevision="a", updateRevision="a")
    assert not progressing(WorkloadKind.STATEFULSET, sts)
    sts["status"]["updateRevision"] = "b"
    assert progressing(WorkloadKind.STATEFULSET, sts)
    ds = deployment(desiredNumberScheduled=3, updatedNumberScheduled=3, numberAvailable=3)
    assert not progressing(WorkloadKind.DAEMONSET, ds)
    ds["status"]["numberAvailable"] = 2
    assert progressing(WorkloadKind.DAEMONSET, ds)


def placed(
    meta: str | None = None, template: str | None = None, **template_notes: str
) -> dict[str, Any]:
    """A done Deployment with rollout-on `meta` on its metadata and `template` on its pod
    template (None: absent), plus other pod-template annotations."""
    obj = deployment(**DONE)
    del obj["metadata"]["annotations"][ROLLOUT_ON]
    if meta is not None:
        obj["metadata"]["annotations"][ROLLOUT_ON] = meta
    notes = dict(template_notes)
    if template is not None:
        notes[ROLLOUT_ON] = template
    obj["spec"]["template"]["metadata"]["annotations"] = notes
    return obj


CAP = ",".join(f"c{i}" for i in range(MAX_ROLLOUT_ON_ENTRIES))
HOSTILE = ",".join(f"c{i}" for i in range(MAX_ROLLOUT_ON_ENTRIES + 1))


@pytest.mark.parametrize(
    ("obj", "copies"),
    [
        pytest.param(placed(meta="db,oidc"), ("db", "oidc"), id="metadata-only"),
        pytest.param(placed(template="db, oidc"), ("db", "oidc"), id="template-only"),
        pytest.param(
            placed(meta="db,oidc", template="oidc,hub,db"),
            ("db", "oidc", "hub"),
            id="both-with-overlap-union-once-each",
        ),
        pytest.param(placed(meta="db", template=""), ("db",), id="empty-template-value"),
        pytest.param(placed(meta="db", template=HOSTILE), ("db",), id="hostile-template-ignored"),
        pytest.param(placed(meta=HOSTILE, template="db"), ("db",), id="hostile-metadata-ignored"),
        pytest.param(
            placed(template="db," + "x" * MAX_ROLLOUT_ON_LENGTH), (), id="template-past-length"
        ),
        pytest.param(placed(meta=CAP, template=CAP), tuple(CAP.split(",")), id="both-at-cap"),
        pytest.param(
            placed(meta=CAP, template="extra"), (), id="union-past-the-entry-cap-names-nothing"
        ),
        pytest.param(
            placed(meta="a" * 9000, template="b" * 9000),  # each fits; 18,001 together
            (),
            id="union-past-the-length-cap-names-nothing",
        ),
        pytest.param(placed(), (), id="removed-from-both"),
        pytest.param(placed(**{stamp_key("db"): "h1"}), (), id="a-stamp-alone-is-no-opt-in"),
    ],
)
def test_a_workload_asks_for_the_union_of_its_metadata_and_pod_template(
    obj: dict[str, Any], copies: tuple[str, ...]
) -> None:
    assert parser(D)(obj).copies == copies


def test_the_union_is_bounded_like_one_annotation() -> None:
    assert asked_for({ROLLOUT_ON: CAP}, {ROLLOUT_ON: CAP}) == rollout_on({ROLLOUT_ON: CAP})
    names = [f"n{i}{'z' * 600}" for i in range(30)]  # 30 names, 18,079 characters
    joined = ",".join(names)
    assert len(joined) > MAX_ROLLOUT_ON_LENGTH and rollout_on({ROLLOUT_ON: joined}) == ()
    each = ({ROLLOUT_ON: ",".join(names[:15])}, {ROLLOUT_ON: ",".join(names[15:])})
    assert all(rollout_on(n) for n in each) and asked_for(*each) == ()
    exact = "q" * MAX_ROLLOUT_ON_LENGTH  # the union at the cap still counts
    assert asked_for({ROLLOUT_ON: exact}, {ROLLOUT_ON: exact}) == (exact,)


def test_the_templates_rollout_on_is_never_a_stamp_nor_applied() -> None:
    """The template's rollout-on shares the stamps' prefix: read as a stamp, every apply would
    carry it, so projector would take it over from the chart (the apply is forced), and the
    chart could never remove it."""
    obj = placed(template="db", **{stamp_key("db"): "h1", "other.example/x": "y"})
    w = parser(D)(obj)
    assert w.copies == ("db",) and w.stamps == ((stamp_key("db"), "h1"),)
    body = manifest(w, decide(w, {"db": "h2"}))
    assert body["spec"]["template"]["metadata"]["annotations"] == {stamp_key("db"): "h2"}
    assert ROLLOUT_ON not in body["metadata"]["annotations"]


@given(
    st.lists(st.sampled_from(["db", "on", "oidc", "x" * 80]), unique=True, max_size=4),
    st.booleans(),
    hashes_st | st.dictionaries(st.just("on"), st.just("h9"), min_size=1),
    marks,
)
def test_no_apply_ever_carries_rollout_on(
    copies: list[str], on_template: bool, hashes: dict[str, str], stamped: dict[str, str]
) -> None:
    value = ",".join(copies)
    notes = {stamp_key(c): h for c, h in stamped.items()}
    obj = placed(None if on_template else value, value if on_template else None, **notes)
    w = parser(D)(obj)
    assert w.copies == tuple(copies)
    body = manifest(w, decide(w, hashes))
    assert ROLLOUT_ON not in body["spec"]["template"]["metadata"]["annotations"]
    assert ROLLOUT_ON not in body["metadata"]["annotations"]


def test_only_opted_in_workloads_are_cached() -> None:
    changes: list[tuple[Any, Any]] = []
    cache = OptedIn(spec(D), lambda old, new: changes.append((old, new)))
    parse = parser(D)
    cache.put(REF, parse(deployment(**DONE)))
    assert len(cache) == 1
    plain = deployment(**DONE)
    del plain["metadata"]["annotations"][ROLLOUT_ON]
    cache.put(REF, parse(plain))  # the annotation removed: forgotten
    assert len(cache) == 0
    cache.put(Ref(D, "app", "other"), parse({**plain, "metadata": {**plain["metadata"]}}))
    assert len(cache) == 0 and len(changes) == 2


@pytest.mark.parametrize(
    ("steps", "cached"),
    [
        pytest.param([placed(template="db")], True, id="template-only-opted-in"),
        pytest.param([placed(template="db"), placed()], False, id="removed-from-the-template"),
        pytest.param(
            [placed(meta="db", template="db"), placed(template="db")],
            True,
            id="removed-from-one-place-still-opted-in",
        ),
        pytest.param(
            [placed(meta="db", template="db"), placed()], False, id="removed-from-both-places"
        ),
        pytest.param([placed(template=HOSTILE)], False, id="hostile-template-alone-not-cached"),
        pytest.param(
            [placed(**{stamp_key("db"): "h1"})], False, id="stamps-left-behind-not-cached"
        ),
    ],
)
def test_the_cache_keeps_a_workload_opted_in_in_either_place(
    steps: list[dict[str, Any]], cached: bool
) -> None:
    cache = OptedIn(spec(D), lambda old, new: None)
    for obj in steps:
        cache.put(REF, parser(D)(obj))
    assert (REF in set(cache)) is cached


# --- the edge, over the in-memory API double -----------------------------------------------------


async def test_rollouts_apply_once_record_an_event_and_count_it() -> None:
    api = FakeApi()
    store = Store(api)
    metrics = Metrics()
    writer = Writer(api, metrics=metrics)
    queue: WorkQueue[Ref] = WorkQueue()
    rollouts = Rollouts(
        store, writer, queue=queue, metrics=metrics, recorder=Recorder(writer, "test")
    )
    for c in (*store.caches, *rollouts.caches):
        c.synced.set()
        c.healthy.set()
    grant = make_grant(namespaces=["app"], target_name="db")
    store.grants.put(grant.name, GrantRecord(grant.name, grant.uid, 1, grant, None))
    desired = desired_of(grant, make_source())
    copy = copy_from(desired, "app")
    store.copies.put(copy.key, copy)
    h1 = stamp_of(copy.annotations[HASH_ANNOTATION], copy.uid)
    obj = api.add(DEPLOYMENTS, deployment(**DONE))
    cache = rollouts._by_kind[D]
    cache.put(REF, cache.spec.parse(obj))

    assert await rollouts.reconcile(REF)  # first sight: the baseline only
    stored = api.get_object(DEPLOYMENTS, "app", "web")
    assert stored is not None and stored["metadata"]["annotations"][B] == h1
    assert stored["spec"]["template"]["metadata"]["annotations"] == {}
    assert await rollouts.reconcile(REF)  # again: nothing to do
    assert applies(api) == 1
    while len(queue):  # what the puts above queued
        queue.done(await queue.get())

    changed = copy_from(desired_of(grant, make_source(data={"token": "dDE="})), "app")
    store.copies.put(changed.key, changed)
    assert len(queue) == 1  # the copy woke its reader
    h2 = stamp_of(changed.annotations[HASH_ANNOTATION], changed.uid)
    assert await rollouts.reconcile(REF)
    stored = api.get_object(DEPLOYMENTS, "app", "web")
    assert stored is not None and stored["spec"]["template"]["metadata"]["annotations"] == {S: h2}
    assert await rollouts.reconcile(REF)  # the write went through the cache: no second apply
    assert applies(api) == 2
    events = [o for (plural, _, _), o in api.objects.items() if plural == EVENTS.plural]
    assert [e["reason"] for e in events] == ["RolloutStarted"]
    assert events[0]["involvedObject"]["kind"] == "Deployment"
    assert (
        metrics.registry.get_sample_value(
            "projector_rollouts_total", {"grant": "g", "namespace": "app"}
        )
        == 1
    )


async def test_a_template_opt_in_is_baselined_then_rolled_and_its_annotation_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = FakeApi()
    bodies: list[dict[str, Any]] = []  # what each apply sends
    send = api.send

    async def recording(req: Request) -> Obj:
        if req.content_type == APPLY_PATCH and req.body is not None:
            bodies.append(orjson.loads(req.body) if isinstance(req.body, bytes) else req.body)
        return await send(req)

    monkeypatch.setattr(api, "send", recording)
    store = Store(api)
    metrics = Metrics()
    writer = Writer(api, metrics=metrics)
    queue: WorkQueue[Ref] = WorkQueue()
    rollouts = Rollouts(
        store, writer, queue=queue, metrics=metrics, recorder=Recorder(writer, "test")
    )
    for c in (*store.caches, *rollouts.caches):
        c.synced.set()
        c.healthy.set()
    grant = make_grant(namespaces=["app"], target_name="db")
    store.grants.put(grant.name, GrantRecord(grant.name, grant.uid, 1, grant, None))
    copy = copy_from(desired_of(grant, make_source()), "app")
    store.copies.put(copy.key, copy)
    h1 = stamp_of(copy.annotations[HASH_ANNOTATION], copy.uid)
    obj = api.add(DEPLOYMENTS, placed(template="db", **{"checksum/config": "c1"}))
    cache = rollouts._by_kind[D]
    cache.put(REF, cache.spec.parse(obj))

    assert await rollouts.reconcile(REF)  # first sight: the baseline only, on the metadata
    stored = api.get_object(DEPLOYMENTS, "app", "web")
    assert stored is not None and stored["metadata"]["annotations"][B] == h1
    template = {ROLLOUT_ON: "db", "checksum/config": "c1"}
    assert stored["spec"]["template"]["metadata"]["annotations"] == template
    assert len(bodies) == 1 and bodies[0]["spec"]["template"]["metadata"]["annotations"] == {}

    changed = copy_from(desired_of(grant, make_source(data={"token": "dDE="})), "app")
    store.copies.put(changed.key, changed)
    h2 = stamp_of(changed.annotations[HASH_ANNOTATION], changed.uid)
    assert await rollouts.reconcile(REF)
    stored = api.get_object(DEPLOYMENTS, "app", "web")
    assert stored is not None
    assert stored["spec"]["template"]["metadata"]["annotations"] == {**template, S: h2}
    assert len(bodies) == 2 and bodies[1]["spec"]["template"]["metadata"]["annotations"] == {S: h2}
    assert await rollouts.reconcile(REF)  # nothing more to do
    assert applies(api) == 2


def applies(api: FakeApi) -> int:
    return sum(verb == "APPLY" for verb, _, _ in api.calls)


@pytest.mark.parametrize(
    ("edits", "counted_as"),
    [
        pytest.param({}, "g", id="the-owner"),
        pytest.param({"labels": {GRANT_LABEL: "forged-1"}}, "g", id="a-forged-grant-label"),
        pytest.param(
            {"labels": {GRANT_LABEL: "forged-2"}, "annotations": {GRANT_UID_ANNOTATION: "nope"}},
            "",
            id="no-live-grant-owns-it",
        ),
    ],
)
async def test_a_rollout_is_counted_by_the_grant_cache_never_by_a_copys_label(
    edits: dict[str, Any], counted_as: str
) -> None:
    """A tenant who writes a copy writes its labels: a grant label of its own would be one more
    series per name it makes up (issue 36). The grant comes from the controller's cache."""
    api = FakeApi()
    store = Store(api)
    metrics = Metrics()
    writer = Writer(api, metrics=metrics)
    rollouts = Rollouts(
        store, writer, queue=WorkQueue(), metrics=metrics, recorder=Recorder(writer, "test")
    )
    grant = make_grant(namespaces=["app"], target_name="db")
    store.grants.put(grant.name, GrantRecord(grant.name, grant.uid, 1, grant, None))
    copy = copy_from(desired_of(grant, make_source()), "app", **edits)
    store.copies.put(copy.key, copy)
    await rollouts._rolled(workload(), ["db"])
    samples = {
        s.labels["grant"]: s.value
        for m in metrics.registry.collect()
        if m.name == "projector_rollouts"
        for s in m.samples
        if s.name == "projector_rollouts_total"
    }
    assert samples == {counted_as: 1}


def test_rollouts_are_off_unless_asked_and_their_window_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PROJECTOR_ROLLOUTS", raising=False)
    cfg = config.parse([])
    assert not cfg.rollouts and (cfg.rollout_debounce, cfg.rollout_debounce_max) == (2.0, 10.0)
    cfg = config.parse(["--rollouts", "--rollout-debounce=500ms", "--rollout-debounce-max=3s"])
    assert cfg.rollouts and (cfg.rollout_debounce, cfg.rollout_debounce_max) == (0.5, 3.0)
    monkeypatch.setenv("PROJECTOR_ROLLOUTS", "true")
    assert config.parse([]).rollouts
    with pytest.raises(SystemExit):
        config.parse(["--rollout-debounce=5s", "--rollout-debounce-max=1s"])


def test_the_stamp_is_keyed_by_the_copys_uid_so_workload_readers_cannot_test_guesses() -> None:
    h = "sha256:" + "ab" * 32
    assert stamp_of(h, "uid-1") != stamp_of(h, "uid-2")
    assert "abab" not in stamp_of(h, "uid-1") and len(stamp_of(h, "uid-1")) == 16


@pytest.mark.parametrize(
    ("value", "names"),
    [
        pytest.param("a, b,,a", ("a", "b"), id="blanks-and-repeats"),
        pytest.param(
            ",".join(f"c{i}" for i in range(64)), tuple(f"c{i}" for i in range(64)), id="at-cap"
        ),
        pytest.param(",".join(f"c{i}" for i in range(65)), (), id="past-the-entry-cap"),
        pytest.param("a" * 16385, (), id="past-the-length-cap"),
    ],
)
def test_rollout_on_is_bounded_before_it_is_split(value: str, names: tuple[str, ...]) -> None:
    assert rollout_on({ROLLOUT_ON: value}) == names
