"""The names an ONNX model holds outside its main graph, for :class:`graphamp.core.names.Names`."""

from __future__ import annotations

import onnx_ir as ir


def names_outside(model: ir.Model) -> set[str]:
    """Every node and value name inside the model's subgraphs (control flow) and functions:
    a name graphamp adds to the main graph must differ from them too (ONNX names a value once
    in the whole model)."""
    names: set[str] = set()
    scopes: list[ir.Graph | ir.Function] = list(model.functions.values())
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.graph is not model.graph:
            _add(names, node)
    for function in scopes:
        names.update(value.name for value in (*function.inputs, *function.outputs) if value.name)
        for node in ir.traversal.RecursiveGraphIterator(function):
            _add(names, node)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for attribute in node.attributes.values():
            for sub in _graphs(attribute):
                names.update(value.name for value in sub.inputs if value.name)
    return names


def _add(names: set[str], node: ir.Node) -> None:
    if node.name:
        names.add(node.name)
    names.update(value.name for value in node.outputs if value.name)


def _graphs(attribute: ir.Attr) -> list[ir.Graph]:
    if attribute.is_ref():
        return []
    if attribute.type == ir.AttributeType.GRAPH:
        return [attribute.value]
    if attribute.type == ir.AttributeType.GRAPHS:
        return list(attribute.value)
    return []
