"""Nodes out of topological order, sorted as onnxruntime sorts them when it loads a model.

ONNX asks for nodes in topological order, and onnxruntime loads a model whose nodes are not
(it sorts them itself); graphamp converts such a model and writes it sorted. Only a real
cycle is refused, naming its nodes. A node depends on the producers of what it reads and of
what its subgraphs read from enclosing graphs; each graph (main, bodies, functions) is sorted
on its own, keeping the given order wherever the dependencies allow (so a model already in
order is left as it is, object and bytes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx

from graphamp.errors import GraphampError
from graphamp.onnx.io.subgraphs import bodies

if TYPE_CHECKING:
    from graphamp.onnx.validation.validate_nodes import NodeFields

log = logging.getLogger(__name__)


def topologically_sorted(
    proto: onnx.ModelProto, where: str, nodes: Sequence[NodeFields] | None = None
) -> onnx.ModelProto:
    """``proto`` itself when every graph is in order; else a sorted copy (``proto`` is never
    changed). A cycle is a GraphampError naming its nodes. ``nodes``: the main graph's nodes'
    fields, where read already (each read of a protobuf field builds new objects)."""
    main = (
        _in_order(proto.graph)
        if nodes is None
        else _in_order(proto.graph, [(n.inputs, n.outputs, n.attributes) for n in nodes])
    )
    if main and functions_in_order(proto):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graphs: list[onnx.GraphProto | onnx.FunctionProto] = [copy.graph, *copy.functions]
    moved = sum(_sort(graph, where) for graph in graphs)
    log.info("%s: %d graph(s) had nodes out of topological order: sorted", where, moved)
    return copy


def functions_in_order(proto: onnx.ModelProto) -> bool:
    """Whether every model-local function's nodes are in topological order."""
    return all(_in_order(function) for function in proto.functions)


def _in_order(
    graph: onnx.GraphProto | onnx.FunctionProto,
    fields: Sequence[tuple[Sequence[str], Sequence[str], Sequence[object]]] | None = None,
) -> bool:
    # Runs on every model converted: one pass over the inputs, and the outer reads of
    # subgraphs (a set per body) only for the nodes that have bodies. ``fields``: each node's
    # (inputs, outputs, attributes), where read already.
    if fields is None:
        fields = [(node.input, node.output, node.attribute) for node in graph.node]
    produced: dict[str, int] = {}
    for index, (_, outputs, _) in enumerate(fields):
        for output in outputs:
            if output:
                produced.setdefault(output, index)
    for index, (inputs, _, attributes) in enumerate(fields):
        for name in inputs:
            if produced.get(name, -1) >= index:
                return False
        if not attributes:
            continue
        node = graph.node[index]
        subgraphs = bodies(node)
        if subgraphs and any(produced.get(name, -1) >= index for name in _reads(node)):
            return False
        if not all(_in_order(sub) for sub in subgraphs):
            return False
    return True


def _sort(graph: onnx.GraphProto | onnx.FunctionProto, where: str) -> int:
    """Sort ``graph`` (and the bodies of its nodes) in place; how many graphs changed."""
    import networkx as nx

    changed = 0
    for node in graph.node:
        for sub in bodies(node):
            changed += _sort(sub, where)
    if _in_order(graph):
        return changed
    produced = _producers(graph)
    nodes = list(graph.node)
    deps: nx.DiGraph[int] = nx.DiGraph()
    deps.add_nodes_from(range(len(nodes)))
    for index, node in enumerate(nodes):
        for name in _reads(node):
            if name in produced and produced[name] != index:
                deps.add_edge(produced[name], index)
            elif produced.get(name) == index:
                raise GraphampError(
                    f"{where}: node {_label(node, index)!r} reads its own output {name!r}"
                )
    try:
        order = list(nx.lexicographical_topological_sort(deps))
    except nx.NetworkXUnfeasible:
        cycle = [a for a, _ in nx.find_cycle(deps)]
        start = cycle.index(min(cycle))  # from the first node of the cycle in the file
        cycle = [*cycle[start:], *cycle[:start], cycle[start]]
        names = " -> ".join(_label(nodes[index], index) for index in cycle)
        raise GraphampError(f"{where}: the graph has a cycle: {names}") from None
    del graph.node[:]
    graph.node.extend(nodes[index] for index in order)
    return changed + 1


def _producers(graph: onnx.GraphProto | onnx.FunctionProto) -> dict[str, int]:
    produced: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for output in node.output:
            if output:
                produced.setdefault(output, index)
    return produced


def _reads(node: onnx.NodeProto) -> set[str]:
    """What ``node`` reads: its inputs, and what its subgraphs read from outside them."""
    names = {name for name in node.input if name}
    for sub in bodies(node):
        names |= _free(sub)
    return names


def _free(graph: onnx.GraphProto) -> set[str]:
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    read: set[str] = set()
    for node in graph.node:
        read |= _reads(node) - defined
        defined.update(node.output)
    return read


def _label(node: onnx.NodeProto, index: int) -> str:
    name = node.name  # bytes where it is not UTF-8 (sorting runs before strings are checked)
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return name or f"{node.op_type} #{index}"
