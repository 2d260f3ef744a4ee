"""The minimum cut the cost pass (:mod:`graphamp.passes.cost`) solves: its costs, as a flow.

A cost is paid when some member is on another side than its head. The sides are numbered: the
two terminals (:data:`LOW` = 0, the source: the low type; :data:`F32` = 1, the sink: float32)
and the variables 2, 3, ... (free ops, movable graph inputs, the model's own Casts, numbered by
:mod:`graphamp.passes.cost_terms`). A side assignment is a list indexed by those numbers whose
entries are the terminals (a terminal is on its own side). :func:`cut` gives every variable the
side of the minimum cut with the fewest variables low (ties stay float32).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

LOW, F32 = 0, 1  # the cut's terminals: the low side (source) and the float32 side (sink)


class Cost(NamedTuple):
    """``cost`` bytes, paid when some member is on another side than ``head``: a value's
    Cast (head its producer, members its readers) or a weight's copy in one type (head the
    other type's terminal). Members never repeat and never include the head (a member on
    the head's side pays nothing, whatever the cut). (A named tuple: a graph of 50,000 nodes
    makes as many, and a frozen dataclass takes three times as long to.)"""

    cost: int
    head: int
    members: tuple[int, ...]

    def paid(self, side: list[int]) -> bool:
        head = side[self.head]
        return any(side[m] != head for m in self.members)


class Network:
    """A flow network over numbered nodes (0 the source, 1 the sink), built an edge at a time.

    An edge from the source or to the sink adds to a per-node capacity (most of the cost pass's
    edges do: a value whose producer or reader is fixed), and a node's source and sink capacity
    are joined (a path source -> node -> sink) before the flow starts: what the flow would push
    along such a path first, in one step per node instead of one search. An edge between two
    other nodes is an arc pair carrying both directions' capacities (a Cast between two free
    ops is one edge each way: one pair, not two). ``unbounded`` is a capacity above what all
    bounded edges carry together (no path of unbounded edges joins the terminals, so such an
    edge is never cut)."""

    def __init__(self, nodes: int, unbounded: int) -> None:
        self.nodes = nodes
        self.unbounded = unbounded
        self.from_source = [0] * nodes
        self.to_sink = [0] * nodes
        self.tails: list[int] = []
        self.heads: list[int] = []
        self.forward: list[int] = []
        self.backward: list[int] = []

    def add_node(self) -> int:
        self.from_source.append(0)
        self.to_sink.append(0)
        self.nodes += 1
        return self.nodes - 1

    def add_edge(self, tail: int, head: int, capacity: int, back: int = 0) -> None:
        """An edge ``tail -> head`` of ``capacity`` (and ``head -> tail`` of ``back``)."""
        if tail > F32 and head > F32:
            self.tails.append(tail)
            self.heads.append(head)
            self.forward.append(capacity)
            self.backward.append(back)
        else:
            self._terminal_edge(tail, head, capacity)
            self._terminal_edge(head, tail, back)

    def _terminal_edge(self, tail: int, head: int, capacity: int) -> None:
        if tail == LOW:
            self.from_source[head] += capacity
        elif head == F32:
            self.to_sink[tail] += capacity
        # else an edge into the source or out of the sink: no maximum flow uses it

    def minimal_source_side(self) -> list[bool]:
        """Which nodes are on the low side of the minimum cut with the fewest nodes on it: what
        the source reaches in the residual network of a maximum flow (the same set for every
        maximum flow, so a tie stays float32 whatever the flow algorithm did).

        The flow is Dinic's (shortest augmenting paths, a blocking flow per BFS level graph)
        over integer arrays: networkx's ``boykov_kolmogorov`` on a DiGraph gives the same set,
        at three times the cost on a 50,000-node chain, most of it building the DiGraph."""
        adjacent: list[list[int]] = [[] for _ in range(self.nodes)]
        target: list[int] = []  # arc 2k is an edge, arc 2k + 1 its reverse
        residual: list[int] = []

        def arc(tail: int, head: int, forward: int, backward: int) -> None:
            adjacent[tail].append(len(target))
            target.append(head)
            residual.append(forward)
            adjacent[head].append(len(target))
            target.append(tail)
            residual.append(backward)

        for node, (source, sink) in enumerate(zip(self.from_source, self.to_sink, strict=True)):
            through = min(source, sink)  # pushed source -> node -> sink (the reverse arcs
            if source > through:  # lead into the source or out of the sink: never used)
                arc(LOW, node, source - through, 0)
            if sink > through:
                arc(node, F32, sink - through, 0)
        for tail, head, forward, backward in zip(
            self.tails, self.heads, self.forward, self.backward, strict=True
        ):
            if forward or backward:
                arc(tail, head, forward, backward)
        while True:
            level = _levels(adjacent, target, residual)
            if level[F32] < 0:
                break
            _blocking_flow(adjacent, target, residual, level)
        return [depth >= 0 for depth in level]


def cut(variables: int, costs: list[Cost]) -> list[int]:
    """The side of each of the ``variables`` numbers (0 and 1 the terminals) in the minimum
    cut of ``costs`` with the fewest variables low; a variable in no cost is float32.

    A cost paid when some member is on another side than its head is two hyperedges: (head
    float32, a member low) as member -> aux -> head, and (head low, a member float32) as head
    -> aux' -> member; the aux edges are unbounded. A cost with one member (most of them: a
    value one op reads) is the edge member -> head and head -> member instead, with no aux
    node: the same cuts at the same price in a smaller flow graph. The regions that share no
    cost are cut in one flow (one call: a graph of 50,000 nodes has thousands of them); the
    cut of each is the same as alone."""
    # every bounded edge carries at most its cost, and a cost makes at most two of them
    network = Network(variables, unbounded=2 * sum(c.cost for c in costs) + 1)
    unbounded = network.unbounded
    for cost, head, members in costs:
        if len(members) == 1:
            network.add_edge(members[0], head, cost, cost)
            continue
        if head != LOW and any(m != F32 for m in members):
            aux = network.add_node()
            network.add_edge(aux, head, cost)
            for m in members:
                network.add_edge(m, aux, unbounded)
        if head != F32 and any(m != LOW for m in members):
            aux = network.add_node()
            network.add_edge(head, aux, cost)
            for m in members:
                network.add_edge(aux, m, unbounded)
    low_side = network.minimal_source_side()
    return [LOW if low_side[v] else F32 for v in range(variables)]


def minimal_source_side(nodes: int, edges: dict[tuple[int, int], int | None]) -> list[bool]:
    """:meth:`Network.minimal_source_side` of ``edges`` (capacities; None unbounded)."""
    network = Network(nodes, unbounded=3 * sum(c for c in edges.values() if c is not None) + 1)
    for (tail, head), capacity in edges.items():
        network.add_edge(tail, head, network.unbounded if capacity is None else capacity)
    return network.minimal_source_side()


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
