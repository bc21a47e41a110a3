"""Informers: list, then watch, into a store's cache; ours, because kr8s has none.

The reflector loop is client-go's: LIST (page by page), then WATCH from the list's
resourceVersion with bookmarks and a server timeout; a watch that ends normally resumes from
the last resourceVersion seen; a 410 Gone relists and turns what vanished into deletions; any
other API failure backs off and retries, forever, by a tenacity policy (`_wait`): 0.8 s
doubling to 30 s when the server answered with an error, the Retry-After it gave with a 429, and
at most `UNREACHABLE_RETRY_MAX` (1 s) when it did not answer at all (refused, reset, timed out)
or, just after that, refused us (401/403 while a restarted server's authorizer warms up), so
that an informer is back within a second of its API server. A 429 just after an outage (a
restarted server answers the first request for a custom resource with "storage is
(re)initializing" while that resource's watch cache fills, which takes milliseconds, but
Retry-After counts whole seconds) is retried after `WARMING_RETRY`, doubling up to the
Retry-After it gave, so the grants informer is not the last one back by a second. Each retry
is logged, and the backoff starts over once the server answers again or the kind of failure
changes. A client
read deadline turns a silently stalled connection into an error, so a watch can never hang
unnoticed.

For /healthz, an informer says whether it is *wedged* (`wedged`: no step of its loop, no list
page, event, error or retry, within a bound that every step keeps), and since when the server
has been *refusing* it (`refused_since`: 401, 403, 404 on every attempt, e.g. its RBAC or CRD
removed). Neither says anything about whether the API server is reachable: an informer that
retries an absent server is neither.

An object that cannot be parsed is skipped with a log line that says why (field and message,
never a value). A DELETED event removes the cached key even when the rest of the object does
not parse: the server says it is gone. An object of a list, or a MODIFIED event, that does not
parse keeps what the cache knew of it: it still exists, and a cache that dropped it would
report it as deleted.

The cache's `healthy` is cleared whenever it may be behind the server (before the first list,
while relisting, after a broken watch) and set again once a list or watch succeeds; the
controller makes no delete while any cache is unhealthy. An exception from the store's indexes
is a bug: it is not caught here, so it ends the informer and the process, loudly, rather than
leave a change unseen.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from projector.cache.caches import Cache
from projector.client.api import Api
from projector.client.retries import backoff, retry_after
from projector.core.kinds import Obj
from projector.errors import ApiError, Gone, TooManyRequests

UNREACHABLE_RETRY_MAX = 1.0
"""Cap of the backoff while the API server does not answer at all."""
WARMING_RETRY = 0.1
"""First wait after a 429 from a server just back from an outage; doubles up to Retry-After."""
WEDGE_SLACK = 60.0
"""Added to the longest a healthy loop step may take, before the loop counts as wedged."""

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

log = structlog.get_logger("projector.informer")


class Informer(Generic[K, T]):
    """Keeps one cache current by list+watch."""

    def __init__(
        self,
        api: Api,
        cache: Cache[K, T],
        *,
        timeout_seconds: int = 300,
        read_deadline: float = 90.0,
        on_event: Callable[[str, str], None] | None = None,
        backoff: tuple[float, float] = (0.8, 30.0),
        request_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        after: asyncio.Event | None = None,
    ) -> None:
        self.api = api
        self._after = after
        """Set once this informer may list (another cache must be filled first), if any."""
        self.cache = cache
        self.spec = cache.spec
        self._backoff = backoff
        self._on_event = on_event
        self._timeout_seconds = timeout_seconds
        self._read_deadline = read_deadline
        self.resource_version = ""
        self._clock = clock
        self.failing_since: float | None = None
        """Monotonic time since which every list or watch has failed (None: it works)."""
        self.refused_since: float | None = None
        """Monotonic time since which the server has refused every attempt (401/403/404)."""
        self._need_list = True
        self._unreachable = False
        """The last failure was the server not answering at all (a status of 0), or its
        refusals and 429s just after that, while it warms up."""
        self._warming_429s = 0
        """429s in a row while the server warms up: the short wait doubles with each."""
        self._progress = clock()
        self._step_bound = max(read_deadline, request_timeout) + backoff[1] + WEDGE_SLACK
        """The longest one step of the loop takes when nothing is wrong with this process."""

    def wedged(self) -> bool:
        """No step of the loop (list page, event, error, retry) within its bound: stuck.

        Not while it waits for the cache it comes after: that informer answers for itself.
        """
        if self._after is not None and not self._after.is_set():
            return False
        return self._clock() - self._progress > self._step_bound

    def _alive(self) -> None:
        self._progress = self._clock()

    @property
    def name(self) -> str:
        """The kind this informer caches, for logs and metrics."""
        return self.spec.kind.value

    def _event(self, kind: str) -> None:
        if self._on_event is not None:
            self._on_event(self.name, kind)

    async def _relist(self) -> None:
        """Bring the cache to a fresh list; what vanished is reported as deleted.

        The list is read page by page, each page parsed into the cache before the next is
        asked for; only the keys seen are kept until the end, where whatever the list did not
        contain is removed. A list that expires before its last page (`Gone`) removes nothing:
        the caller starts a fresh one.
        """
        seen: set[K] = set()
        rv = ""
        pages = self.api.pages(
            self.spec.resource, label_selector=self.spec.label_selector, limit=self.spec.page
        )
        async with contextlib.aclosing(pages):
            async for page, version in pages:
                self._alive()
                rv = version
                for k, new in self.spec.keyed(page):
                    seen.add(k)  # it exists: even unparseable, it is not deleted
                    if new is None:
                        continue
                    old = self.cache.put(k, new)
                    if old != new:
                        self._event("ADDED" if old is None else "MODIFIED")
        for k in [k for k in self.cache if k not in seen]:
            self.cache.pop(k)
            self._event("DELETED")
        self.resource_version = rv
        self._event("RELIST")

    def _apply(self, kind: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if rv:
            self.resource_version = str(rv)
        k = self.spec.key_of(obj)
        if k is None:
            return
        if kind == "DELETED":  # gone on the server: only its key matters
            self._event(kind)
            self.cache.pop(k)
            return
        new = self.spec.value_of(obj)
        if new is None:
            return
        self._event(kind)
        self.cache.put(k, new)

    def _retrying(self) -> AsyncRetrying:
        """The policy of list and watch failures: retry API errors forever, waiting `_wait`.

        A Gone never gets here (it relists at once), and anything but an `ApiError` (a bug in
        the store's indexes) ends the informer, loudly.
        """
        return AsyncRetrying(
            stop=stop_never,
            wait=self._wait,
            retry=retry_if_exception_type(ApiError),
            before_sleep=self._failed,
            reraise=True,
        )

    def _wait(self, state: RetryCallState) -> float:
        """How long before the next try: a 429's Retry-After, else backoff with jitter.

        Exponential, capped at 1 s while the server does not answer at all (so the informer
        is back within a second of it) and at `backoff[1]` while it answers with errors; a new
        kind of failure starts over.
        """
        error = state.outcome.exception() if state.outcome is not None else None
        initial, maximum = self._backoff
        status = getattr(error, "status", None)
        # A server back from an outage refuses for a while (401/403: its authorizer's caches
        # are still filling; 429: a custom resource's storage is starting): that is part of
        # the outage, so the short waits hold until the first success, not a backoff towards
        # `backoff[1]` (or a whole second of Retry-After) that would delay the recovery.
        warming = self._unreachable and status in (401, 403, 429)
        if isinstance(error, TooManyRequests):  # the server said when (APF, starting up)
            asked = retry_after(error, cap=maximum)
            if not warming:
                self._warming_429s = 0
                return asked
            self._warming_429s += 1
            return backoff(self._warming_429s, WARMING_RETRY, asked, jitter=0)
        unreachable = status == 0 or warming
        if unreachable != self._unreachable:
            self._unreachable, state.attempt_number = unreachable, 1
        cap = UNREACHABLE_RETRY_MAX if unreachable else maximum
        return backoff(state.attempt_number, min(initial, cap), cap)

    def _failed(self, state: RetryCallState) -> None:
        """Before a retry's sleep: the cache may be behind now; say so and why."""
        self._alive()
        self.cache.healthy.clear()
        now = self._clock()
        first = self.failing_since is None
        if first:
            self.failing_since = now
        error = state.outcome.exception() if state.outcome is not None else None
        status = getattr(error, "status", None)
        if status in (401, 403, 404):
            self.refused_since = self.refused_since or now
        else:
            self.refused_since = None  # refused continuously, or not at all
        (log.warning if first else log.info)(  # later failures of a streak: info, not warning
            "watch failed; retrying",
            kind=self.name,
            status=status,
            reason=getattr(error, "reason", ""),
            attempt=state.attempt_number,
            retry_in=round(state.upcoming_sleep, 2),
        )
        self._event("ERROR")

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        if self._after is not None:
            await self._after.wait()
            self._alive()
        self._need_list = True
        async for attempt in self._retrying():
            with attempt:
                await self._follow(attempt.retry_state)

    async def _follow(self, state: RetryCallState) -> None:
        """List if needed, then watch, watch after watch; return only by raising.

        Any word from the server starts the backoff over (`state.attempt_number = 1`), so a
        failure after a working watch waits the first delay, not the last one.
        """
        healthy = self.cache.healthy
        while True:
            self._alive()
            if not self.resource_version:
                self._need_list = True  # nothing to resume from
            try:
                if self._need_list:
                    healthy.clear()
                    await self._relist()
                    self._need_list = False
                    state.attempt_number, self._unreachable, self._warming_429s = 1, False, 0
                    self.failing_since = self.refused_since = None
                    self.cache.synced.set()
                    healthy.set()
                events = self.api.watch(
                    self.spec.resource,
                    resource_version=self.resource_version,
                    label_selector=self.spec.label_selector,
                    timeout_seconds=self._timeout_seconds
                    + random.randint(0, self._timeout_seconds // 2),
                    read_deadline=self._read_deadline,
                )
                async with contextlib.aclosing(events):  # its connection closes with the loop
                    async for kind, obj in events:
                        self._alive()
                        healthy.set()
                        state.attempt_number, self._unreachable, self._warming_429s = 1, False, 0
                        self.failing_since = self.refused_since = None
                        if kind == "OPEN":
                            self._event("OPEN")  # a sign of life: the server accepted the watch
                            continue
                        if kind == "BOOKMARK":
                            self._event("BOOKMARK")
                            rv = (obj.get("metadata") or {}).get("resourceVersion")
                            if rv:
                                self.resource_version = str(rv)
                            continue
                        self._apply(kind, obj)
                # A normal end (server timeout): resume from the last resourceVersion.
                self._event("WATCH_RESTART")
            except Gone:
                log.info("watch expired; relisting", kind=self.name)
                self._need_list = True
