"""A layered (Sugiyama) layout in plain Python, for one view of the viewer at a time.

The steps are the classic ones: make the graph acyclic (inside each strongly connected part,
edges follow the graph order), assign ranks (longest path, then nodes with more edges out
than in moved down next to their successors, so that inputs and constants do not gather in a
top row), break edges that span ranks into chains of dummy nodes, order each rank to reduce
crossings (barycentre sweeps and adjacent swaps, keeping the best order found), place nodes
horizontally (each rank's positions fitted to its neighbours' by isotonic regression, long
edges weighted so that they run straight) and route every edge through its dummies.
Everything is deterministic: the same boxes and edges give the same coordinates.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import networkx as nx

from graphamp.viewer.placement import neighbours, place, spread_ends, straighten

RANK_GAP = 46.0  # vertical space between ranks
MARGIN = 20.0
ORDER_SWEEPS = 12


@dataclass
class Layout:
    """Centres of the boxes, every edge as a polyline (points from source to target), the
    size of the drawing and the number of edge crossings left."""

    x: list[float]
    y: list[float]
    routes: list[list[tuple[float, float]]]
    width: float
    height: float
    crossings: int
    ranks: list[int]


def layered_layout(
    sizes: list[tuple[float, float]], keys: list[int], edges: list[tuple[int, int]]
) -> Layout:
    """Lay out boxes of ``sizes`` (width, height) with ``edges`` (source, target); ``keys``
    order the boxes (graph order) wherever the layout has a free choice."""
    n = len(sizes)
    if n == 0:
        return Layout([], [], [[] for _ in edges], 2 * MARGIN, 2 * MARGIN, 0, [])
    oriented = _orient(n, keys, edges)
    rank = _ranks(n, keys, oriented)
    layers, chains, widths, weights_of = _split_long_edges(n, rank, oriented, sizes)
    order, crossings = _order(layers, chains, keys, n)
    xs = place(order, chains, widths, weights_of, n)
    straighten(order, chains, widths, xs, n)
    return _finish(sizes, rank, order, chains, xs, edges, oriented, crossings)


def _orient(n: int, keys: list[int], edges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each edge (source, target), turned round where it closes a cycle: inside a strongly
    connected part, edges point from the earlier box (by key) to the later one."""
    graph: nx.DiGraph[int] = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((a, b) for a, b in edges if a != b)
    part = {}
    for index, component in enumerate(nx.strongly_connected_components(graph)):
        for node in component:
            part[node] = index
    oriented = []
    for a, b in edges:
        if a != b and part[a] == part[b] and (keys[a], a) > (keys[b], b):
            a, b = b, a
        oriented.append((a, b))
    return oriented


def _ranks(n: int, keys: list[int], edges: list[tuple[int, int]]) -> list[int]:
    succ: list[set[int]] = [set() for _ in range(n)]
    pred: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        if a != b:
            succ[a].add(b)
            pred[b].add(a)
    indegree = [len(p) for p in pred]
    ready = [(keys[v], v) for v in range(n) if indegree[v] == 0]
    heapq.heapify(ready)
    topo = []
    while ready:
        _, v = heapq.heappop(ready)
        topo.append(v)
        for s in succ[v]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (keys[s], s))
    rank = [0] * n
    for v in topo:
        rank[v] = max((rank[p] + 1 for p in pred[v]), default=0)
    for v in reversed(topo):
        # Moving a box down shortens its edges out and lengthens those in: worth it when it
        # has more of the former (every source, such as an input read late, qualifies).
        if succ[v] and len(succ[v]) > len(pred[v]):
            rank[v] = min(rank[s] for s in succ[v]) - 1
    low = min(rank)
    return [r - low for r in rank]


def _split_long_edges(
    n: int,
    rank: list[int],
    edges: list[tuple[int, int]],
    sizes: list[tuple[float, float]],
) -> tuple[list[list[int]], list[list[int]], list[float], dict[tuple[int, int], float]]:
    """Ranks as lists of boxes and dummies, each edge's chain of nodes, the widths of all
    nodes, and the weight of each short edge (long edges' inner links weigh most)."""
    widths = [w for w, _ in sizes]
    layers: list[list[int]] = [[] for _ in range(max(rank) + 1)]
    for v in range(n):
        layers[rank[v]].append(v)
    chains, weights = [], {}
    seen: dict[tuple[int, int], list[int]] = {}
    for a, b in edges:
        if a == b:
            chains.append([a])
            continue
        if (a, b) in seen:  # a second edge between the same boxes shares the first's route
            chains.append(seen[(a, b)])
            continue
        chain = [a]
        for r in range(rank[a] + 1, rank[b]):
            dummy = len(widths)
            widths.append(0.0)
            rank.append(r)
            layers[r].append(dummy)
            chain.append(dummy)
        chain.append(b)
        for u, v in itertools.pairwise(chain):
            inner = (u >= n) + (v >= n)
            weights[(u, v)] = (1.0, 2.0, 8.0)[inner]
        seen[(a, b)] = chain
        chains.append(chain)
    return layers, chains, widths, weights


