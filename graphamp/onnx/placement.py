"""Where the ONNX writer puts what it adds when a model has If, Loop and Scan bodies.

* A Cast goes in the scope that reads it: starting from the graph that defines the value, it
  moves down into the body that holds every reader as long as that body is an If branch (a
  branch not taken then casts nothing), never into a Loop or Scan body (the value is the same
  in every iteration: the Cast is hoisted out, once per run instead of once per iteration).
  In the graph that defines the value it goes right after the producer; in a body, first.
* A boundary slot is an input of the body's owner (rewired like any input) or an output of a
  body graph. A body graph may only return a value it produces or takes as a parameter
  (``onnx.checker``), so where the value comes from an enclosing scope (a Cast shared with
  other readers there) the body returns it through an Identity of its own.
"""

from __future__ import annotations

from collections import defaultdict

import onnx_ir as ir

from graphamp.core.graph import BodyKind, unique_name
from graphamp.onnx.handles import OnnxHandles
from graphamp.plans.edits import EditScript

Place = tuple[ir.Graph, ir.Node | None]  # a graph, and the node to insert after (None: first)


def graph_of(value: ir.Value, main: ir.Graph) -> ir.Graph:
    """The graph that defines ``value``."""
    producer = value.producer()
    if producer is not None and producer.graph is not None:
        return producer.graph  # type: ignore[return-value]
    return value.graph or main  # type: ignore[return-value]


def reading_graphs(script: EditScript, handles: OnnxHandles) -> dict[str, list[ir.Graph]]:
    """For every value a slot is rewired to read: the graphs those slots read it in."""
    found: dict[str, list[ir.Graph]] = defaultdict(list)
    for (node, slot), tensor in script.rewire.items():
        if node in handles.boundaries:
            owner, _ = handles.boundaries[node][slot]
            found[tensor].append(owner if isinstance(owner, ir.Graph) else owner.graph)  # type: ignore[arg-type]
        else:
            found[tensor].append(handles.nodes[node].graph)  # type: ignore[arg-type]
    return found


def place(value: ir.Value, readers: list[ir.Graph], handles: OnnxHandles, main: ir.Graph) -> Place:
    """Where a Cast of ``value`` read in ``readers`` goes (module docstring)."""
    home = graph_of(value, main)
    producer = value.producer()
    at_home: Place = (home, producer if producer is not None and producer.graph is home else None)
    if not readers:
        return at_home
    common = _chain(readers[0], handles)
    for graph in readers[1:]:
        chain = _chain(graph, handles)
        length = 0
        while length < min(len(common), len(chain)) and common[length] is chain[length]:
            length += 1
        common = common[:length]
    base = _chain(home, handles)
    if len(common) < len(base) or any(a is not b for a, b in zip(base, common, strict=False)):
        return at_home  # a reader outside the value's scope: cannot be; keep it safe
    where = home
    for graph in common[len(base) :]:
        body, _ = handles.bodies[id(graph)]
        if body.kind is BodyKind.LOOP:
            break
        where = graph
    return at_home if where is home else (where, None)


def _chain(graph: ir.Graph, handles: OnnxHandles) -> list[ir.Graph]:
    """The graphs from the main graph down to ``graph``."""
    chain = [graph]
    while id(graph) in handles.bodies:
        graph = handles.bodies[id(graph)][1]
        chain.append(graph)
    return chain[::-1]


def insert_first(graph: ir.Graph, node: ir.Node) -> None:
    if len(graph):
        graph.insert_before(next(iter(graph)), node)
    else:
        graph.append(node)


class Returns:
    """Rewires boundary slots, giving a body an Identity where it must return a value of an
    enclosing scope (module docstring)."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self._taken: set[str] | None = None

    def rewire(self, target: tuple[ir.Node | ir.Graph, int], value: ir.Value) -> None:
        owner, index = target
        if isinstance(owner, ir.Node):
            owner.replace_input_with(index, value)
            return
        producer = value.producer()
        own = (producer is not None and producer.graph is owner) or value in owner.inputs
        if not own:
            value = self._identity(owner, value)
        owner.outputs[index] = value

    def _identity(self, graph: ir.Graph, value: ir.Value) -> ir.Value:
        if self._taken is None:
            self._taken = {
                v.name
                for node in ir.traversal.RecursiveGraphIterator(self.model.graph)
                for v in (*node.inputs, *node.outputs)
                if v is not None and v.name
            }
            for each in self.model.graphs():
                self._taken.update(v.name for v in (*each.inputs, *each.initializers.values()))
        name = unique_name(f"{value.name}__returned", self._taken)
        out = ir.Value(name=name, shape=value.shape, type=value.type)
        graph.append(ir.Node("", "Identity", [value], outputs=[out], name=name))
        return out
