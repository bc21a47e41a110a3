"""Opt-in rollouts, the I/O: caches of the opted-in workloads, a queue, a worker that applies.

What to roll and how is `decide`'s. The newest hash goes out once the last rollout is done
(the workload's status events wake the key). Keys wait in a work queue with a window of their
own (--rollout-debounce, 2 s, at most --rollout-debounce-max, 10 s): a burst of source changes
reaches a copy as a few writes seconds apart (the hot debounce), and those collapse into one
or two rollouts, not one each. Only workloads carrying the annotation (on their metadata or
their pod template) are cached, and only what the decision needs. `Rollouts` holds the caches,
the index from copy to workloads, and a worker that applies and records an Event and a metric.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field

import structlog

from projector.cache.caches import Cache, Spec
from projector.cache.store import Store
from projector.control.queue import WorkQueue
from projector.control.recorder import Recorder
from projector.control.writer import Writer
from projector.core.model import Copy, ObjectKey
from projector.core.status import Event
from projector.errors import ApiError, Fenced, NotFound
from projector.rollout.decide import (
    FIELD_MANAGER,
    RESOURCES,
    Ref,
    Workload,
    WorkloadKind,
    copy_stamp,
    decide,
    key_of,
    manifest,
    parser,
)
from projector.telemetry.metrics import Metrics

log = structlog.get_logger("projector.rollout")


class OptedIn(Cache[Ref, Workload]):
    """A cache that keeps only opted-in workloads: the others' changes are not even noticed."""

    def put(self, key: Ref, value: Workload) -> Workload | None:
        """Store an opted-in workload; one that names no copy in either place is forgotten."""
        if not value.copies:
            return self.pop(key)
        return super().put(key, value)


WORKLOAD_PAGE = 50
"""Workloads per list page: tenants write them, up to the API server's 1.5 MiB each, and a
page is held whole while it is parsed (75 MiB at most, not 750 at the default 500)."""


def spec(kind: WorkloadKind) -> Spec[Ref, Workload]:
    """How one workload kind is listed and watched.

    Every object: the server cannot select on annotations (the workload's or its pod
    template's), so the filter is `OptedIn`'s, on the parsed value: each object is parsed once
    per event whether it opted in or not, and only opted-in ones stay in memory.
    """
    return Spec(kind, RESOURCES[kind], parser(kind), key_of(kind), page=WORKLOAD_PAGE)


# --- the I/O edge --------------------------------------------------------------------------------


