"""The work queue's per-key timing: the exponential backoff of failing keys, the hot keys' windows.

Both are pure bookkeeping over times handed in (no clock, no loop), so `queue.WorkQueue` keeps
only the heap, the states and the wake-ups; the rules for how long a key waits live here.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Generic, TypeVar

from projector.client.retries import backoff

K = TypeVar("K", bound=Hashable)

COMPACT_SLACK: Final = 64
"""Stale entries a lazily cleaned table may hold beyond twice its live ones before a rebuild."""


class Backoff(Generic[K]):
    """Failure counts per key, and the exponential delay each next retry waits."""

    def __init__(self, base: float, maximum: float) -> None:
        if base < 0 or maximum < 0:
            raise ValueError(f"backoffs must be >= 0: {base}, {maximum}")
        self._base = base
        self._max = maximum
        self._failures: dict[K, int] = {}

    def fail(self, key: K, cap: float | None, floor: float) -> float:
        """Count a failure of `key`; return its delay, at most `cap`, never under `floor`."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = self.delay(failures)
        if cap is not None:
            delay = min(delay, cap)
        return max(delay, floor)

    def delay(self, failures: int) -> float:
        """The delay after `failures` earlier failures: doubling from the base, capped."""
        return backoff(failures + 1, self._base, self._max, jitter=0)

    def forget(self, key: K) -> None:
        """Reset the count of `key`, after it succeeded or was deleted."""
        self._failures.pop(key, None)

    def count(self, key: K) -> int:
        """How many failures `key` has had since it was last forgotten."""
        return self._failures.get(key, 0)

    def __len__(self) -> int:
        """The number of keys with failures not yet forgotten."""
        return len(self._failures)


class Windows(Generic[K]):
    """The debounce window each key opens: doubled while it is hot, normal once it is cold.

    A key is hot when its last window collapsed several adds and it is added again within a
    window of that run; a key quiet for a whole window is cold again.
    """

    def __init__(self, debounce: float, debounce_max: float, hot_max: float | None) -> None:
        self._debounce = debounce
        self._debounce_max = debounce_max
        self.hot_max = debounce_max if hot_max is None else hot_max
        if self.hot_max < debounce_max:
            raise ValueError(f"need debounce_max <= debounce_hot_max: {hot_max}")
        self._hot: dict[K, float] = {}  # hot keys' window (absent: debounce_max)
        self._released: dict[K, float] = {}  # when each key's last busy window ended

    def open(self, key: K, now: float) -> tuple[float, float]:
        """The window `key` opens now, and how far each add within it pushes the key back."""
        window = self._hot.get(key, self._debounce_max)
        last = self._released.pop(key, None)
        if last is not None and now - last < window:  # added again soon after its last run
            window = self._hot[key] = min(2 * window, self.hot_max)
        else:
            window = self._debounce_max
            self._hot.pop(key, None)
        trailing = self._debounce if window <= self._debounce_max else self._debounce_max
        return window, trailing

    def closed(self, key: K, deadline: float, adds: int) -> None:
        """Note that the window of `key` ended at `deadline` after `adds` adds."""
        if adds > 1 and self.hot_max > self._debounce_max:  # a busy window
            self._released[key] = deadline
            if len(self._released) > 2 * len(self._hot) + COMPACT_SLACK:
                self._forget_cold(deadline)

    def _forget_cold(self, now: float) -> None:
        """Drop release times too old to make any key hot (deleted grants' keys, too)."""
        self._released = {k: t for k, t in self._released.items() if now - t < self.hot_max}
