"""An asyncio work queue with client-go ``workqueue`` semantics and a trailing debounce.

Reconciliation is level-based, so the queue carries only keys, never events, and its job is to
run each key *often enough but never twice at once*. Each key is in exactly one of three states,
and, independently, is or is not being processed:

* **idle**: nothing pending.
* **waiting**: it has a deadline in the timer heap (debounce window, ``add_after`` or backoff).
* **dirty**: it needs a run now. A dirty key that is not processing sits in the FIFO ready
  queue, at most once; a dirty key that is processing is re-queued by ``done()``.

The client-go invariants follow: N adds collapse into one run; a key is never handed to two
getters at once (``get`` moves it to *processing*, and adds meanwhile only mark it dirty); ready
keys come out in FIFO order; adds after ``shut_down()`` are dropped.

Delays, all per key and all driven by one heap of ``(deadline, seq, key)``:

* ``add`` is debounced: the first add at ``t0`` schedules the key at ``t0 + debounce``; each
  further add at ``t`` pushes it back to ``min(t + debounce, t0 + debounce_max)``, so a burst
  collapses into one run while latency stays bounded. The window restarts once the key becomes
  dirty. With ``debounce == 0`` the key is ready at once.
* A *hot* key, one whose last window collapsed several adds and that is added again within a
  window of its run, gets a window twice as long (up to ``debounce_hot_max``), which ends after
  ``debounce_max`` of quiet or at its cap; a key quiet for a whole window is cold again, and
  changes made one at a time, each after the last one's run, never make a key hot. A source
  rewritten many times a second costs a handful of writes per copy, not one per
  ``debounce_max``, while a lone change keeps its short latency. (A quiet gap of ``debounce``
  cannot cool a key: under load, events arrive in clumps with such gaps.)
* ``add_after`` and ``add_rate_limited`` (exponential per-key backoff) only ever move a deadline
  *earlier*, and a later debounced add can never push the key past them.
* ``add_now`` bypasses every delay. A key that is already dirty absorbs all adds: the run it is
  waiting for reads the latest state anyway.

Deadlines come from a :class:`Clock` (the running loop's clock by default, so virtual-time loops
work). One ``loop.call_at`` timer, armed for the earliest deadline, calls :meth:`WorkQueue.poll`;
with a fake clock, tests advance the clock and call ``poll()`` themselves. Entries are deleted
lazily: pushing a deadline back only updates the key's record and the old heap entry is re-pushed
when it pops, so every operation is O(log n) and the heap is compacted when stale entries pile up.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Generic, Protocol, TypeVar

from projector.control.delays import COMPACT_SLACK, Backoff, Windows

__all__ = ["Clock", "QueueShutDown", "WorkQueue"]

K = TypeVar("K", bound=Hashable)


class Clock(Protocol):
    """A monotonic time source, injectable so tests can move time by hand."""

    def now(self) -> float:
        """Return monotonic seconds."""
        ...


class QueueShutDown(Exception):  # named like asyncio.QueueShutDown (3.13)
    """Raised by :meth:`WorkQueue.get` once the queue is shut down and nothing is ready."""


class _Pending:
    """The delay record of a waiting key (mutable, so pushing it back costs no heap push)."""

    __slots__ = ("adds", "deadline", "first", "hard", "seq", "trailing", "window")

    def __init__(self, deadline: float, seq: int, first: float | None, hard: float) -> None:
        self.deadline = deadline  # when the key becomes dirty
        self.seq = seq  # identifies the heap entry that is live for this key
        self.first = first  # start of the debounce window; None if no debounced add yet
        self.hard = hard  # earliest add_after deadline: debounce never pushes past it
        self.window = 0.0  # longest the debounce may push it back, from `first`
        self.trailing = 0.0  # each debounced add pushes it back this far
        self.adds = 0  # debounced adds collapsed into this run


class WorkQueue(Generic[K]):
    """Deduplicating, debouncing, rate-limiting work queue of keys (see the module docstring).

    Args:
        debounce: Trailing window of :meth:`add`, in seconds; 0 makes ``add`` immediate.
        debounce_max: Longest a key may be pushed back by repeated adds, from its first add.
        debounce_hot_max: Longest window of a hot key (doubling from ``debounce_max``); None
            keeps every window at ``debounce_max``.
        backoff_base: First delay of :meth:`add_rate_limited`; it doubles on each failure.
        backoff_max: Cap of the rate-limited delay.
        clock: Time source for deadlines. None uses the running loop's ``time()``, so delayed
            adds then need a running loop.
        on_event: Metrics hook, called synchronously with an event name and the key: a key
            newly needs work (``added``), an add absorbed by a key already waiting or dirty
            (``coalesced``; ``added + coalesced`` is every add call), a rate-limited retry
            (``retried``, then ``added``/``coalesced``), an add after shutdown (``dropped``).
    """

    def __init__(
        self,
        *,
        debounce: float = 0.0,
        debounce_max: float = 1.0,
        debounce_hot_max: float | None = None,
        backoff_base: float = 0.005,
        backoff_max: float = 300.0,
        clock: Clock | None = None,  # None: loop.time()
        on_event: Callable[[str, K], None] | None = None,
    ) -> None:
        if debounce < 0 or debounce_max < debounce:
            raise ValueError(f"need 0 <= debounce <= debounce_max: {debounce}, {debounce_max}")
        self._debounce = debounce
        self._backoff: Backoff[K] = Backoff(backoff_base, backoff_max)
        self._windows: Windows[K] = Windows(debounce, debounce_max, debounce_hot_max)
        self._clock = clock
        self._on_event = on_event

        self._queue: deque[K] = deque()  # ready: dirty and not processing, FIFO
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._pending: dict[K, _Pending] = {}  # waiting keys
        self._heap: list[tuple[float, int, K]] = []  # (deadline, seq, key), lazily deleted
        self._seq = itertools.count()
        self._shutting_down = False

        self._getters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = math.inf

    # -- adding ---------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Add ``key`` after the trailing debounce window, so bursts collapse into one run."""
        if self._absorbed(key):
            return
        if self._debounce <= 0:
            self._release(key)
            return
        now = self._now()
        pending = self._pending.get(key)
        if pending is None:
            self._emit("added", key)
            pending = _Pending(now, next(self._seq), now, math.inf)
            self._open_window(key, pending, now)
            pending.adds = 1
            pending.deadline = now + pending.trailing  # trailing <= window, checked in __init__
            self._schedule(key, pending)
            return
        self._emit("coalesced", key)
        if pending.first is None:
            pending.first = now
            self._open_window(key, pending, now)
        pending.adds += 1
        target = min(now + pending.trailing, pending.first + pending.window, pending.hard)
        if target < pending.deadline:
            self._move_earlier(key, pending, target)
        else:
            pending.deadline = target  # pushed back lazily: the heap entry re-pushes on pop

    def _open_window(self, key: K, pending: _Pending, now: float) -> None:
        """Size the debounce window `key` opens now: doubled if it is hot, normal if cold."""
        pending.window, pending.trailing = self._windows.open(key, now)

    def add_now(self, key: K) -> None:
        """Add ``key`` bypassing any debounce or delay, for changes that must not wait."""
        if self._absorbed(key):
            return
        self._release(key)

    def add_idle(self, key: K) -> bool:
        """Add ``key`` now only if it is idle (not waiting, dirty or processing); tell if it was.

        For a periodic resync: a key with a run pending gets it anyway, and a key backing off
        keeps its backoff.
        """
        if self._shutting_down or key in self._dirty or key in self._processing:
            return False
        if key in self._pending:
            return False
        self._release(key)
        return True

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` in ``delay`` seconds; a key already waiting only ever moves earlier."""
        if self._absorbed(key):
            return
        if delay <= 0:
            self._release(key)
            return
        target = self._now() + delay
        pending = self._pending.get(key)
        if pending is None:
            self._emit("added", key)
            self._schedule(key, _Pending(target, next(self._seq), None, target))
            return
        self._emit("coalesced", key)
        if target < pending.hard:
            pending.hard = target
        if target < pending.deadline:
            self._move_earlier(key, pending, target)

    def _absorbed(self, key: K) -> bool:
        """Drop an add after shutdown, or fold it into a dirty key: True if nothing is left."""
        if self._shutting_down:
            self._emit("dropped", key)
            return True
        if key in self._dirty:
            self._emit("coalesced", key)
            return True
        return False

    def add_rate_limited(self, key: K, cap: float | None = None, floor: float = 0.0) -> float:
        """Retry ``key`` after its exponential backoff, so a failing key cannot hot-loop.

        ``cap`` bounds this delay below ``backoff_max`` (a retry that waits on a cache, not on
        the key itself); ``floor`` is a wait the server asked for (Retry-After), never cut.
        Returns the delay, or 0 after shutdown.
        """
        if self._shutting_down:
            self._emit("dropped", key)
            return 0.0
        delay = self._backoff.fail(key, cap, floor)
        self._emit("retried", key)
        self.add_after(key, delay)
        return delay

    def backoff(self, failures: int) -> float:
        """Return the rate-limited delay after ``failures`` earlier failures."""
        return self._backoff.delay(failures)

    def forget(self, key: K) -> None:
        """Reset the failure count of ``key``, after it succeeded or was deleted."""
        self._backoff.forget(key)

    def num_requeues(self, key: K) -> int:
        """Return how many rate-limited retries ``key`` has had since it was last forgotten."""
        return self._backoff.count(key)

    # -- consuming ------------------------------------------------------------------------------

    async def get(self) -> K:
        """Wait for a ready key and mark it processing; pair every call with :meth:`done`.

        Raises:
            QueueShutDown: The queue is shut down and no key is ready.
        """
        queue = self._queue
        while not queue:
            if self._shutting_down:
                raise QueueShutDown
            if self._heap:
                self.poll()  # a fake clock may have moved; also arms the timer if adds came early
                if queue:
                    break
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                with contextlib.suppress(ValueError):
                    self._getters.remove(getter)
                if queue and not getter.cancelled():
                    self._wake_getter()  # it was woken for a key it will not take: pass it on
                raise
        key = queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    async def __aiter__(self) -> AsyncIterator[K]:
        """Each key :meth:`get` hands out, until the queue shuts down; :meth:`done` each one."""
        while True:
            try:
                key = await self.get()
            except QueueShutDown:
                return
            yield key

    def done(self, key: K) -> None:
        """Finish processing ``key``; if it was added meanwhile, it is ready again now.

        A key re-added meanwhile through a delay (debounce, ``add_after``) keeps that delay.

        Raises:
            ValueError: ``key`` is not processing (``done`` twice, or without ``get``).
        """
        try:
            self._processing.remove(key)
        except KeyError:
            raise ValueError(f"done() for a key that is not processing: {key!r}") from None
        if key in self._dirty:
            self._queue.append(key)
            if self._getters:
                self._wake_getter()

    def shut_down(self) -> None:
        """Stop accepting adds and wake all getters; ready keys are still handed out.

        Waiting keys are dropped: nothing would run them. Keys dirty while processing are
        re-queued by ``done()``, as in client-go.
        """
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_deadline = math.inf
        self._pending.clear()
        self._heap.clear()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)

    # -- introspection --------------------------------------------------------------------------

    def __len__(self) -> int:
        """Return the number of ready keys (the queue depth)."""
        return len(self._queue)

    def failing(self) -> int:
        """Return the number of keys with failures not yet forgotten (backing off)."""
        return len(self._backoff)

    def waiting(self) -> int:
        """Return the number of keys waiting for a deadline (debounce, delay or backoff)."""
        return len(self._pending)

    def debouncing(self) -> int:
        """Return the number of waiting keys inside a debounce window (a change not yet run).

        Unlike :meth:`waiting`, it leaves out keys only delayed by ``add_after`` (a periodic
        recheck), so "nothing debouncing, nothing failing, nothing ready or processing" says
        every change seen so far has been acted on.
        """
        return sum(1 for p in self._pending.values() if p.first is not None)

    @property
    def processing(self) -> frozenset[K]:
        """The keys handed out by ``get()`` and not yet ``done()``."""
        return frozenset(self._processing)

    # -- timers ---------------------------------------------------------------------------------

    def poll(self) -> int:
        """Move due keys to ready; called by timers, and by tests with a fake clock.

        Returns:
            The number of keys that became dirty.
        """
        released = self._release_due(self._now()) if self._heap else 0
        self._arm()
        return released

    def _on_timer(self) -> None:
        self._timer = None
        now = self._now()
        if self._clock is None:
            # The loop runs handles up to its clock resolution early; don't spin on them.
            now = max(now, self._timer_deadline)
        self._timer_deadline = math.inf
        self._release_due(now)
        self._arm()

    def _release_due(self, now: float) -> int:
        heap, pending_by_key = self._heap, self._pending
        released = 0
        while heap and heap[0][0] <= now:
            deadline, seq, key = heapq.heappop(heap)
            pending = pending_by_key.get(key)
            if pending is None or pending.seq != seq:
                continue  # stale: released or moved earlier since
            if pending.deadline > deadline:
                heapq.heappush(heap, (pending.deadline, seq, key))  # pushed back meanwhile
                continue
            del pending_by_key[key]
            self._windows.closed(key, deadline, pending.adds)
            self._make_dirty(key)
            released += 1
        return released

    def _arm(self) -> None:
        """Keep one timer armed for the earliest heap entry (possibly stale: harmless)."""
        if not self._heap or self._shutting_down:
            return
        deadline = self._heap[0][0]
        if self._timer is not None:
            if self._timer_deadline <= deadline:
                return
            self._timer.cancel()
            self._timer = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: get() arms it
        when = deadline if self._clock is None else loop.time() + (deadline - self._clock.now())
        self._timer = loop.call_at(when, self._on_timer)
        self._timer_deadline = deadline

    # -- internals ------------------------------------------------------------------------------

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock.now()
        return asyncio.get_running_loop().time()

    def _emit(self, event: str, key: K) -> None:
        if self._on_event is not None:
            self._on_event(event, key)

    def _release(self, key: K) -> None:
        """Make a key that is not dirty dirty now, cancelling any delay it had (the hot path)."""
        pending = self._pending.pop(key, None) if self._pending else None
        if self._on_event is not None:
            self._on_event("added" if pending is None else "coalesced", key)
        self._make_dirty(key)

    def _make_dirty(self, key: K) -> None:
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            if self._getters:
                self._wake_getter()

    def _wake_getter(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _schedule(self, key: K, pending: _Pending) -> None:
        self._pending[key] = pending
        self._push(pending.deadline, pending.seq, key)

    def _move_earlier(self, key: K, pending: _Pending, deadline: float) -> None:
        pending.deadline = deadline
        pending.seq = next(self._seq)  # orphans the old, later heap entry
        self._push(deadline, pending.seq, key)

    def _push(self, deadline: float, seq: int, key: K) -> None:
        heap = self._heap
        if len(heap) > 2 * len(self._pending) + COMPACT_SLACK:
            # Stale entries (released or moved-earlier keys) outnumber live ones: rebuild, O(n)
            # but amortised O(1) as at least n pushes happened since the last rebuild.
            heap[:] = [(p.deadline, p.seq, k) for k, p in self._pending.items() if k != key]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, seq, key))
        if deadline < self._timer_deadline:
            self._arm()
