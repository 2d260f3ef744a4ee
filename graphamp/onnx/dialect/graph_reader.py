"""The graphs of a model read into one OpGraph: the main graph, each body where its owner is
and each function's copy at a call (:class:`GraphReader`, which :mod:`graphamp.onnx.dialect.bodies`
and :mod:`graphamp.onnx.dialect.functions` call back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import onnx

from graphamp.core.dtypes import UNKNOWN
from graphamp.core.graph import Body, NodeKind, OpGraph, OpNode, unique_name
from graphamp.errors import GraphampError
from graphamp.onnx.dialect import slots
from graphamp.onnx.dialect.handles import FunctionId, ProtoHandles, Scope
from graphamp.onnx.dialect.node_reader import (
    Types,
    named_function,
    names_outside,
    node_names,
    read_nodes,
)
from graphamp.onnx.dialect.scopes import module_path_of_entries
from graphamp.onnx.io.subgraphs import bodies
from graphamp.onnx.io.type_view import settled_types as value_types
from graphamp.onnx.validation.validate_nodes import NodeFields, node_fields

if TYPE_CHECKING:
    from graphamp.onnx.io.proto_model import ProtoModel

_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


class GraphReader:
    """Reads the model's graphs into one OpGraph: the main graph, and each body (and each
    function's copy at a call) where its owner is (:mod:`graphamp.onnx.dialect.bodies`,
    :mod:`graphamp.onnx.dialect.functions`).

    A graph is read in runs of plain nodes (:func:`read_nodes`, once per node) between the
    nodes that own a body or call a function, which are entered one by one; a model with
    neither is one run. A body's values and nodes are named by their path
    (``<body>/<name>``), which never is a main-graph value's or node's name."""

    def __init__(
        self,
        model: ProtoModel,
        op_graph: OpGraph,
        typed: Types,
        opsets: dict[str, int],
        target: str,
        provider: str,
    ) -> None:
        self.model, self.op_graph, self.typed = model, op_graph, typed
        self.opsets, self.target, self.provider = opsets, target, provider
        self.handles = ProtoHandles()
        # Nodes of one op with the same types get the same slots: the schema work is done
        # once per signature (a graph of 50,000 nodes may have a dozen).
        self.signatures: dict[tuple[object, ...], slots.Slots] = {}
        self.taken: set[str] = set()  # the names given to values, and the main graph's
        self.taken_nodes: set[str] = set()  # the same for nodes
        self.main_values: set[str] = set()
        self.functions: dict[FunctionId, onnx.FunctionProto] = {}
        self.calling: list[FunctionId] = []
        self.bound: dict[str, onnx.AttributeProto] | None = None
        self.body_initializers: dict[int, dict[str, onnx.TensorProto]] = {}

    def main(self, nodes: list[NodeFields], initializers: dict[str, onnx.TensorProto]) -> Scope:
        """The main graph's scope (and, in a model with bodies or functions, the names they
        must not take, and the functions' unnamed nodes named)."""
        model = self.model
        graph = model.proto.graph
        scope = Scope("", graph, nodes, model.node_names, model.renamed_nodes)
        scope.paths = model.node_names
        if model.inferred is not None:
            scope.inferred = model.inferred.graph
        self.handles.scopes.append(scope)
        if not model.nested:
            return scope
        self.op_graph.reserved = names_outside(model.proto)
        self.functions = self.handles.functions = {
            (f.domain, f.name, f.overload): named_function(f) for f in model.proto.functions
        }
        main = {value.name for value in graph.input}
        main.update(initializers)
        main.update(name for fields in nodes for name in fields.outputs if name)
        self.main_values = main
        self.taken.update(main)
        self.taken_nodes.update(model.node_names)
        return scope

    # -- names ----------------------------------------------------------------------------

    def resolve(self, scope: Scope, local: str) -> str | None:
        """The OpGraph name of the value ``local`` names in ``scope`` (its own, or an
        enclosing graph's, one read so far); None for none."""
        found: Scope | None = scope
        while found is not None:
            if found.values is None:  # the main graph
                return local if local in self.main_values or not self.model.nested else None
            name = found.values.get(local)
            if name is not None:
                return name
            if found.closed:  # a function sees nothing around its call
                return None
            found = found.parent
        return None

    def name(self, scope: Scope, local: str) -> str:
        """The OpGraph name of the value ``local`` names in ``scope`` ("" for an input left
        out)."""
        if not local:
            return ""
        found = self.resolve(scope, local)
        if found is None:
            where = f" in {scope.path!r}" if scope.path else ""
            raise GraphampError(f"a node{where} reads {local!r}, which no graph around it defines")
        return found

    def add_value(self, scope: Scope, local: str, *, graph_input: bool = False) -> str:
        """Add the value ``scope`` defines as ``local`` (a parameter, initializer or node
        output) as a tensor: its OpGraph name ("" for an output left out)."""
        if not local:
            return ""
        typed = self.typed
        if scope.path:
            assert scope.values is not None  # a body or a function's copy maps its names
            name = unique_name(f"{scope.path}/{local}", self.taken)
            scope.values[local] = name
            self.handles.values[name] = (scope, local)
            found = scope.types.get(local)
            if found is not None:
                typed.types[name] = found
            init = self._initializers(scope).get(local)
        else:
            name = local
            init = None
        tensor = typed.tensor(name, init, graph_input)
        tensor.body = scope.path
        self.op_graph.add_tensor(tensor)
        return name

    def _initializers(self, scope: Scope) -> dict[str, onnx.TensorProto]:
        key = id(scope)
        if key not in self.body_initializers:
            self.body_initializers[key] = {i.name: i for i in scope.graph.initializer}
        return self.body_initializers[key]

    def type_of(self, scope: Scope, local: str) -> bytes | None:
        """The TypeProto bytes of the value ``local`` names in ``scope`` (one not read yet:
        what its graph declares or inference found)."""
        if not local:
            return None
        found = scope.types.get(local)
        if found is not None:
            return found
        name = self.resolve(scope, local)
        return self.typed.types.get(name) if name else None

    def add_node(self, node: OpNode) -> None:
        self.op_graph.add_node(node)

    def is_tensor(self, name: str) -> bool:
        """Whether value ``name`` is a tensor (or of no known type), not a sequence, map or
        optional."""
        found = self.typed.types.get(name)
        return found is None or onnx.TypeProto.FromString(found).WhichOneof("value") in (
            None,
            "tensor_type",
        )

    def set_type(
        self, name: str, elem_type: int | None, shape: list[int | str | None] | None
    ) -> None:
        """Give value ``name`` a tensor type: ``elem_type`` (None: the one it has) and
        ``shape`` (None: the one it has), as the output model declares it."""
        type_ = onnx.TypeProto.FromString(self.typed.types.get(name, b""))
        tensor_type = type_.tensor_type
        if elem_type is not None:
            tensor_type.elem_type = elem_type
        if shape is not None:
            tensor_type.ClearField("shape")
            dims = tensor_type.shape.dim
            for dim in shape:
                entry = dims.add()
                if isinstance(dim, int):
                    entry.dim_value = dim
                elif dim is not None:
                    entry.dim_param = dim
        self.typed.types[name] = self.typed.type_bytes[name] = type_.SerializeToString()

    # -- graphs ---------------------------------------------------------------------------

    def open_body(
        self, scope: Scope, node: int, attribute: str, graph: onnx.GraphProto, body: Body
    ) -> Scope:
        """The scope of ``graph``, the body ``body`` held in attribute ``attribute`` of node
        ``node`` of ``scope`` (its parameters are then added, and it is read)."""
        from graphamp.onnx.dialect.functions import resolved_fields

        # in a function's copy, references to its attributes read as the call gives them
        nodes = resolved_fields(node_fields(graph), self.bound)
        names, renamed = node_names(nodes)
        inner = Scope(body.path, graph, nodes, names, renamed, values={}, parent=scope)
        inner.owner, inner.attribute, inner.body = node, attribute, body
        inner.paths = [""] * len(nodes)
        inner.inferred = _inferred_body(scope, node, attribute, graph)
        inner.declared, inner.types = value_types(graph, inner.inferred)
        self.handles.scopes.append(inner)
        return inner

    def read_body(self, scope: Scope) -> None:
        """Read ``scope``'s initializers (those no parameter is) and nodes."""
        assert scope.body is not None and scope.values is not None
        self.op_graph.add_body(scope.body)
        for init in scope.graph.initializer:
            if init.name not in scope.values:
                self.add_value(scope, init.name)
        self.read_graph(scope)

    def read_graph(self, scope: Scope) -> None:
        """Read ``scope``'s nodes: the plain ones in runs, the others entered."""
        nodes = scope.nodes
        owners = self._owners(scope) if self.model.nested else []
        start = 0
        for index in [*owners, len(nodes)]:
            if start < index:
                self._read_run(scope, start, index)
            if index < len(nodes):
                self._enter(scope, index)
            start = index + 1

    def _owners(self, scope: Scope) -> list[int]:
        """The nodes of ``scope`` that own a body or call a model-local function."""
        functions = self.functions
        return [
            index
            for index, fields in enumerate(scope.nodes)
            if fields.op_type in _BODY_OPS
            or (fields.domain, fields.op_type, "") in functions
            or any(a.type in _SUBGRAPHS for a in fields.attributes)
            or _overload_call(scope, index, functions)
        ]

    def _read_run(self, scope: Scope, start: int, stop: int) -> None:
        """Read nodes ``start`` to ``stop`` of ``scope``, none of which owns a body."""
        nodes, names = scope.nodes, scope.names
        if scope.path:  # a body's: its values and nodes named by their paths
            nodes, names = self._named_run(scope, start, stop), names[start:stop]
            paths = scope.paths[start:stop]
        elif start or stop < len(nodes):
            nodes, names = nodes[start:stop], names[start:stop]
            paths = names
        else:
            paths = names
        read_nodes(
            self.op_graph,
            nodes,
            names,
            paths,
            self.typed,
            self.opsets,
            self.target,
            self.provider,
            self.signatures,
            scope.path,
        )

    def _named_run(self, scope: Scope, start: int, stop: int) -> list[NodeFields]:
        """Nodes ``start`` to ``stop`` of a body with OpGraph names: inputs resolved, outputs
        named (in node order), each node's path set."""
        run = []
        typed, handles, taken, values = self.typed, self.handles, self.taken, scope.values
        assert values is not None  # a body's
        for index in range(start, stop):
            fields = scope.nodes[index]
            inputs = [self.name(scope, local) for local in fields.inputs]
            outputs = []
            for local in fields.outputs:
                if local:
                    name = unique_name(f"{scope.path}/{local}", taken)
                    values[local] = name
                    handles.values[name] = (scope, local)
                    found = scope.types.get(local)
                    if found is not None:
                        typed.types[name] = found
                    outputs.append(name)
                else:
                    outputs.append("")
            path = unique_name(f"{scope.path}/{scope.names[index]}", self.taken_nodes)
            scope.paths[index] = path
            handles.nodes[path] = (scope, index)
            run.append(fields._replace(inputs=inputs, outputs=outputs))
        return run

    def _enter(self, scope: Scope, index: int) -> None:
        """Read node ``index`` of ``scope``, which owns a body or calls a function: entered
        where it is one graphamp reads (If, Loop, Scan, SequenceMap, a model-local
        function), else kept whole as a ``CONTROL_FLOW`` node that reads what its bodies
        read from around it."""
        from graphamp.onnx.dialect import bodies, functions

        fields = scope.nodes[index]
        local = scope.names[index]
        if scope.path:
            path = unique_name(f"{scope.path}/{local}", self.taken_nodes)
            scope.paths[index] = path
            self.handles.nodes[path] = (scope, index)
        else:
            path = local
        op_node = OpNode(
            name=path,
            op=slots.op_name(fields.op_type, fields.domain),
            inputs=[self.name(scope, value) for value in fields.inputs],
            outputs=[],
            domain=fields.domain,
            scope=module_path_of_entries(fields.metadata) or local,
            schema_source=f"opset {self.opsets.get('', 0)}",
            body=scope.path,
        )
        if functions.enter(self, scope, index, op_node) or bodies.enter(
            self, scope, index, op_node
        ):
            return
        op_node.outputs = [self.add_value(scope, value) for value in fields.outputs]
        op_node.kind = NodeKind.CONTROL_FLOW  # kept whole, with its bodies as they are
        op_node.implicit_inputs = self._outer_reads(scope, scope.graph.node[index])
        self.op_graph.add_node(op_node)
        tensors = self.op_graph.tensors
        for slot, output in enumerate(op_node.outputs):
            if output and tensors[output].dtype == UNKNOWN:
                fallback = slots.output_type_fallback(op_node, fields.op_type, slot, self.opsets)
                tensors[output].dtype = fallback or UNKNOWN

    def _outer_reads(self, scope: Scope, node: onnx.NodeProto) -> list[str]:
        """The OpGraph names of the values around ``scope``'s node that its subgraphs read,
        in first-use order (a name a subgraph defines itself is its own)."""
        found: dict[str, None] = {}

        def walk(graph: onnx.GraphProto, inner: frozenset[str]) -> None:
            defined = inner.union(
                (v.name for v in graph.input),
                (t.name for t in graph.initializer),
                (out for node in graph.node for out in node.output),
            )
            for child in graph.node:
                for local in child.input:
                    if local and local not in defined:
                        name = self.resolve(scope, local)
                        if name is not None:
                            found.setdefault(name)
                for body in bodies(child):
                    walk(body, defined)

        for body in bodies(node):
            walk(body, frozenset())
        return list(found)


_BODY_OPS = frozenset({*slots.CONTROL_FLOW_OPS, "SequenceMap"})


def _overload_call(scope: Scope, index: int, functions: Mapping[FunctionId, object]) -> bool:
    """Whether node ``index`` calls a function given with an overload (rare: looked up only
    where the model has one)."""
    if not any(key[2] for key in functions):
        return False
    node = scope.graph.node[index]
    return (node.domain, node.op_type, node.overload) in functions


def _inferred_body(
    scope: Scope, node: int, attribute: str, graph: onnx.GraphProto
) -> onnx.GraphProto | None:
    """The inferred graph of the body ``graph`` (node ``node``'s ``attribute``), where the
    inferred model holds one of the same structure."""
    outer = scope.inferred
    if outer is None or node >= len(outer.node):
        return None
    for found in outer.node[node].attribute:
        if found.name == attribute and found.type == onnx.AttributeProto.GRAPH:
            return found.g
    return None
