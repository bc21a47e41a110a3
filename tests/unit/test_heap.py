"""The heap is settled once the caches are synced: what is alive then leaves the collector."""

from __future__ import annotations

import gc
import weakref

from projector.app import settle_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_settling_the_heap_collects_cycles_then_freezes_what_is_alive() -> None:
    alive = Node()
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage  # unreachable, but a cycle: only a collection frees it
    try:
        settle_heap()
        assert gone() is None  # collected before the freeze, not frozen for good
        assert gc.get_freeze_count() > 0
        assert gc.is_tracked(alive) and alive.me is alive  # frozen, not freed
    finally:
        gc.unfreeze()
