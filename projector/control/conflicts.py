"""Conflict watches: a cleared Conflict is noticed within the usual latency, not a minute later.

A copy's place taken by an object projector does not cache (a Secret or ConfigMap of the copy's
name without the managed-by label: someone else's) is met by the writer as AlreadyExists, and
when its owner deletes it, no informer says so. So, while some grant has such a Conflict at a
place (the copy's kind and name; every namespace of one grant shares it), one watch follows the
objects of that kind and name in every namespace: `fieldSelector=metadata.name=<name>`,
`labelSelector=managed-by!=projector` (a labelled one is the copies informer's, whose deletion
already wakes the grants aiming at its place), and as metadata only (`PartialObjectMetadata`:
the foreign object's data never leaves the API server). It is an `informer.Informer` over a
cache of namespace names, so it lists, resumes, relists on 410 and backs off as every informer
does; a namespace that leaves the cache (a DELETED event, the label added, a relist that no
longer has it) wakes the grants in conflict there, which then decide from their own caches.
The watch never deletes or writes anything: at most it wakes a grant, or spares one a create
the API server would refuse (`foreseen`: an object is there that the ownership rule says is
not the grant's), so that a reconcile of a grant with 1,000 such Conflicts costs no request
for them rather than 2,000 (a create refused, then a read of what refused it).

Bounded: at most `MAX_WATCHES` places are watched at once, one watch each however many
namespaces conflict there (1,000 conflicts of one grant are one watch). A grant whose place has
no current watch (over the bound, not yet listed, behind the server, or broken by a bug) falls
back to rechecks with backoff, `FIRST_RECHECK` doubling to `Config.conflict_recheck` (60 s); so
does one whose blocking object the watch does not hold (gone already, or not seen yet). While
its watch is current and holds every blocking object, a grant still looks again every
`conflict_recheck`, as before: the watch only makes the common case prompt.

Only the leader runs these watches: `run` is a task of the controller's leadership term, and
when the term ends they close and what was recorded is forgotten (the next term reconciles every
grant, which records its conflicts again). A broken watch never breaks the controller: an API
error is retried by the informer, anything else ends that watch alone, logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from projector.cache.caches import Cache, Spec
from projector.cache.informer import Informer
from projector.client.api import Api
from projector.client.narrow import OneName
from projector.control.delays import Backoff
from projector.core.kinds import BY_KIND, Obj
from projector.core.model import MANAGED_BY_LABEL, MANAGED_BY_VALUE, Copy, SourceKind, parse_copy
from projector.core.ownership import may_write
from projector.core.plans import Action, Outcome, Plan, Reason, Step, conflict_message

__all__ = [
    "FIRST_RECHECK",
    "MAX_WATCHES",
    "ConflictWatches",
    "Place",
    "blocked",
    "foreseen",
]

log = structlog.get_logger("projector.conflicts")

MAX_WATCHES = 64
"""Places (kind, copy name) watched at once; grants in conflict at any other recheck with
backoff. One watch is one long-lived HTTP stream and a cache of the namespace names holding an
unmanaged object of that name."""
FIRST_RECHECK = 1.0
"""First recheck of a grant whose blocking object no current watch holds; doubles per recheck
up to `Config.conflict_recheck`."""

Place = tuple[SourceKind, str]
"""Where a grant's copies go, but for the namespace: the copy's kind and name."""

UNMANAGED = f"{MANAGED_BY_LABEL}!={MANAGED_BY_VALUE}"
"""Objects without projector's managed-by label: the copies informer caches the others."""


class Watched(StrEnum):
    """What a conflict watch follows, as informers' logs name it."""

    SECRETS = "conflicting-secrets"
    CONFIG_MAPS = "conflicting-configmaps"


_WATCHED = {SourceKind.SECRET: Watched.SECRETS, SourceKind.CONFIG_MAP: Watched.CONFIG_MAPS}


def blocked(plan: Plan, outcomes: Sequence[Outcome]) -> tuple[Place, frozenset[str]] | None:
    """Where a reconcile met a Conflict the caches did not foresee: its place and namespaces.

    Such a Conflict is a write the plan made (its place looked free, or held by a copy of
    ours) that the API server refused, since an object the caches do not hold has the name,
    or a create `foreseen` refused, from a watch that sees such an object there. A Conflict
    the plan decided on (the blocking object is a cached copy of another grant's) is not one:
    its deletion already wakes the grants aiming at the place. None: none at all.
    """
    grant = plan.grant
    if grant is None:
        return None
    namespaces = frozenset(
        o.namespace
        for o in outcomes
        if o.reason is Reason.CONFLICT
        and (o.step.action is not Action.NOOP or o.step.existing is None)
    )
    return ((grant.kind, grant.target_name), namespaces) if namespaces else None