def _order(
    layers: list[list[int]], chains: list[list[int]], keys: list[int], n: int
) -> tuple[list[list[int]], int]:
    total = sum(len(layer) for layer in layers)
    up, down = neighbours(chains, total)
    # the start: depth-first from the boxes in graph order, each rank in order of discovery
    position: dict[int, int] = {}
    counter = 0
    key_of = list(keys) + [0] * (total - n)
    for chain in chains:
        for dummy in chain[1:-1]:
            key_of[dummy] = keys[chain[0]]
    for start in sorted(range(total), key=lambda v: (key_of[v], v)):
        stack = [start]
        while stack:
            v = stack.pop()
            if v in position:
                continue
            position[v] = counter
            counter += 1
            stack.extend(sorted(down[v], key=lambda s: (key_of[s], s), reverse=True))
    order = [sorted(layer, key=lambda v: position[v]) for layer in layers]
    best, best_crossings = [list(layer) for layer in order], _crossings(order, down)
    for sweep in range(ORDER_SWEEPS):
        downward = sweep % 2 == 0
        indices = range(1, len(order)) if downward else range(len(order) - 2, -1, -1)
        for r in indices:
            fixed = order[r - 1] if downward else order[r + 1]
            links = up if downward else down
            where = {v: i for i, v in enumerate(fixed)}
            current = {v: i for i, v in enumerate(order[r])}

            def barycentre(
                v: int,
                links: list[list[int]] = links,
                where: dict[int, int] = where,
                current: dict[int, int] = current,
            ) -> tuple[float, int]:
                near = [where[u] for u in links[v] if u in where]
                return (sum(near) / len(near) if near else current[v], current[v])

            order[r].sort(key=barycentre)
        _transpose(order, up, down)
        crossings = _crossings(order, down)
        if crossings < best_crossings:
            best, best_crossings = [list(layer) for layer in order], crossings
        if best_crossings == 0:
            break
    return best, best_crossings


def _pair_crossings(u: int, v: int, links: list[list[int]], where: dict[int, int]) -> int:
    """Crossings between the edges of u and of v to the next rank, u placed left of v."""
    return sum(1 for a in links[u] for b in links[v] if where[a] > where[b])


def _transpose(order: list[list[int]], up: list[list[int]], down: list[list[int]]) -> None:
    """Swap neighbours in a rank while that removes crossings with the ranks around it."""
    improved, rounds = True, 0
    while improved and rounds < 4:
        improved, rounds = False, rounds + 1
        for r, layer in enumerate(order):
            above = {v: i for i, v in enumerate(order[r - 1])} if r > 0 else {}
            below = {v: i for i, v in enumerate(order[r + 1])} if r + 1 < len(order) else {}
            for i in range(len(layer) - 1):
                u, v = layer[i], layer[i + 1]
                now = _pair_crossings(u, v, up, above) + _pair_crossings(u, v, down, below)
                swapped = _pair_crossings(v, u, up, above) + _pair_crossings(v, u, down, below)
                if swapped < now:
                    layer[i], layer[i + 1] = v, u
                    improved = True


def _crossings(order: list[list[int]], down: list[list[int]]) -> int:
    total = 0
    for r in range(len(order) - 1):
        where = {v: i for i, v in enumerate(order[r + 1])}
        ends = sorted((i, where[w]) for i, v in enumerate(order[r]) for w in down[v] if w in where)
        total += _inversions([b for _, b in ends])
    return total


def _inversions(values: list[int]) -> int:
    """Pairs i < j with values[i] > values[j] (a Fenwick tree over the values)."""
    size = max(values, default=0) + 2
    tree = [0] * size
    count = 0
    for seen, value in enumerate(values):
        index, not_greater = value + 1, 0
        while index > 0:
            not_greater += tree[index]
            index -= index & -index
        count += seen - not_greater
        index = value + 1
        while index < size:
            tree[index] += 1
            index += index & -index
    return count


def _finish(
    sizes: list[tuple[float, float]],
    rank: list[int],
    order: list[list[int]],
    chains: list[list[int]],
    xs: list[float],
    edges: list[tuple[int, int]],
    oriented: list[tuple[int, int]],
    crossings: int,
) -> Layout:
    n = len(sizes)
    heights = [max((sizes[v][1] for v in layer if v < n), default=0.0) for layer in order]
    tops, cursor = [], MARGIN
    for height in heights:
        tops.append(cursor)
        cursor += height + RANK_GAP
    left = min(xs[v] - (sizes[v][0] / 2 if v < n else 0) for layer in order for v in layer)
    shift = MARGIN - left
    x = [xs[v] + shift for v in range(n)]
    y = [tops[rank[v]] + heights[rank[v]] / 2 for v in range(n)]
    right = max(xs[v] + (sizes[v][0] / 2 if v < n else 0) for layer in order for v in layer)
    routes: list[list[tuple[float, float]]] = []
    for (a, b), chain in zip(edges, chains, strict=True):
        if a == b:
            routes.append([])
            continue
        points = [(x[chain[0]], y[chain[0]] + sizes[chain[0]][1] / 2)]
        for dummy in chain[1:-1]:
            top = tops[rank[dummy]]
            points += [(xs[dummy] + shift, top), (xs[dummy] + shift, top + heights[rank[dummy]])]
        points.append((x[chain[-1]], y[chain[-1]] - sizes[chain[-1]][1] / 2))
        if (chain[0], chain[-1]) != (a, b):
            points.reverse()
        routes.append(points)
    spread_ends(routes, edges, x, y, sizes)
    return Layout(
        [round(v, 1) for v in x],
        [round(v, 1) for v in y],
        [[(round(px, 1), round(py, 1)) for px, py in route] for route in routes],
        round(right + shift + MARGIN, 1),
        round(cursor - RANK_GAP + MARGIN, 1),
        crossings,
        rank[:n],
    )
