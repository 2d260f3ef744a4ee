"""Each call site's copy of a model-local function written back
(:mod:`graphamp.onnx.dialect.functions` reads them): a copy that came out as the function was stays
a call of the function; the others are grouped by content, and each distinct one is added to the
model once, named
``<function>__<digest>`` (the first 8 hex digits of its content's SHA-256: the same decisions
give the same name, run after run), and called instead. A function no call reads any more is
removed. Innermost call sites go first, so a copy that calls another function calls that call
site's own copy. With ``--inline-functions`` each call is replaced by its copy's nodes instead,
named by their OpGraph paths, and the model is typed again by ONNX inference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import onnx

from graphamp.onnx.dialect.functions import resolved
from graphamp.onnx.dialect.graph_edit import GraphEdit, read_renamed
from graphamp.onnx.dialect.handles import CallSite, FunctionId, ProtoHandles
from graphamp.onnx.io.proto_model import ProtoModel
from graphamp.onnx.io.subgraphs import bodies, graphs


class Writer:
    """Writes each call site's copy back as a function of the model, or inline (the module
    docstring), as the writer finishes the copies, innermost first."""

    def __init__(
        self, model: ProtoModel, handles: ProtoHandles, graphs: dict[int, GraphEdit]
    ) -> None:
        self.model, self.handles, self.graphs = model, handles, graphs
        self.calls = {id(call.copy): call for call in handles.calls}
        self.functions = handles.functions
        self.originals = {key: _content(f) for key, f in self.functions.items()}
        self.added: dict[bytes, FunctionId] = {}
        self.new: list[onnx.FunctionProto] = []
        self.inlined = False

    def write(self, graph: GraphEdit) -> None:
        """Write back the copy ``graph`` holds, its bodies and the calls in it written."""
        call = self.calls[id(graph.scope)]
        if self.model.inline_functions:
            self._inline(call, graph)
            return
        nodes = [graph.nodes[index] for index in graph.order()]
        function = _with_nodes(self.functions[call.function], nodes)
        content = _content(function)
        if content == self.originals[call.function]:
            return
        key = self.added.get(content)
        if key is None:
            domain, name, overload = call.function
            digest = hashlib.sha256(content).hexdigest()[:8]
            key = (domain, f"{name}__{digest}", overload)
            function.name = key[1]
            self.new.append(function)
            self.added[content] = key
        self.graphs[id(call.scope)].node(call.node + 1).op_type = key[1]

    def _inline(self, call: CallSite, graph: GraphEdit) -> None:
        """The call replaced by its copy's nodes, named by their OpGraph paths, their values
        by their OpGraph names (``<call>/<function>/<name>``: a plan of the inlined model names
        them as this conversion's plan does); a result the copy does not compute (an input
        passed through) comes through an Identity."""
        caller, at = self.graphs[id(call.scope)], call.node + 1
        node = caller.nodes[at]
        function, copy = self.functions[call.function], graph.scope
        renamed = dict(copy.values or {})  # the copy's values: by their OpGraph names
        for formal, actual in zip(function.input, node.input, strict=False):
            if actual:  # a parameter given at the call: the call's input itself
                renamed[formal] = actual
        results = [
            _local(self.handles, graph.results[slot]) if slot in graph.results else formal
            for slot, formal in enumerate(function.output)
        ]
        produced: dict[str, onnx.NodeProto] = {}
        moved = []
        for index in graph.order():
            inner = onnx.NodeProto()
            inner.CopyFrom(graph.nodes[index])
            if index <= len(copy.paths):
                inner.name = copy.paths[index - 1]
            read_renamed(inner, renamed, inside_only=False)
            resolved_list = resolved(list(inner.attribute), call.attributes)
            kept = [a for a in resolved_list if not a.ref_attr_name]
            del inner.attribute[:]
            inner.attribute.extend(kept)
            for slot, name in enumerate(inner.output):
                inner.output[slot] = renamed.get(name, name)
                produced[inner.output[slot]] = inner
            moved.append(inner)
        path = call.scope.paths[call.node]
        for slot, result in enumerate(node.output):
            if not result or slot >= len(results):
                continue
            inner_name = renamed.get(results[slot], results[slot])
            producer = produced.get(inner_name)
            if producer is None:  # passed through: an Identity of the value
                identity = onnx.helper.make_node(
                    "Identity", [inner_name], [result], name=f"{path}/{slot}"
                )
                moved.append(identity)
                continue
            for inner in moved:  # the value takes the call's output's name
                read_renamed(inner, {inner_name: result}, inside_only=False)
                for position, name in enumerate(inner.output):
                    if name == inner_name:
                        inner.output[position] = result
        for inner in moved:
            caller.outputs[caller.add(inner, caller.prev[at])] = list(inner.output)
        caller.unlink(at)
        self.inlined = True

    def finish(self, out: onnx.ModelProto) -> None:
        """The model's functions: its own (unnamed nodes named), less those no call reaches
        any more, and the copies added."""
        if not self.functions:
            return
        if self.inlined:  # the inlined values typed as ONNX inference types them
            _infer_types(out)
        called_before = {call.function for call in self.handles.calls}
        every = {**self.functions, **{_key(f): f for f in self.new}}
        reached = _called(out.graph, every)
        del out.functions[:]
        out.functions.extend(
            function
            for key, function in self.functions.items()
            if key not in called_before or key in reached
        )
        out.functions.extend(self.new)


def _key(function: onnx.FunctionProto) -> FunctionId:
    return (function.domain, function.name, function.overload)


def _with_nodes(function: onnx.FunctionProto, nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
    """``function`` with ``nodes``, and no value types (a function takes its types from its
    call site, whatever the conversion learned at one)."""
    out = onnx.FunctionProto()
    out.CopyFrom(function)
    del out.node[:]
    out.node.extend(nodes)
    del out.value_info[:]
    return out


def _content(function: onnx.FunctionProto) -> bytes:
    """What tells one copy of a function from another: the function without value types."""
    if function.value_info:
        function = _with_nodes(function, list(function.node))
    return function.SerializeToString(deterministic=True)


def _called(
    graph: onnx.GraphProto, functions: dict[FunctionId, onnx.FunctionProto]
) -> set[FunctionId]:
    """The functions a call reaches from ``graph``, through its bodies and the functions it
    calls."""
    found: set[FunctionId] = set()
    pending: list[Sequence[onnx.NodeProto]] = [graph.node]
    while pending:
        for node in pending.pop():
            key = (node.domain, node.op_type, node.overload)
            if key in functions and key not in found:
                found.add(key)
                pending.append(functions[key].node)
            pending.extend(body.node for body in bodies(node))
    return found


def _local(handles: ProtoHandles, tensor: str) -> str:
    found = handles.values.get(tensor)
    return found[1] if found is not None else tensor


def _infer_types(out: onnx.ModelProto) -> None:
    """Every value of every graph of ``out`` typed as ONNX inference (with data propagation)
    types it: its type and shape where inference gives them, an entry added for a value
    inference types that has none (nothing changes where inference gives up)."""
    from graphamp.onnx.io.files import without_large_initializers

    try:
        inferred = onnx.shape_inference.infer_shapes(
            without_large_initializers(out),
            check_type=False,
            strict_mode=False,
            data_prop=True,
        )
    except Exception:  # inference gives up: the types stay those the conversion wrote
        return
    for graph, found in zip(graphs(out.graph), graphs(inferred.graph), strict=False):
        infos = {v.name: v for v in (*found.input, *found.value_info, *found.output)}
        known = set()
        for value in (*graph.input, *graph.output, *graph.value_info):
            known.add(value.name)
            info = infos.get(value.name)
            if info is None or not info.type.HasField("tensor_type"):
                continue
            tensor_type, inferred_type = value.type.tensor_type, info.type.tensor_type
            if inferred_type.HasField("shape"):
                tensor_type.shape.CopyFrom(inferred_type.shape)
            if inferred_type.elem_type:
                tensor_type.elem_type = inferred_type.elem_type
        graph.value_info.extend(info for info in found.value_info if info.name not in known)
