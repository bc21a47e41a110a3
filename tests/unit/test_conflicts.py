"""Conflict watches on a scripted API: what they ask for, whom they wake, when grants recheck.

The real API server is used in tests/integration/test_rows.py (a cleared Conflict is noticed
within the usual latency); the requests' shape, the bound and the fallbacks are checked here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Iterable

from projector.client.api import Api, Request
from projector.client.narrow import LIST_METADATA, WATCH_METADATA
from projector.control.conflicts import ConflictWatches, blocked, foreseen
from projector.core.kinds import CONFIGMAPS, SECRETS, Obj
from projector.core.model import SourceKind, parse_copy
from projector.core.names import FIELD_MANAGER
from projector.core.plans import (
    Action,
    Outcome,
    Plan,
    Reason,
    Result,
    SourceState,
    Step,
    conflict_message,
    verdict,
)
from projector.core.reconcile import plan as make_plan
from tests.unit.factories import (
    claim,
    foreign_secret,
    make_grant,
    make_snapshot,
    make_source,
    namespaces,
    stored_secret,
)
from tests.unit.fakeapi import FakeApi
from tests.unit.test_controller import controller, world

HUB = (SourceKind.SECRET, "hub")


def meta(namespace: str, name: str = "hub", rv: str = "11") -> Obj:
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": rv}}


class Scripted(Api):
    """Lists the unmanaged objects of `present`; each watch plays `events` (an exception ends it).

    `waiting` is set while a watch waits for its next event: every event before it is applied.
    """

    def __init__(self, present: Iterable[str] = ()) -> None:
        self.present = {ns: "10" for ns in present}
        self.requests: list[Request] = []
        self.events: asyncio.Queue[tuple[str, Obj] | BaseException] = asyncio.Queue()
        self.waiting = asyncio.Event()
        self.open_watches = 0

    async def send(self, req: Request) -> Obj:
        self.requests.append(req)
        name = dict(req.query)["fieldSelector"].removeprefix("metadata.name=")
        items = [meta(ns, name, rv) for ns, rv in self.present.items()]
        return {"kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "10"}} | {
            "items": items
        }

    async def stream(
        self, req: Request, read_deadline: float
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        self.requests.append(req)
        self.open_watches += 1
        try:
            yield "OPEN", {}
            while True:
                self.waiting.set()
                event = await self.events.get()
                self.waiting.clear()
                if isinstance(event, BaseException):
                    raise event
                yield event
        finally:
            self.open_watches -= 1

    async def settled(self) -> None:
        """Every event pushed so far has been applied."""
        while not self.events.empty() or not self.waiting.is_set():
            await asyncio.wait_for(self.waiting.wait(), 5)
            await asyncio.sleep(0)  # not a pause: lets the watch take a queued event


def conflicted(*namespaces: str, name: str = "hub", planned: bool = False) -> list[Outcome]:
    """Outcomes of a reconcile that met a Conflict in each namespace: at its create (the
    blocking object uncached), or, `planned`, decided by the plan on a cached object."""
    return [
        Outcome(
            Step(ns, Action.NOOP, Reason.CONFLICT, foreign_secret(ns, name), name)
            if planned
            else Step(ns, Action.CREATE, Reason.PROJECTED, None, name),
            Reason.CONFLICT,
        )
        for ns in namespaces
    ]


def plan_of(grant: str = "g", target: str = "hub", kind: SourceKind = SourceKind.SECRET) -> Plan:
    g = make_grant(grant, target_name=target)
    g = dataclasses.replace(g, source=g.source._replace(kind=kind))
    return Plan(make_snapshot(g, make_source()), SourceState.AVAILABLE, None, (), 2)


@contextlib.asynccontextmanager
async def running(watches: ConflictWatches) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(watches.run())
    try:
        yield task
    finally:
        watches.stop()
        await asyncio.wait_for(task, 5)


# --- which Conflicts need a watch ---------------------------------------------------------------


def test_only_conflicts_met_at_a_write_are_watched_for() -> None:
    """A Conflict the writer met (AlreadyExists: the cache did not know the object) is; one the
    plan decided on a cached copy of another grant is not (its deletion already wakes)."""
    plan = plan_of()
    outcomes = [*conflicted("a", "b"), *conflicted("c", planned=True)]
    assert blocked(plan, outcomes) == (HUB, frozenset({"a", "b"}))
    assert blocked(plan, conflicted("c", planned=True)) is None
    assert blocked(plan, []) is None
    gone = Plan(make_snapshot(None, None, grant_name="g"), SourceState.UNKNOWN, None, (), 0)
    assert blocked(gone, conflicted("a")) is None


def test_a_plan_with_an_unowned_secret_in_the_cache_decides_the_conflict_itself() -> None:
    """The reconcile side of the rule above: a cached foreign Secret is a NoOp Conflict step."""
    g = make_grant(namespaces=("a",))
    snap = make_snapshot(g, make_source(), namespaces=namespaces("a"), copies=[foreign_secret("a")])
    p = make_plan(snap)
    (step,) = p.steps
    assert (step.action, step.reason) == (Action.NOOP, Reason.CONFLICT)
    outcomes = [Outcome(step, step.reason)]
    assert blocked(p, outcomes) is None
    assert verdict(p, outcomes).result is Result.RECHECK


def test_a_create_a_watch_sees_refused_is_a_conflict_unsent_and_anything_else_is_left() -> None:
    """Where the watch sees an object without this grant's uid, the create would be refused:
    a NoOp Conflict (with the writer's message), counted as uncached. An unlabelled object
    with the grant's own uid is the writer's to take back; a free place is created."""
    g = make_grant(namespaces=("a", "b", "c"))
    snap = make_snapshot(g, make_source(), namespaces=namespaces("a", "b", "c"))
    p = make_plan(snap)
    assert {s.namespace: s.action for s in p.steps} == dict.fromkeys("abc", Action.CREATE)
    theirs = foreign_secret("a")
    _, notes = claim(None, g.uid)  # its uid, written by projector; its labels stripped
    marked = stored_secret("b", "hub", annotations=notes, managers={FIELD_MANAGER: notes})
    present = {"a": theirs, "b": parse_copy(marked)}
    seen = foreseen(p, lambda ns: present.get(ns))
    by_ns = {s.namespace: s for s in seen.steps}
    assert (by_ns["a"].action, by_ns["a"].reason) == (Action.NOOP, Reason.CONFLICT)
    assert by_ns["a"].message == conflict_message(SourceKind.SECRET)
    assert by_ns["b"] == p.steps[1] and by_ns["c"] == p.steps[2]
    assert foreseen(p, lambda ns: None) is p  # nothing seen: the very plan
    outcomes = [Outcome(s, s.reason) for s in seen.steps if s.action is Action.NOOP]
    assert blocked(seen, outcomes) == (HUB, frozenset({"a"}))


# --- the watch ----------------------------------------------------------------------------------


async def test_the_watch_asks_for_one_name_unmanaged_as_metadata_only_across_namespaces() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None)
    watches.record("g", plan_of(), conflicted("a"))
    async with running(watches):
        await api.settled()
        listed, watched = api.requests
        for req in (listed, watched):
            query = dict(req.query)
            assert req.res == SECRETS and req.namespace is None and req.name is None
            assert query["fieldSelector"] == "metadata.name=hub"
            assert query["labelSelector"] == "projector.nebari.dev/managed-by!=projector"
        assert (listed.verb, listed.accept) == ("LIST", LIST_METADATA)
        assert (watched.verb, watched.accept) == ("WATCH", WATCH_METADATA)
        assert dict(watched.query)["resourceVersion"] == "10"
        for accept in (LIST_METADATA, WATCH_METADATA):
            assert ",application/json" not in accept  # no fallback to whole objects


async def test_a_configmap_grant_watches_configmaps() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None)
    watches.record("g", plan_of(kind=SourceKind.CONFIG_MAP), conflicted("a"))
    async with running(watches):
        await api.settled()
        assert {r.res for r in api.requests} == {CONFIGMAPS}


async def test_a_deleted_blocker_wakes_the_grants_in_conflict_in_its_namespace_only() -> None:
    api = Scripted(present=["a", "b", "z"])
    woken: list[set[str]] = []
    watches = ConflictWatches(api, woken.append)
    watches.record("g1", plan_of("g1"), conflicted("a"))
    watches.record("g2", plan_of("g2"), conflicted("a", "b"))
    async with running(watches):
        await api.settled()
        assert watches.watching() == {HUB} and api.open_watches == 1  # one watch per place
        api.events.put_nowait(("DELETED", meta("z")))  # not in conflict: nobody to wake
        api.events.put_nowait(("MODIFIED", meta("a", rv="12")))  # still there
        api.events.put_nowait(("DELETED", meta("b")))
        await api.settled()
        assert woken == [{"g2"}]
        api.events.put_nowait(("DELETED", meta("a")))
        await api.settled()
        assert woken == [{"g2"}, {"g1", "g2"}]


async def test_a_watched_grant_rechecks_as_before_and_an_unwatched_one_with_backoff() -> None:
    """Watched and its blocker held: the usual recheck. Its blocker not (yet) in the watch's
    cache, or no watch at all: 1 s doubling to the recheck."""
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None, recheck=60.0)
    watches.record("g", plan_of(), conflicted("a"))
    assert [watches.recheck_after("g") for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    async with running(watches):
        await api.settled()
        assert watches.recheck_after("g") == 60.0
        watches.record("g", plan_of(), conflicted("a", "gone"))  # gone before the watch saw it
        assert watches.recheck_after("g") == 1.0
        watches.record("g", plan_of(), [])  # the conflicts cleared
        assert watches.recheck_after("g") == 60.0


async def test_past_the_bound_a_place_waits_for_a_free_watch_and_rechecks_meanwhile() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None, limit=1, recheck=60.0)
    watches.record("first", plan_of("first", "one"), conflicted("a", name="one"))
    watches.record("second", plan_of("second", "two"), conflicted("a", name="two"))
    async with running(watches):
        await api.settled()
        assert watches.watching() == {(SourceKind.SECRET, "one")} and api.open_watches == 1
        assert watches.recheck_after("first") == 60.0
        assert [watches.recheck_after("second") for _ in range(3)] == [1, 2, 4]
        api.waiting.clear()
        watches.record("first", plan_of("first", "one"), [])  # its conflict cleared
        await api.settled()
        assert watches.watching() == {(SourceKind.SECRET, "two")} and api.open_watches == 1
        assert watches.recheck_after("second") == 60.0


async def test_a_grant_that_stops_conflicting_closes_its_places_watch() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None)
    watches.record("g", plan_of(), conflicted("a"))
    async with running(watches):
        await api.settled()
        assert api.open_watches == 1
        watches.forget("g")
        for _ in range(10):  # the run loop closes it on its next turn
            if not api.open_watches:
                break
            await asyncio.sleep(0)  # not a pause: a turn of the loop
        assert api.open_watches == 0 and watches.watching() == frozenset()


async def test_a_broken_watch_ends_alone_and_its_grants_recheck_with_backoff() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None, recheck=60.0)
    watches.record("g", plan_of(), conflicted("a"))
    async with running(watches) as task:
        await api.settled()
        api.events.put_nowait(RuntimeError("a bug"))  # not an API error: not retried
        for _ in range(10):
            if not api.open_watches:
                break
            await asyncio.sleep(0)  # not a pause: a turn of the loop
        assert api.open_watches == 0 and not task.done()
        assert [watches.recheck_after("g") for _ in range(2)] == [1, 2]


async def test_stopping_closes_every_watch_and_forgets_every_conflict() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None, recheck=60.0)
    watches.record("g", plan_of(), conflicted("a"))
    async with running(watches):
        await api.settled()
    assert api.open_watches == 0 and watches.watching() == frozenset()
    assert watches.recheck_after("g") == 60.0  # nothing recorded: the next term records again


# --- the controller's hooks ---------------------------------------------------------------------


async def test_the_controller_records_a_conflict_met_at_create_and_forgets_it_cleared() -> None:
    api = FakeApi()
    world(api)
    api.add(SECRETS, {"metadata": {"name": "s", "namespace": "a"}, "data": {"x": "eA=="}})  # theirs
    ctl = await controller(api)
    assert await ctl.reconcile("g") is Result.RECHECK
    assert ctl.conflicts.recheck_after("g") == 1.0  # no watch runs here: the short backoff
    del api.objects["secrets", "a", "s"]  # its owner deletes it
    assert await ctl.reconcile("g") is Result.OK
    assert ctl.conflicts.recheck_after("g") == ctl.config.conflict_recheck  # nothing recorded


async def test_only_a_current_watch_spares_the_creates() -> None:
    api = Scripted(present=["a"])
    watches = ConflictWatches(api, lambda names: None)
    g = make_grant(namespaces=("a", "b"))
    p = make_plan(make_snapshot(g, make_source(), namespaces=namespaces("a", "b")))
    assert watches.foresee(p) is p  # no watch yet: the writer finds out
    watches.record("g", plan_of(), conflicted("a"))
    async with running(watches):
        await api.settled()
        spared = {s.namespace: s.action for s in watches.foresee(p).steps}
        assert spared == {"a": Action.NOOP, "b": Action.CREATE}
        (watch,) = watches._watches.values()
        watch.cache.healthy.clear()  # behind the server: what it sees may be stale
        assert watches.foresee(p) is p
