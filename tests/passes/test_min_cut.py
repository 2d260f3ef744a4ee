"""The cost pass's flow (passes/min_cut.py, Dinic's algorithm written for it) against
networkx's: the same minimal source side (what the source reaches in the residual network of a
maximum flow, the same set for every maximum flow) on random networks."""

from __future__ import annotations

import random

import networkx as nx
import pytest
from networkx.algorithms.flow import edmonds_karp

from graphamp.passes.min_cut import minimal_source_side


def _reached(network: nx.DiGraph) -> set[int]:
    residual = edmonds_karp(network, 0, 1)
    reached, stack = {0}, [0]
    while stack:
        here = stack.pop()
        for near, edge in residual[here].items():
            if near not in reached and edge["flow"] < edge["capacity"]:
                reached.add(near)
                stack.append(near)
    return reached


def _network(seed: int, scale: int = 1) -> tuple[int, dict[tuple[int, int], int | None]]:
    rng = random.Random(seed)
    nodes = rng.randint(3, 12)  # small and dense: where a flow that cannot undo goes wrong
    edges: dict[tuple[int, int], int | None] = {}
    for _ in range(rng.randint(1, 4 * nodes)):
        tail, head = rng.randrange(nodes), rng.randrange(nodes)
        unbounded = rng.random() < 0.1
        # as the cost pass makes them: no path of unbounded edges joins source and sink
        if tail != head and not (unbounded and (tail == 0 or head == 1)):
            edges[tail, head] = None if unbounded else rng.randint(0, 9) * scale
    return nodes, edges


@pytest.mark.parametrize(
    ("seeds", "scale"),
    [(range(start, start + 500), 1) for start in range(0, 2000, 500)]
    # capacities past what int64 holds (a weight's bytes times LOOP_RUNS per nested loop): the
    # flow's arrays hold Python integers then
    + [(range(2000, 2200), 2**62)],
)
def test_the_low_side_is_networkx_minimal_source_side(seeds, scale):
    for seed in seeds:
        nodes, edges = _network(seed, scale)
        network = nx.DiGraph()
        network.add_nodes_from(range(nodes))
        big = 3 * sum(c for c in edges.values() if c is not None) + 1
        for (tail, head), capacity in edges.items():
            network.add_edge(tail, head, capacity=big if capacity is None else capacity)
        low = minimal_source_side(nodes, edges)
        assert {node for node in range(nodes) if low[node]} == _reached(network), seed
