"""The minimum cut the cost pass (:mod:`graphamp.passes.cost`) solves: its costs, as a flow.

A cost is paid when some member is on another side than its head. The sides are numbered: the
two terminals (:data:`LOW` = 0, the source: the low type; :data:`F32` = 1, the sink: float32)
and the variables 2, 3, ... (free ops, movable graph inputs, the model's own Casts, numbered by
:mod:`graphamp.passes.cost_terms`). A side assignment is a list indexed by those numbers whose
entries are the terminals (a terminal is on its own side). :func:`cut` gives every variable the
side of the minimum cut that the preferences it is given favour most, then with the fewest
variables low (a tie nothing breaks stays float32).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

LOW, F32 = 0, 1  # the cut's terminals: the low side (source) and the float32 side (sink)


class Cost(NamedTuple):
    """``cost`` bytes, paid when some member is on another side than ``head``: a value's
    Cast (head its producer, members its readers) or a weight's copy in one type (head the
    other type's terminal). Members never repeat and never include the head (a member on
    the head's side pays nothing, whatever the cut)."""

    cost: int
    head: int
    members: tuple[int, ...]

    def paid(self, side: list[int]) -> bool:
        head = side[self.head]
        return any(side[m] != head for m in self.members)


@dataclass
class Costs:
    """Costs kept apart by shape: those of one member (most: a value one op reads), paid when
    the two ends' sides differ, as parallel lists the cut and the prices take whole; the others
    as :class:`Cost` tuples."""

    amounts: list[int] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)  # each pair's one member
    hyperedges: list[Cost] = field(default_factory=list)

    def add(self, cost: int, head: int, members: Collection[int]) -> None:
        if len(members) == 1:
            (member,) = members
            self.amounts.append(cost)
            self.heads.append(head)
            self.members.append(member)
        else:
            self.hyperedges.append(Cost(cost, head, tuple(members)))

    def __iter__(self) -> Iterator[Cost]:
        for cost, head, member in zip(self.amounts, self.heads, self.members, strict=True):
            yield Cost(cost, head, (member,))
        yield from self.hyperedges

    def total(self) -> int:
        return sum(self.amounts) + sum(c.cost for c in self.hyperedges)


class Network:
    """A flow network over numbered nodes (0 the source, 1 the sink), built an edge at a time:
    ``tails[k] -> heads[k]`` of capacity ``forward[k]`` and back of ``backward[k]`` (a Cast
    between two free ops costs the same either way: one edge, not two). ``unbounded`` is a
    capacity above what all bounded edges carry together (no path of unbounded edges joins the
    terminals, so such an edge is never cut)."""

    def __init__(self, nodes: int, unbounded: int) -> None:
        self.nodes = nodes
        self.unbounded = unbounded
        self.tails: list[int] = []
        self.heads: list[int] = []
        self.forward: list[int] = []
        self.backward: list[int] = []

    def add_node(self) -> int:
        self.nodes += 1
        return self.nodes - 1

    def add_edge(self, tail: int, head: int, capacity: int, back: int = 0) -> None:
        self.tails.append(tail)
        self.heads.append(head)
        self.forward.append(capacity)
        self.backward.append(back)

    def minimal_source_side(self) -> list[bool]:
        """Which nodes are on the low side of the minimum cut with the fewest nodes on it: what
        the source reaches in the residual network of a maximum flow (the same set for every
        maximum flow, so a tie stays float32 whatever the flow algorithm did).

        The flow is Dinic's (shortest augmenting paths, a blocking flow per BFS level graph)
        over integer arrays: networkx's ``boykov_kolmogorov`` gives the same set, but needs a
        DiGraph of the network built first, an object per node and edge. Before
        it, what it would push first along the shortest paths is pushed without a search: a
        node's capacity from the source against its capacity to the sink, array-wise (most of
        the cost pass's edges have a terminal end: a value whose producer or reader is fixed),
        then along the paths of two nodes (:meth:`_Arcs.push_two_hops`). Any flow pushed
        first leaves the same set once the flow is maximum."""
        network = _Arcs(self)
        network.push_two_hops()
        while True:
            level = network.levels()
            if level[F32] < 0:
                return [depth >= 0 for depth in level]
            network.blocking_flow(level)


