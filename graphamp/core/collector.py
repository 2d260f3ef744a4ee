"""Pausing Python's cyclic garbage collector while a large graph is built.

Reading and converting a graph allocates a few objects per node and frees almost none of them
until the end, which is the worst case for the collector: each full collection walks every live
object, and there are several while a 50,000-node graph is read (about half of the conversion's
time). Reference counting still frees everything that has no cycle; cycles made meanwhile are
collected after the block, at the next collection Python would make anyway.
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
            gc.enable()