def foreseen(plan: Plan, present: Callable[[str], Copy | None]) -> Plan:
    """`plan` with each create the API server would refuse made a Conflict already, unsent.

    `present(namespace)` is what a current watch of the plan's place sees there: the metadata
    of an object of the copy's name that projector does not cache, or None. A create where
    one is, and the ownership rule (`may_write`, as the writer asks it of an object it meets)
    says the grant may not write it, would be answered 409 and then read: with 1,000 of them,
    2,000 requests per reconcile. Anything else is left to the writer, as before.
    """
    snap, steps, changed = plan.snapshot, list(plan.steps), False
    for i, step in enumerate(steps):
        theirs = present(step.namespace) if step.action is Action.CREATE else None
        place = snap.namespaces.get(step.namespace)
        if theirs is None or place is None or may_write(snap, theirs, place):
            continue
        why = conflict_message(theirs.key.kind)
        steps[i] = Step(step.namespace, Action.NOOP, Reason.CONFLICT, None, step.name, why)
        changed = True
    return dataclasses.replace(plan, steps=tuple(steps)) if changed else plan


def _namespace(obj: Obj) -> str:
    return str(obj["metadata"]["namespace"])


@dataclass(eq=False)
class _Watch:
    """One place's watch: its cache of namespaces holding an unmanaged object, and its task."""

    cache: Cache[str, Copy]
    """By namespace, the metadata of the unmanaged object of the place's name there."""
    task: asyncio.Task[None] | None = None
    broken: bool = False
    """It ended by a bug (not an API error, which it retries): its grants recheck instead."""

    def current(self) -> bool:
        """Listed, following the server now, and running."""
        return not self.broken and self.cache.synced.is_set() and self.cache.healthy.is_set()


@dataclass
class _Records:
    """Which grant has uncached conflicts where; kept only by `ConflictWatches`."""

    by_grant: dict[str, tuple[Place, frozenset[str]]] = field(default_factory=dict)
    by_place: defaultdict[Place, set[str]] = field(default_factory=lambda: defaultdict(set))