class _Arcs:
    """The residual network: arc ``2k`` and its reverse ``2k + 1`` (``target`` and
    ``residual`` by arc), each node's arcs ``order[first[node]:first[node + 1]]``."""

    def __init__(self, network: Network) -> None:
        nodes = network.nodes
        kind = np.int64 if network.unbounded < 2**62 else object  # (exact either way)
        tails, heads = np.array(network.tails, np.int64), np.array(network.heads, np.int64)
        forward = np.array(network.forward, kind)
        backward = np.array(network.backward, kind)
        # each edge's two directions: an edge into the source or out of the sink carries
        # nothing a maximum flow needs; one out of the source or into the sink adds to a node's
        # terminal capacity
        tail = np.concatenate([tails, heads])
        head = np.concatenate([heads, tails])
        capacity = np.concatenate([forward, backward])
        from_source = np.zeros(nodes, kind)
        to_sink = np.zeros(nodes, kind)
        out_of_source = (tail == LOW) & (head != F32)
        into_sink = (head == F32) & (tail != LOW)
        np.add.at(from_source, head[out_of_source], capacity[out_of_source])
        np.add.at(to_sink, tail[into_sink], capacity[into_sink])
        # pushed along source -> node -> sink (the reverse arcs of those two lead into the
        # source or out of the sink: never used again, so left out)
        through = np.minimum(from_source, to_sink)
        from_source -= through
        to_sink -= through
        # the arcs: the source's first (arc 0, 2, ...), then the sink's, then the edges between
        # two other nodes; arc 2k runs edge k forward, arc 2k + 1 back
        fed = np.flatnonzero(from_source > 0)
        drained = np.flatnonzero(to_sink > 0)
        inner = (tails > F32) & (heads > F32) & ((forward > 0) | (backward > 0))
        tail_of = np.concatenate([np.full(len(fed), LOW), drained, tails[inner]])
        head_of = np.concatenate([fed, np.full(len(drained), F32), heads[inner]])
        forward_of = np.concatenate([from_source[fed], to_sink[drained], forward[inner]])
        backward_of = np.concatenate([np.zeros(len(fed) + len(drained), kind), backward[inner]])
        arc_source = np.stack([tail_of, head_of], axis=1).ravel()
        self.target = np.stack([head_of, tail_of], axis=1).ravel().tolist()
        self.residual = np.stack([forward_of, backward_of], axis=1).ravel().tolist()
        order = np.argsort(arc_source, kind="stable")
        self.order = order.tolist()
        self.first = np.searchsorted(arc_source[order], np.arange(nodes + 1)).tolist()
        self.nodes = nodes
        self.fed = len(fed)
        self.drain = [-1] * nodes  # each node's arc to the sink (-1: none)
        for position, node in enumerate(drained.tolist()):
            self.drain[node] = 2 * (len(fed) + position)

    def push_two_hops(self) -> None:
        """Push along every path source -> node -> node -> sink with capacity left, before any
        search: much of what the first level graph would carry (a value between two free ops,
        one fed by a low op, the other feeding a float32 op), found in one pass over the arcs
        of the nodes the source feeds."""
        order, first, target, residual, drain = (
            self.order,
            self.first,
            self.target,
            self.residual,
            self.drain,
        )
        for feed in range(0, 2 * self.fed, 2):
            node = target[feed]
            for arc in order[first[node] : first[node + 1]]:
                out = drain[target[arc]]
                if out < 0 or not residual[arc] or not residual[out]:
                    continue
                pushed = min(residual[feed], residual[arc], residual[out])
                for step in (feed, arc, out):
                    residual[step] -= pushed
                    residual[step ^ 1] += pushed
                if not residual[feed]:
                    break

    def levels(self) -> list[int]:
        """Each node's distance from the source over arcs with capacity left (-1: unreached),
        as far as the sink's: a node farther than the sink is on no shortest path to it (left
        unreached), so only where the sink is unreached does every node get its distance."""
        order, first, target, residual = self.order, self.first, self.target, self.residual
        level = [-1] * self.nodes
        level[LOW] = 0
        queue = deque([LOW])
        while queue:
            node = queue.popleft()
            if 0 <= level[F32] <= level[node]:
                break  # the rest lie as far as the sink or farther
            depth = level[node] + 1
            for arc in order[first[node] : first[node + 1]]:
                near = target[arc]
                if level[near] < 0 and residual[arc]:
                    level[near] = depth
                    queue.append(near)
        return level

    def blocking_flow(self, level: list[int]) -> None:
        """Augment along shortest paths until none is left in the level graph (each node's
        current arc only moves forward: an arc that led nowhere or is full is not tried
        again)."""
        order, first, target, residual = self.order, self.first, self.target, self.residual
        current = first[:-1]  # each node's next arc to try, as a position in ``order``
        path: list[int] = []  # arcs from the source
        node = LOW
        while True:
            if node == F32:
                pushed = min(residual[arc] for arc in path)
                for arc in path:
                    residual[arc] -= pushed
                    residual[arc ^ 1] += pushed
                path.clear()
                node = LOW
                continue
            at, end, deeper = current[node], first[node + 1], level[node] + 1
            while at < end and not (residual[order[at]] and level[target[order[at]]] == deeper):
                at += 1
            current[node] = at
            if at < end:
                path.append(order[at])
                node = target[order[at]]
            elif not path:
                return  # the source has no way on: the blocking flow is found
            else:  # a dead end: back one arc, and past it
                node = target[path.pop() ^ 1]
                current[node] += 1


