"""The search behind ``graphamp tune``: a small set of nodes to keep float32, by delta debugging.

Dialect-neutral: it sees node names and a test, ``meets(kept) -> bool``, that says whether the
model meets its tolerance with the nodes ``kept`` in float32 (and the rest as the plan decides).
More nodes in float32 is assumed to be no worse (true of rounding errors almost always; the
result is checked all the same). The search:

1. ``meets(∅)``: nothing to keep. ``meets(all)`` false: no set of these nodes can help.
2. Along ``ranked`` (worst first, by the error each node adds), the shortest prefix that meets
   the tolerance: lengths 1, 2, 4, ... until one does, then bisection between the last two.
3. That prefix reduced: its last node is needed (the prefix without it fails), so it is tried
   alone first; otherwise the rest of the prefix is reduced, with the last node always kept,
   by delta debugging (Zeller's ddmin, complements only): drop chunks of halves, quarters, ...
   down to single nodes while the rest still meets the tolerance. The result is 1-minimal
   (dropping any one of its nodes misses the tolerance) when more float32 is never worse.

Each distinct set is evaluated once (answers are cached); ``evaluations`` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SearchResult:
    kept: tuple[str, ...]  # the set found, in rank order
    evaluations: int  # distinct sets evaluated
    met: bool  # whether ``kept`` meets the tolerance
    prefix: int  # the length of the shortest passing prefix (step 2)


class _Cached:
    def __init__(self, meets: Callable[[frozenset[str]], bool]) -> None:
        self.meets = meets
        self.answers: dict[frozenset[str], bool] = {}

    def __call__(self, kept: Sequence[str]) -> bool:
        key = frozenset(kept)
        if key not in self.answers:
            self.answers[key] = self.meets(key)
        return self.answers[key]


def find_kept(ranked: Sequence[str], meets: Callable[[frozenset[str]], bool]) -> SearchResult:
    """The set to keep float32 (module docstring); ``ranked`` holds each candidate once."""
    test = _Cached(meets)
    ranked = list(dict.fromkeys(ranked))
    if test([]):
        return SearchResult((), len(test.answers), True, 0)
    if not ranked or not test(ranked):
        return SearchResult(tuple(ranked), len(test.answers), False, len(ranked))
    prefix = _shortest_prefix(ranked, test)
    # The prefix one shorter fails, so its last node is needed with the rest of the prefix:
    # try it alone first (a single culprit is the common case), else reduce the rest with it.
    last = ranked[prefix - 1]
    if test([last]):
        return SearchResult((last,), len(test.answers), True, prefix)
    rest = ddmin(ranked[: prefix - 1], lambda kept: test([*kept, last]))
    return SearchResult((*rest, last), len(test.answers), True, prefix)


def _shortest_prefix(ranked: list[str], test: Callable[[Sequence[str]], bool]) -> int:
    """The smallest k with ``test(ranked[:k])``, given that the whole list passes and the
    empty one does not (galloping, then bisection)."""
    failing, length = 0, 1
    while length < len(ranked) and not test(ranked[:length]):
        failing, length = length, min(2 * length, len(ranked))
    passing = length
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if test(ranked[:middle]):
            passing = middle
        else:
            failing = middle
    return passing


def ddmin(kept: list[str], test: Callable[[Sequence[str]], bool]) -> list[str]:
    """``kept`` (which passes) reduced to a 1-minimal passing subset, keeping its order."""
    granularity = 2
    while len(kept) >= 2:
        size = -(-len(kept) // granularity)  # ceil
        chunks = [kept[i : i + size] for i in range(0, len(kept), size)]
        for chunk in chunks:
            rest = [name for name in kept if name not in chunk]
            if test(rest):
                kept = rest
                granularity = max(granularity - 1, 2)
                break
        else:
            if granularity >= len(kept):
                break
            granularity = min(2 * granularity, len(kept))
    return kept
