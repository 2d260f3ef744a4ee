"""Every name graphamp adds to a model comes from one generator: :class:`Names`.

A name added (a Cast's output and the Cast node, a converted weight's copy, a fused node, an
output Cast's node) must be new in the whole model, not only in the part of it the passes
see: ONNX wants each value named once in the model, subgraphs and functions included, and
onnxruntime refuses two nodes of one name. Values and nodes have separate namespaces in ONNX,
and models from some converters name every node after its output (Keras: node ``y`` makes
value ``y``), so a Cast back to float32 that keeps the graph output's name ``y`` needs a node
name of its own. The generator knows:

* every value and node of the OpGraph, by its name inside its body (``graph.local_name``:
  bodies are scopes of the one graph, and a body's value ``t`` is ``t`` in the file);
* ``graph.reserved``: the names the dialect's reader saw outside the OpGraph (subgraphs of
  control flow kept whole, the model's functions);
* the names it gave out already.

A model graphamp edits as it is, without an OpGraph (the statistics a calibration run adds
inside bodies), has a generator of its own over every name the model holds (``taken``).

A new value's name is also taken as a node name (a Cast is named after its output).

The names of the graph are read at the first name asked for, not when the generator is made: a
pass makes one per run and most runs add nothing (a graph with no norm to fuse, a model with
nothing to cast), and a large graph has a name per node and per value to read. The passes that use
it change the graph only after taking their names.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

from graphamp.core.graph import OpGraph, unique_name


class Names:
    """Unique names for what graphamp adds to ``graph``'s model (see the module docstring)."""

    def __init__(self, graph: OpGraph | None = None, *, taken: Iterable[str] = ()) -> None:
        self.graph = graph
        self._given = set(taken)  # besides the graph's (all the names, without a graph)

    @cached_property
    def _taken(self) -> tuple[set[str], set[str]]:
        """(node names, value names) of the graph, read together: a node name given out
        later is not a value's."""
        graph = self.graph
        if graph is None:
            return set(self._given), set(self._given)
        nodes = set(graph.reserved)
        values = set(graph.reserved)
        # (where nothing sits in a body, each name is its own local name: the sets are filled
        # from the graph's keys in one call, not a call per name)
        if any(node.body for node in graph.nodes.values()):
            nodes.update(_local(node.name, node.body) for node in graph.nodes.values())
        else:
            nodes.update(graph.nodes)
        if any(tensor.body for tensor in graph.tensors.values()):
            values.update(graph.local_name(name) for name in graph.tensors)
        else:
            values.update(graph.tensors)
        values |= nodes
        if self._given:
            nodes |= self._given
            values |= self._given
        return nodes, values

    def value(self, base: str, *, like: str | None = None) -> str:
        """A new value (and the node making it) named ``base`` or ``base_1``, ...; ``base`` is
        a local name in the body of value ``like`` (the main graph without), and the result
        is that body's full name for it."""
        tensors = self.graph.tensors if self.graph is not None else {}
        body = tensors[like].body if like in tensors else ""
        nodes, values = self._taken
        name = unique_name(base, values)
        nodes.add(name)
        return f"{body}/{name}" if body else name

    def derived(self, tensor: str, suffix: str) -> str:
        """A new value named after ``tensor`` (its local name + ``suffix``), in its body."""
        assert self.graph is not None, "derived names are an OpGraph's"
        return self.value(self.graph.local_name(tensor) + suffix, like=tensor)

    def take(self, name: str) -> None:
        """Count ``name`` as given out: one the caller uses as it is (a graph output that must
        keep a name its reader knows), so no later name is the same."""
        nodes, values = self._taken
        nodes.add(name)
        values.add(name)

    def node(self, base: str, *, body: str = "") -> str:
        """A new node name: ``base`` itself when no node has it (a value may)."""
        name = unique_name(base, self._taken[0])
        return f"{body}/{name}" if body else name


def _local(name: str, body: str) -> str:
    return name[len(body) + 1 :] if body and name.startswith(f"{body}/") else name
