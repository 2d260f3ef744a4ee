"""graphamp.core.collector.paused: the cyclic collector off in the block and back on after it,
the block's survivors alive and its cycles collected afterwards, the caller's own frozen objects
left frozen. (Which generation the survivors join is CPython's business, not asserted here.)"""

from __future__ import annotations

import gc
import weakref

from graphamp.core import collector


class Cyclic:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_the_collector_is_off_in_the_block_and_on_after_it():
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():  # nested: the outer block switches it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_blocks_survivors_live_on_and_its_cycles_are_collected_after_it():
    gc.collect()
    with collector.paused():
        kept = [[index] for index in range(1000)]  # long-lived, as a read graph is
        cycle = weakref.ref(Cyclic())
        gc.collect()  # an explicit collection still runs, the block's objects still reachable
        assert cycle() is None
        cycle = weakref.ref(Cyclic())
    assert cycle() is not None  # nothing collected it automatically in the block ...
    gc.collect()
    assert cycle() is None  # ... and the full collection after it finds the block's cycle
    assert kept[999] == [999]


def test_cycles_the_caller_froze_stay_frozen():
    """A caller that freezes its objects (a server before forking) keeps them out of every
    collection: the block hands its own survivors on without thawing the caller's."""
    gc.collect()
    frozen = weakref.ref(Cyclic())  # garbage, but frozen before anything collects it
    gc.freeze()
    try:
        with collector.paused():
            made = weakref.ref(Cyclic())
        gc.collect()
        assert frozen() is not None  # still frozen: no collection looks at it
        assert made() is None  # the block's own cycle is collected as usual
    finally:
        gc.unfreeze()
    gc.collect()
    assert frozen() is None  # thawed by the caller, it is garbage like any other
