"""Where boxes go across their rank, and where edges meet them: the last steps of
:mod:`graphamp.viewer.layout`.

Each rank's positions are fitted to its neighbours' by isotonic regression (pool adjacent
violators on positions less their minimum spacing), sweeping down and up, long edges' inner
links weighted most so that they run straight; a long edge whose ranks leave room is then set
straight outright, and edges meeting a box on one side are spread along it.
"""

from __future__ import annotations

import itertools

NODE_GAP = 22.0  # horizontal space between boxes
DUMMY_GAP = 8.0  # horizontal space next to an edge passing through a rank
PLACE_SWEEPS = 8


def neighbours(chains: list[list[int]], total: int) -> tuple[list[list[int]], list[list[int]]]:
    up: list[list[int]] = [[] for _ in range(total)]
    down: list[list[int]] = [[] for _ in range(total)]
    seen = set()
    for chain in chains:
        for u, v in itertools.pairwise(chain):
            if (u, v) not in seen:
                seen.add((u, v))
                down[u].append(v)
                up[v].append(u)
    return up, down


def place(
    order: list[list[int]],
    chains: list[list[int]],
    widths: list[float],
    weights_of: dict[tuple[int, int], float],
    n: int,
) -> list[float]:
    total = len(widths)
    up, down = neighbours(chains, total)
    x = [0.0] * total
    for layer in order:
        cursor = 0.0
        for i, v in enumerate(layer):
            if i:
                cursor += _gap(layer[i - 1], v, widths, n)
            x[v] = cursor
    for sweep in range(PLACE_SWEEPS):
        last = sweep == PLACE_SWEEPS - 1
        downward = sweep % 2 == 0
        indices = range(len(order)) if downward else range(len(order) - 1, -1, -1)
        for r in indices:
            layer = order[r]
            targets, weights = [], []
            for v in layer:
                pulls = [(u, weights_of[(u, v)]) for u in up[v]] if downward or last else []
                if not downward or last:
                    pulls += [(w, weights_of[(v, w)]) for w in down[v]]
                weight = sum(p for _, p in pulls)
                if weight:
                    targets.append(sum(x[u] * p for u, p in pulls) / weight)
                    weights.append(weight)
                else:
                    targets.append(x[v])
                    weights.append(0.05)
            offsets = [0.0]
            for i in range(1, len(layer)):
                offsets.append(offsets[-1] + _gap(layer[i - 1], layer[i], widths, n))
            fitted = _isotonic([t - o for t, o in zip(targets, offsets, strict=True)], weights)
            for v, f, o in zip(layer, fitted, offsets, strict=True):
                x[v] = f + o
    return x


def straighten(
    order: list[list[int]], chains: list[list[int]], widths: list[float], x: list[float], n: int
) -> None:
    """Set the dummies of a long edge to one x where every rank it crosses has room there,
    so that it runs as one straight line instead of wavering."""
    rank_of, position = {}, {}
    for r, layer in enumerate(order):
        for i, v in enumerate(layer):
            rank_of[v], position[v] = r, i
    for chain in chains:
        dummies = chain[1:-1]
        if len(dummies) < 2:
            continue
        target = sorted(x[d] for d in dummies)[len(dummies) // 2]
        fits = True
        for d in dummies:
            layer, i = order[rank_of[d]], position[d]
            if i > 0 and target - x[layer[i - 1]] < _gap(layer[i - 1], d, widths, n):
                fits = False
            if i + 1 < len(layer) and x[layer[i + 1]] - target < _gap(d, layer[i + 1], widths, n):
                fits = False
        if fits:
            for d in dummies:
                x[d] = target


def _gap(left: int, right: int, widths: list[float], n: int) -> float:
    space = NODE_GAP if left < n and right < n else DUMMY_GAP
    return (widths[left] + widths[right]) / 2 + space


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool
    adjacent violators): positions that keep their order and spacing, nearest the targets."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean_b, weight_b, count_b = blocks.pop()
            mean_a, weight_a, count_a = blocks.pop()
            merged = weight_a + weight_b
            blocks.append(
                [(mean_a * weight_a + mean_b * weight_b) / merged, merged, count_a + count_b]
            )
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * int(count))
    return out


def spread_ends(
    routes: list[list[tuple[float, float]]],
    edges: list[tuple[int, int]],
    x: list[float],
    y: list[float],
    sizes: list[tuple[float, float]],
) -> None:
    """Edges meeting a box on the same side end at points spread along that side, in the
    order of where they come from, rather than all at its centre."""
    sides: dict[tuple[int, bool], list[tuple[float, int, int]]] = {}
    for r, ((a, b), route) in enumerate(zip(edges, routes, strict=True)):
        if len(route) < 2:
            continue
        for box, end, near in ((a, 0, 1), (b, len(route) - 1, len(route) - 2)):
            top = route[end][1] < y[box]
            sides.setdefault((box, top), []).append((route[near][0], r, end))
    for (box, _), ends in sides.items():
        if len(ends) < 2:
            continue
        ends.sort()
        step = min(18.0, (sizes[box][0] - 28) / (len(ends) - 1))
        first = x[box] - step * (len(ends) - 1) / 2
        for k, (_, r, end) in enumerate(ends):
            py = routes[r][end][1]
            routes[r][end] = (first + k * step, py)
