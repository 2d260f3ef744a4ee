"""Pausing Python's cyclic garbage collector while a large graph is built.

Reading and converting a graph allocates a few objects per node and frees almost none of them
until the end, which is the worst case for the collector: each full collection walks every live
object, and there are several while a large graph is read, each longer than the last.
Reference counting still frees everything that has no cycle; cycles made meanwhile are
collected after the block, at the next full collection.

The objects a block leaves alive (the graph, the plan, the converted model) live long, so at
its end they join the oldest generation at once (``gc.freeze`` then ``gc.unfreeze``, which
hands every tracked object to the oldest generation untraversed) instead of being traversed by
the first young collection after it and again by the next. Where the caller keeps objects
frozen itself (a server that freezes before forking), nothing is unfrozen: the block's objects
then age as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Run the block with the cyclic collector off; it is switched back on only if it was on
    (nested blocks and callers that turned it off themselves are left as they were)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if gc.get_freeze_count() == 0:  # unfreezing would thaw nothing of the caller's
                gc.freeze()
                gc.unfreeze()
            gc.enable()
