"""The minimum cut the cost pass (:mod:`graphamp.passes.cost`) solves: its costs, as a flow.

A cost is paid when some member is on another side than its head; the sides are the two
terminals (:data:`LOW`, the source: the low type; :data:`F32`, the sink: float32) and the
variables (free ops, movable graph inputs, the model's own Casts). :func:`cut` gives every
variable the side of the minimum cut with the fewest variables low (ties stay float32).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

LOW, F32 = "S", "T"  # the cut's terminals: the low side (source) and the float32 side (sink)


class Cost(NamedTuple):
    """``cost`` bytes, paid when some member is on another side than ``head``: a value's
    Cast (head its producer, members its readers) or a weight's copy in one type (head the
    other type's terminal). Sides are terminals or variables' names. (A named tuple: a graph
    of 50,000 nodes makes as many, and a frozen dataclass takes three times as long to.)"""

    cost: int
    head: str
    members: tuple[str, ...]

    def paid(self, side: dict[str, str]) -> bool:
        head = side.get(self.head, self.head)
        return any(side.get(m, m) != head for m in self.members)


def cut(costs: list[Cost]) -> dict[str, str]:
    """The minimum cut of ``costs``. A cost paid when some member is on another side than its
    head is two hyperedges: (head float32, a member low) as member -> aux -> head, and (head
    low, a member float32) as head -> aux' -> member; the aux edges are unbounded (None). A
    cost with one member other than its head (most of them: a value one op reads) is the two
    edges member -> head and head -> member instead, with no aux node: the same cuts at the
    same price in half the flow graph. The regions that share no cost are cut in one flow (one
    call: a graph of 50,000 nodes has thousands of them); the cut of each is the same as
    alone."""
    variables = list(dict.fromkeys(v for c in costs for v in (c.head, *c.members)))
    variables = [v for v in variables if v not in (LOW, F32)]
    index = {LOW: 0, F32: 1}  # the flow's nodes by number: terminals, variables, aux nodes
    for name in variables:
        index[name] = len(index)
    edges: dict[tuple[int, int], int | None] = {}

    def add(tail: int, head: int, cost: int | None) -> None:
        was = edges.get((tail, head), 0)  # parallel edges add up; unbounded stays unbounded
        edges[tail, head] = None if cost is None or was is None else was + cost

    nodes = len(index)
    for cost in costs:
        head = index[cost.head]
        members = [index[m] for m in cost.members if m != cost.head]
        if len(members) == 1:
            (member,) = members
            if head != 0 and member != 1:
                add(member, head, cost.cost)
            if head != 1 and member != 0:
                add(head, member, cost.cost)
            continue
        if head != 0 and any(m != 1 for m in members):
            aux, nodes = nodes, nodes + 1
            add(aux, head, cost.cost)
            for m in members:
                if m != 1:
                    add(m, aux, None)
        if head != 1 and any(m != 0 for m in members):
            aux, nodes = nodes, nodes + 1
            add(head, aux, cost.cost)
            for m in members:
                if m != 0:
                    add(aux, m, None)
    low_side = minimal_source_side(nodes, edges)
    return {v: LOW if low_side[index[v]] else F32 for v in variables}


def minimal_source_side(nodes: int, edges: dict[tuple[int, int], int | None]) -> list[bool]:
    """Which of ``nodes`` (0 the source, 1 the sink) are on the low side of the minimum cut
    of ``edges`` (capacities; None unbounded) with the fewest nodes on it: what the source
    reaches in the residual network of a maximum flow (the same set for every maximum flow,
    so a tie stays float32 whatever the flow algorithm did).

    The flow is Dinic's (shortest augmenting paths, a blocking flow per BFS level graph) over
    integer arrays: networkx's ``boykov_kolmogorov`` on a DiGraph gives the same set, at three
    times the cost on a 50,000-node chain, most of it building the DiGraph. An unbounded edge
    carries more than all bounded ones together (no path of unbounded edges joins the
    terminals: each cost's aux node has one bounded edge), so it is never cut."""
    bounded = sum(c for c in edges.values() if c is not None)
    unbounded = 3 * bounded + 1
    adjacent: list[list[int]] = [[] for _ in range(nodes)]
    target: list[int] = []  # arc 2k is an edge, arc 2k + 1 its reverse (capacity 0)
    residual: list[int] = []
    for (u, v), capacity in edges.items():
        if capacity == 0:
            continue
        adjacent[u].append(len(target))
        target.append(v)
        residual.append(unbounded if capacity is None else capacity)
        adjacent[v].append(len(target))
        target.append(u)
        residual.append(0)
    while True:
        level = _levels(adjacent, target, residual)
        if level[1] < 0:
            break
        _blocking_flow(adjacent, target, residual, level)
    return [depth >= 0 for depth in level]


def _levels(adjacent: list[list[int]], target: list[int], residual: list[int]) -> list[int]:
    """Each node's distance from the source over arcs with capacity left (-1: unreached),
    as far as the sink's: a node farther than the sink is on no shortest path to it (left
    unreached), so only where the sink is unreached does every node get its distance."""
    level = [-1] * len(adjacent)
    level[0] = 0
    queue = deque([0])
    while queue:
        node = queue.popleft()
        if 0 <= level[1] <= level[node]:
            break  # the rest lie as far as the sink or farther
        depth = level[node] + 1
        for arc in adjacent[node]:
            near = target[arc]
            if level[near] < 0 and residual[arc]:
                level[near] = depth
                queue.append(near)
    return level


def _blocking_flow(
    adjacent: list[list[int]], target: list[int], residual: list[int], level: list[int]
) -> None:
    """Augment along shortest paths until none is left in the level graph (each node's
    current arc only moves forward: an arc that led nowhere or is full is not tried again)."""
    current = [0] * len(adjacent)
    path: list[int] = []  # arcs from the source
    node = 0
    while True:
        if node == 1:
            pushed = min(residual[arc] for arc in path)
            for arc in path:
                residual[arc] -= pushed
                residual[arc ^ 1] += pushed
            path.clear()
            node = 0
            continue
        arcs, at, deeper = adjacent[node], current[node], level[node] + 1
        while at < len(arcs) and not (residual[arcs[at]] and level[target[arcs[at]]] == deeper):
            at += 1
        current[node] = at
        if at < len(arcs):
            path.append(arcs[at])
            node = target[arcs[at]]
        elif not path:
            return  # the source has no way on: the blocking flow is found
        else:  # a dead end: back one arc, and past it
            node = target[path.pop() ^ 1]
            current[node] += 1