def cut(variables: int, costs: Costs, preferences: Collection[tuple[int, int]] = ()) -> list[int]:
    """The side of each of the ``variables`` numbers (0 and 1 the terminals) in the minimum
    cut of ``costs`` with the fewest variables low; a variable in no cost is float32.

    ``preferences`` ((variable, amount) pairs) break ties among the minimum cuts: of the cuts
    that cost the least, the one whose variables on the float32 side sum the least amount
    (then, of those, the fewest variables low). They are edges from the source of their
    amounts, with every cost scaled by one more than their sum: a cut that costs one byte
    more costs more than all of them together, so they move no decision the costs make.

    A cost paid when some member is on another side than its head is two hyperedges: (head
    float32, a member low) as member -> aux -> head, and (head low, a member float32) as head
    -> aux' -> member; the aux edges are unbounded. A cost with one member (most of them: a
    value one op reads) is the edge member -> head and head -> member instead, with no aux
    node: the same cuts at the same price in a smaller flow graph. The regions that share no
    cost are cut in one flow (one call, however many regions a large graph has); the
    cut of each is the same as alone."""
    scale = 1 + sum(amount for _, amount in preferences)
    # every bounded edge carries at most its cost, and a cost makes at most two of them
    network = Network(variables, unbounded=2 * costs.total() * scale + scale)
    amounts = costs.amounts if scale == 1 else [amount * scale for amount in costs.amounts]
    network.tails.extend(costs.members)
    network.heads.extend(costs.heads)
    network.forward.extend(amounts)
    network.backward.extend(amounts)
    if preferences:  # float32 pays it: an edge from the source
        chosen, paid = zip(*preferences, strict=True)
        network.tails.extend([LOW] * len(chosen))
        network.heads.extend(chosen)
        network.forward.extend(paid)
        network.backward.extend([0] * len(chosen))
    unbounded = network.unbounded
    for amount, head, members in costs.hyperedges:
        cost = amount * scale
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