class ConflictWatches:
    """Watches the places of uncached Conflicts; wakes their grants when a blocker goes."""

    def __init__(
        self,
        api: Api,
        wake: Callable[[set[str]], None],
        *,
        recheck: float = 60.0,
        limit: int = MAX_WATCHES,
        first_recheck: float = FIRST_RECHECK,
        timeout_seconds: int = 300,
        read_deadline: float = 90.0,
        backoff: tuple[float, float] = (0.8, 30.0),
    ) -> None:
        self._api = api
        self._wake = wake
        self._recheck = recheck
        self._limit = limit
        self._timeout_seconds = timeout_seconds
        self._read_deadline = read_deadline
        self._informer_backoff = backoff
        self._rechecks: Backoff[str] = Backoff(min(first_recheck, recheck), recheck)
        self._records = _Records()
        self._watches: dict[Place, _Watch] = {}
        self._changed = asyncio.Event()
        self._stopping = False

    # --- what the workers tell and ask ---------------------------------------------------------

    def record(self, grant: str, plan: Plan, outcomes: Sequence[Outcome]) -> None:
        """Remember where a reconcile of `grant` met uncached Conflicts (none: forget it)."""
        self._set(grant, blocked(plan, outcomes))

    def forget(self, grant: str) -> None:
        """`grant` has no uncached Conflict now (e.g. its spec became invalid)."""
        self._set(grant, None)

    def _set(self, grant: str, now: tuple[Place, frozenset[str]] | None) -> None:
        records = self._records
        old = records.by_grant.pop(grant, None)
        if old is not None:
            grants = records.by_place[old[0]]
            grants.discard(grant)
            if not grants:
                del records.by_place[old[0]]
        if now is None:
            self._rechecks.forget(grant)
        else:
            records.by_grant[grant] = now
            records.by_place[now[0]].add(grant)
        if (old[0] if old else None) != (now[0] if now else None):
            self._changed.set()  # a place may need a watch, or no longer

    def recheck_after(self, grant: str) -> float:
        """Seconds before `grant`, which reported a Conflict, looks again.

        `conflict_recheck` if it has no uncached Conflict or its place's watch is current and
        holds every object blocking it; else its next backoff (1 s doubling to that).
        """
        record = self._records.by_grant.get(grant)
        if record is None:
            return self._recheck
        place, namespaces = record
        watch = self._watches.get(place)
        if watch is not None and watch.current() and all(n in watch.cache for n in namespaces):
            self._rechecks.forget(grant)
            return self._recheck
        return self._rechecks.fail(grant, None, 0.0)

    def foresee(self, plan: Plan) -> Plan:
        """`foreseen`, with what the current watch of the plan's place sees (none: `plan`)."""
        grant = plan.grant
        watch = self._watches.get((grant.kind, grant.target_name)) if grant is not None else None
        if watch is None or not watch.current():
            return plan
        return foreseen(plan, watch.cache.get)

    def watching(self) -> frozenset[Place]:
        """The places watched now (current or not)."""
        return frozenset(self._watches)

    # --- the term's task -----------------------------------------------------------------------

    def stop(self) -> None:
        """End `run` (its watches closed)."""
        self._stopping = True
        self._changed.set()

    async def run(self) -> None:
        """Open and close watches as conflicts come and go, until stopped or cancelled.

        On the way out every watch is closed and every record forgotten.
        """
        try:
            while not self._stopping:
                self._changed.clear()
                await self._arrange()
                await self._changed.wait()
        finally:
            tasks = [w.task for w in self._watches.values() if w.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._watches.clear()
            self._records = _Records()
            self._stopping = False

    async def _arrange(self) -> None:
        """Close the watches no grant needs; open those needed, up to the bound."""
        needed = self._records.by_place
        for place in [p for p in self._watches if p not in needed]:
            watch = self._watches.pop(place)
            if watch.task is not None:
                watch.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch.task
            log.info("conflict cleared; place unwatched", kind=place[0].value, name=place[1])
        for place in needed:
            if place in self._watches:
                continue
            if len(self._watches) >= self._limit:
                log.info(
                    "conflict watches at their bound; grants recheck with backoff",
                    limit=self._limit,
                    unwatched=len(needed) - len(self._watches),
                )
                return
            self._open(place)

    def _open(self, place: Place) -> None:
        kind, name = place
        parse = functools.partial(parse_copy, kind=kind)
        spec: Spec[str, Copy] = Spec(_WATCHED[kind], BY_KIND[kind], parse, _namespace, UNMANAGED)
        watch = _Watch(Cache(spec, lambda old, new: self._gone(place, old, new)))
        informer: Informer[str, Copy] = Informer(
            OneName(self._api, name, metadata_only=True),
            watch.cache,
            timeout_seconds=self._timeout_seconds,
            read_deadline=self._read_deadline,
            on_event=lambda _kind, type_: self._listed(place, watch, type_),
            backoff=self._informer_backoff,
        )
        watch.task = asyncio.create_task(
            self._follow(place, watch, informer), name=f"conflict-watch-{kind.value}-{name}"
        )
        self._watches[place] = watch
        log.info("conflict place watched", kind=kind.value, name=name)

    def _listed(self, place: Place, watch: _Watch, type_: str) -> None:
        """After each list: every deletion from here on is seen (the watch resumes from it)."""
        if type_ == "RELIST":
            log.debug(
                "conflict place listed",
                kind=place[0].value,
                name=place[1],
                unmanaged=len(watch.cache),
            )

    async def _follow(self, place: Place, watch: _Watch, informer: Informer[str, Copy]) -> None:
        """Run one place's informer; a bug ends this watch alone, and its grants recheck."""
        try:
            await informer.run()
        except Exception:
            watch.broken = True
            log.exception(
                "conflict watch failed; its grants recheck with backoff",
                kind=place[0].value,
                name=place[1],
            )

    def _gone(self, place: Place, old: Copy | None, new: Copy | None) -> None:
        """A namespace left a place's cache: wake the grants in conflict there."""
        if old is None or new is not None:
            return
        records, ns = self._records, old.key.namespace
        names = {g for g in records.by_place.get(place, ()) if ns in records.by_grant[g][1]}
        if names:
            log.debug("conflict cleared; waking", namespace=ns, grants=len(names))
            self._wake(names)
