"""graphamp.core.collector.paused: the cyclic collector off in the block, the block's survivors
handed to the oldest generation at its end, the caller's own frozen objects left frozen."""

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


def test_the_blocks_survivors_skip_the_young_generations_and_cycles_are_still_collected():
    gc.collect()
    with collector.paused():
        kept = [[index] for index in range(50_000)]  # long-lived, as a read graph is
        cycle = weakref.ref(Cyclic())
    # 50,000 new containers would make the young generation's count 50,000 and the first
    # young collection traverse them all; handed to the oldest generation, it starts at zero.
    assert gc.get_count()[0] < 1000
    assert gc.get_freeze_count() == 0 and gc.is_tracked(kept[0])
    assert cycle() is not None  # no collection ran ...
    gc.collect()
    assert cycle() is None  # ... and the full one finds the block's cycle


def test_objects_the_caller_froze_stay_frozen():
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector.paused():
            kept = [[index] for index in range(1000)]
        assert gc.get_freeze_count() == frozen  # nothing of the caller's thawed
        assert len(kept) == 1000
    finally:
        gc.unfreeze()
