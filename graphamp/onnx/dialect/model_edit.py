"""The graphs of a model the ONNX writer edits, and where each OpGraph name sits in them.

The main graph's nodes and values keep their names; a body's (and a function copy's) are
found through the reader's handles (:class:`~graphamp.onnx.dialect.handles.ProtoHandles`); what the
writer adds is registered as it is added (``placed``, ``producer``).
"""

from __future__ import annotations

import onnx

from graphamp.core.graph import OpGraph
from graphamp.onnx.dialect.graph_edit import HEAD, GraphEdit
from graphamp.onnx.dialect.handles import ProtoHandles
from graphamp.onnx.io.infile import Data
from graphamp.onnx.io.proto_model import ProtoModel


class ModelEdit:
    """The output being built: each graph's edit, where each OpGraph name sits, value types.

    The main graph's nodes and values keep their names (``number``: node name -> number); a
    body's are found through the reader's handles; what this writer adds is registered as it
    is added (``placed``, ``producer``)."""

    def __init__(self, model: ProtoModel, graph: OpGraph, handles: ProtoHandles) -> None:
        self.model, self.handles = model, handles
        self.nested = model.nested
        self.graphs = {id(scope): GraphEdit(scope) for scope in handles.scopes}
        self.main = self.graphs[id(handles.scopes[0])]
        self.number = dict(zip(model.node_names, range(1, len(self.main.nodes)), strict=True))
        self.tensors = graph.tensors  # producers of the input's values
        self.reserved = graph.reserved  # names inside bodies and functions
        self.graph_nodes = graph.nodes
        self.domains: set[str] = set()  # domains of the fused ops written
        self.placed: dict[str, tuple[GraphEdit, int]] = {}  # nodes added to bodies
        # producers of values made or renamed here
        self.producer: dict[str, tuple[GraphEdit, int]] = {}
        self.types: dict[str, int] = {}  # value -> new element type
        self.shapes: dict[str, str] = {}  # new value -> the value whose shape it has
        self.streamed: dict[str, Data] = {}  # converted weights whose data is in the file
        self._initializers: dict[int, dict[str, onnx.TensorProto]] = {}
        self._taken: set[str] | None = None
        for scope in handles.scopes[1:]:  # an owner's outputs are its boundary nodes' there
            parent = self.graphs[id(scope.parent)]
            owner = scope.owner + 1
            if owner not in parent.outputs:
                parent.outputs[owner] = list(parent.scope.graph.node[scope.owner].output)

    # -- where things are -----------------------------------------------------------------

    def where(self, node: str) -> tuple[GraphEdit, int]:
        """The graph holding node ``node`` (an OpGraph name) and its number there."""
        index = self.number.get(node)
        if index is not None:
            return self.main, index
        found = self.placed.get(node)
        if found is not None:
            return found
        scope, position = self.handles.nodes[node]
        return self.graphs[id(scope)], position + 1

    def local(self, tensor: str) -> str:
        """The name value ``tensor`` (an OpGraph name) has in the model."""
        found = self.handles.values.get(tensor)
        return found[1] if found is not None else tensor

    def main_producer(self, tensor: str) -> int:
        """:meth:`home`'s number in a model with one graph."""
        found = self.producer.get(tensor)
        if found is not None:
            return found[1]
        info = self.tensors.get(tensor)
        return self.number[info.producer] if info is not None and info.producer else HEAD

    def home(self, tensor: str) -> tuple[GraphEdit, int]:
        """The graph defining ``tensor`` and the number of its producer there (HEAD for a
        graph input, a body's parameter or a weight)."""
        found = self.producer.get(tensor)
        if found is not None:
            return found
        info = self.tensors.get(tensor)
        body = self.handles.values.get(tensor)
        graph = self.graphs[id(body[0])] if body is not None else self.main
        if info is None or not info.producer:
            return graph, HEAD
        producers = self.handles.producers
        if tensor in producers:  # a boundary node's: the owner's output, or a parameter
            owner = producers[tensor]
            return (graph, HEAD) if owner is None else (self.graphs[id(owner[0])], owner[1] + 1)
        return self.where(info.producer)

    def initializers(self, graph: GraphEdit) -> dict[str, onnx.TensorProto]:
        key = id(graph)
        if key not in self._initializers:
            self._initializers[key] = {i.name: i for i in graph.scope.graph.initializer}
        return self._initializers[key]

    def open_graphs(self) -> list[GraphEdit]:
        """The graphs that may read a main-graph value (a function's copy reads none)."""
        return [graph for graph in self.graphs.values() if not graph.scope.closed]

    def taken_names(self) -> set[str]:
        """Every value name in the model (an added one included): what a new name must not be."""
        if self._taken is None:
            taken: set[str] = set(self.tensors) | self.reserved
            for graph in self.graphs.values():
                source = graph.scope.graph
                taken.update(v.name for v in source.input)
                taken.update(i.name for i in source.initializer)
                for node in source.node:
                    taken.update(node.output)
                    taken.update(node.input)
            taken.update(self.producer)
            self._taken = taken
        return self._taken