@dataclass(eq=False)
class Rollouts:
    """Keeps opted-in workloads rolled to their copies' content: caches, index, worker."""

    store: Store
    writer: Writer
    _: KW_ONLY
    queue: WorkQueue[Ref]
    metrics: Metrics
    recorder: Recorder
    caches: tuple[OptedIn, ...] = field(init=False)
    _by_kind: dict[str, OptedIn] = field(init=False)
    _readers: defaultdict[ObjectKey, set[Ref]] = field(
        init=False, default_factory=lambda: defaultdict(set)
    )
    """Copy -> the workloads that name it."""

    def __post_init__(self) -> None:
        self.caches = tuple(OptedIn(spec(k), self._workload_changed) for k in WorkloadKind)
        self._by_kind = {c.spec.kind: c for c in self.caches}
        self.store.watch_copies(self._copy_changed)

    def _workload_changed(self, old: Workload | None, new: Workload | None) -> None:
        for w, add in ((old, False), (new, True)):
            if w is None:
                continue
            for copy in w.copies:
                key = ObjectKey(w.ref.namespace, copy)
                if add:
                    self._readers[key].add(w.ref)
                elif (refs := self._readers.get(key)) is not None:
                    refs.discard(w.ref)
                    if not refs:
                        del self._readers[key]
        if new is not None:
            self.queue.add(new.ref)

    def _copy_changed(self, old: Copy | None, new: Copy | None) -> None:
        c = new or old
        if c is None or (old and new and copy_stamp(old) == copy_stamp(new)):
            return
        for ref in self._readers.get(c.key, ()):
            self.queue.add(ref)

    def healthy(self) -> bool:
        """The copies' and the workloads' caches follow the server."""
        return self.store.copies.healthy.is_set() and all(c.healthy.is_set() for c in self.caches)

    def resync(self) -> None:
        """Queue every opted-in workload once, its backoff started over.

        A new leader's are no-ops unless something changed; an outage's failures were the
        server's, not the workload's.
        """
        for cache in self.caches:
            for ref in list(cache):
                self.queue.forget(ref)
                self.queue.add_now(ref)

    def stop(self) -> None:
        """Take no new work."""
        self.queue.shut_down()

    async def run(self) -> None:
        """Apply what `decide` says, one workload at a time, until stopped."""
        async for ref in self.queue:
            try:
                ok = await self.reconcile(ref)
            except Fenced:
                log.warning("rollout refused: this replica no longer holds the lease")
                ok = False
            except ApiError as e:
                log.warning("rollout apply failed; retried", status=e.status, reason=e.reason)
                ok = False
            except Exception:  # a bug here must not stop the grants' workers beside it
                log.exception("rollout crashed; retried", workload=_name(ref))
                ok = False
            if ok:
                self.queue.forget(ref)
            else:
                self.queue.add_rate_limited(ref, cap=30.0)
            self.queue.done(ref)

    def hashes(self, w: Workload) -> dict[str, str]:
        """The stamps of the copies `w` names that projector owns, by copy name."""
        out = {}
        for name in w.copies:
            c = self.store.copies.get(ObjectKey(w.ref.namespace, name))
            if c is not None and (h := copy_stamp(c)) is not None:
                out[name] = h
        return out

    async def reconcile(self, ref: Ref) -> bool:
        """Decide and apply for one workload; False: retry later (a cache behind, a failure)."""
        if not self.healthy():
            return False  # a stale cache could omit a stamp, and the apply would drop it
        cache = self._by_kind[ref.kind]
        w = cache.get(ref)
        if w is None:
            return True
        d = decide(w, self.hashes(w))
        log.debug("rollout checked", workload=_name(ref), rolled=d.rolled, held=d.held)
        if d.held:
            log.info("rollout held: the last one still progresses", workload=_name(ref))
        if not d.needed(w):
            return True
        res = RESOURCES[ref.kind]
        try:
            out = await self.writer.apply(
                res, manifest(w, d), namespace=ref.namespace, field_manager=FIELD_MANAGER
            )
        except NotFound:
            return True  # deleted meanwhile
        if cache.get(ref) == w:  # write through: a key woken again must not apply it twice
            cache.put(ref, cache.spec.parse(out))
        if d.rolled:
            await self._rolled(w, d.rolled)
        return True

    async def _rolled(self, w: Workload, copies: Iterable[str]) -> None:
        copies = list(copies)
        # By the grant cache, never a copy's grant label: whoever can write a Secret in the
        # namespace can write any label, and every name would be a series of its own. A copy
        # no live grant owns counts under "".
        grants = {
            self.store.owner(c) or ""
            for name in copies
            if (c := self.store.copies.get(ObjectKey(w.ref.namespace, name))) is not None
        }
        for grant in sorted(grants):
            self.metrics.rollouts.labels(grant, w.ref.namespace).inc()
        log.info("rollout started", workload=_name(w.ref), copies=copies)
        res = RESOURCES[w.ref.kind]
        involved = {
            "apiVersion": res.version,
            "kind": res.kind,
            "name": w.ref.name,
            "namespace": w.ref.namespace,
            "uid": w.uid,
        }
        message = f"content of {', '.join(copies)} changed: rolling out its pods"
        ev = Event("Normal", "RolloutStarted", message)
        await self.recorder.record_on(involved, w.ref.namespace, ev)


def _name(ref: Ref) -> str:
    return f"{ref.kind.value}/{ref.namespace}/{ref.name}"
