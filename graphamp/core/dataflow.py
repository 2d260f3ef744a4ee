"""Dataflow: the adjacency tables the passes walk over an :class:`~graphamp.core.graph.OpGraph`'s
node names (``OpGraph.dataflow``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class Dataflow:
    """A directed graph over node names as two adjacency tables: what the passes walk (plain
    dicts, without the attribute dict per edge and the views a networkx graph builds). An
    edge added twice is one edge; neighbours come in the order their edges were first
    added."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self._successors: dict[str, dict[str, None]] = {name: {} for name in nodes}
        self._predecessors: dict[str, dict[str, None]] = {name: {} for name in self._successors}

    def add_edge(self, source: str, target: str) -> None:
        self._successors[source][target] = None
        self._predecessors[target][source] = None

    def successors(self, name: str) -> Iterator[str]:
        return iter(self._successors[name])

    def predecessors(self, name: str) -> Iterator[str]:
        return iter(self._predecessors[name])

    def neighbours(self, name: str) -> list[str]:
        """Predecessors, then successors."""
        return [*self._predecessors[name], *self._successors[name]]
