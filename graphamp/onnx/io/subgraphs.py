"""What an ONNX model's graphs hold, read from its protos: the bodies inside a node (an If's
branches, a Loop's or Scan's body), every graph of a model, the names a model uses and the
element types a graph declares."""

from __future__ import annotations

from collections.abc import Iterator

import onnx

_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS

Scope = onnx.GraphProto | onnx.FunctionProto


def named_bodies(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """The graphs ``node``'s attributes hold, in attribute order, each with its attribute's
    name (``then_branch``, ``body``)."""
    found: list[tuple[str, onnx.GraphProto]] = []
    for attribute in node.attribute:
        if attribute.type == _GRAPH:
            found.append((attribute.name, attribute.g))
        elif attribute.type == _GRAPHS:
            found.extend((attribute.name, graph) for graph in attribute.graphs)
    return found


def bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs ``node``'s attributes hold, in attribute order."""
    return [graph for _, graph in named_bodies(node)]


def twinned_bodies(
    node: onnx.NodeProto, twin: onnx.NodeProto | None
) -> list[tuple[str, onnx.GraphProto, onnx.GraphProto | None]]:
    """:func:`named_bodies` of ``node``, each with the body at the same attribute and place in
    ``twin`` (the same node in another copy of the model: the type-inferred one), or None."""
    theirs: dict[str, list[onnx.GraphProto]] = {}
    for name, graph in named_bodies(twin) if twin is not None else []:
        theirs.setdefault(name, []).append(graph)
    found: list[tuple[str, onnx.GraphProto, onnx.GraphProto | None]] = []
    for name, graph in named_bodies(node):
        index = sum(1 for seen, _, _ in found if seen == name)
        others = theirs.get(name, [])
        found.append((name, graph, others[index] if index < len(others) else None))
    return found


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every body inside it, at any depth (each before the bodies inside it, in
    node order)."""
    yield graph
    for node in graph.node:
        for body in bodies(node):
            yield from graphs(body)


def scopes(model: onnx.ModelProto) -> Iterator[Scope]:
    """The main graph, the model's functions, and every body inside any of them, at any depth
    (each before the bodies inside it)."""
    pending: list[Scope] = [model.graph, *model.functions]
    while pending:
        scope = pending.pop(0)
        yield scope
        pending[:0] = [body for node in scope.node for body in bodies(node)]


def model_names(model: onnx.ModelProto) -> set[str]:
    """Every node and value name anywhere in ``model``: graphs, bodies and functions."""
    names: set[str] = set()
    for scope in scopes(model):
        if isinstance(scope, onnx.GraphProto):
            infos = (*scope.input, *scope.output, *scope.value_info)
            names.update(info.name for info in infos)
            names.update(init.name for init in scope.initializer)
            names.update(sparse.values.name for sparse in scope.sparse_initializer)
        else:
            names.update(scope.input)
            names.update(scope.output)
        for node in scope.node:
            names.add(node.name)
            names.update(node.input)
            names.update(node.output)
    names.discard("")
    return names


def element_types(graph: onnx.GraphProto) -> dict[str, int]:
    """ONNX element type by value name for what ``graph`` itself declares (not its bodies):
    its initializers, then its value_info, inputs and outputs (a graph input's or output's
    own declaration wins over a value_info entry of the same name)."""
    types = {init.name: init.data_type for init in graph.initializer}
    for info in (*graph.value_info, *graph.input, *graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    return types
