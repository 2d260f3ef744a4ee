"""Applying an edit script to a torch.fx GraphModule.

Casts are explicit ``aten._to_copy(x, dtype=...)`` nodes, one per (value, dtype), so autograd
flows through them and ``torch.compile`` sees them. Nodes a training pass added are built by
:mod:`graphamp.fx.dialect.lowering`; state a pass added becomes new placeholders and outputs.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager

import torch
from torch import fx, nn

from graphamp.dialects.base import ReadGraph
from graphamp.errors import InternalError
from graphamp.fx.dialect import hops, lowering
from graphamp.fx.dialect.ops import (
    attribute_of,
    flat,
    known_shape,
    set_attribute,
    value_arg,
)
from graphamp.fx.dialect.reader import Boundary, FxHandles
from graphamp.fx.dialect.types import torch_dtype
from graphamp.passes.numerics import FLOAT32_LIMIT, stand_in
from graphamp.plans.edits import EditScript


def apply(read: ReadGraph, script: EditScript) -> fx.GraphModule:
    """Apply ``script`` to the captured module (modified in place and returned)."""
    module: fx.GraphModule = read.model
    graph = module.graph
    handles: FxHandles = read.handles
    values = dict(handles.nodes)  # tensor name -> fx node holding it; grows with the casts
    body = _first_op(graph)
    scopes = _Scopes(handles, values)
    after = scopes.after

    for weight in script.weights:
        source = values[weight.name]
        path, param = _weight(module, source)
        # Stored low (weights="low", the inference mode) but still trainable where it was:
        # backward then gives it gradients in the low type instead of silently none.
        converted = nn.Parameter(
            _to_low(param.detach(), weight.dst),
            requires_grad=param.requires_grad,
        )
        if weight.in_place:
            set_attribute(module, path, converted)
        else:
            target = weight.stored_as.replace(".", "_")
            module.register_parameter(target, converted)
            with after(source):
                values[weight.stored_as] = graph.get_attr(target)

    for record in script.casts:
        source = values[record.tensor]
        with after(source):
            values[record.output] = source.graph.call_function(
                torch.ops.aten._to_copy.default, (source,), {"dtype": torch_dtype(record.dst)}
            )
        scopes.casts[record.output] = (record.tensor, record.dst)

    for name, initial in script.new_inputs.items():  # state: placeholders after the others
        with graph.inserting_before(body):
            values[name] = graph.placeholder(re.sub(r"\W", "_", name))  # an identifier
        info = read.graph.tensors[name]
        shape = known_shape(info)
        values[name].meta["val"] = torch.full(shape, initial, dtype=torch_dtype(info.dtype))
    for name in script.new_nodes:
        lowering.build(graph, read.graph.nodes[name], values)

    # Kept outputs: the low value cast back for the caller, right after it, so that a float32
    # reader of the output (rewired below) reads the same Cast.
    output = next(n for n in graph.nodes if n.op == "output")
    # An fx node and its value share a name: after the loop below, values[name] of a kept
    # output is the Cast its readers are rewired to, and the edits after it find nodes here.
    nodes = dict(values)
    for record in script.output_casts:
        source = values[record.output]
        with after(source):
            cast = graph.call_function(
                torch.ops.aten._to_copy.default, (source,), {"dtype": torch_dtype(record.dst)}
            )
        output.replace_input_with(source, cast)
        values[record.tensor], values[record.output] = source, cast

    for (node_name, slot), tensor in script.rewire.items():
        if node_name in handles.boundaries:
            scopes.rewire_boundary(handles.boundaries[node_name], slot, tensor)
            continue
        # The slot-th tensor argument as traced (the reader's order): a pass that reroutes
        # (the training passes) has already changed the OpGraph's inputs to the new value.
        node = nodes[node_name]
        traced = [a for a in flat([node.args, node.kwargs]) if isinstance(a, fx.Node)][slot]
        node.replace_input_with(traced, scopes.value(tensor, node.graph))

    for node_name in script.hoist_casts:  # right after the producer of its (rewired) input
        node = nodes[node_name]
        producer = value_arg(node)
        if producer.op == "placeholder":
            producer = [n for n in producer.graph.nodes if n.op == "placeholder"][-1]
        producer.append(node)

    for node_name, dtype in script.retarget_casts.items():
        node = nodes[node_name]
        node.kwargs = {**node.kwargs, "dtype": torch_dtype(dtype)}
    for node_name in script.remove_nodes:
        node = nodes[node_name]
        node.replace_all_uses_with(value_arg(node))
        node.graph.erase_node(node)
    for name in script.erase_nodes:  # replaced by a node a pass added: nothing reads it now
        graph.erase_node(nodes[name])
    for name in script.removed_inputs:  # a pass gave every reader another value
        graph.erase_node(values[name])

    for old, new in script.replace_outputs.items():
        output.replace_input_with(values[old], values[new])
    if script.new_outputs:
        results = output.args[0]
        results = list(results) if isinstance(results, tuple | list) else [results]
        output.args = (tuple(results + [values[name] for name in script.new_outputs]),)

    for call in handles.calls.values():
        hops.drop_unread_operands(call)
    for body_module in scopes.bodies():
        body_module.graph.lint()
        body_module.recompile()
    graph.lint()
    module.recompile()
    return module


def _first_op(graph: fx.Graph) -> fx.Node:
    return next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))


class _Scopes:
    """Values used where they were not made: a value of an enclosing graph read inside a
    body is passed in as one more operand of each call on the way (once per value and call,
    so the branches of a cond share it); a cast of a loop-carried value made in one body of
    the loop is made again in the other that reads it."""

    def __init__(self, handles: FxHandles, values: dict[str, fx.Node]) -> None:
        self.handles, self.values = handles, values
        self.local = dict(handles.placeholders)  # (name, graph) -> the node holding it there
        self.casts: dict[str, tuple[str, str]] = {}  # cast output -> (its tensor, its dtype)
        self.tops: dict[fx.Graph, fx.Node] = {}
        self.calls = {  # body graph -> the call running it
            body.graph: call for call in handles.calls.values() for _, body in call.bodies
        }

    def after(self, source: fx.Node) -> AbstractContextManager[None]:
        """Where a cast of ``source`` goes: right after it, or, for an input or a parameter,
        at the top of its graph after every placeholder (before the graph's first op as read,
        so such casts keep the order they were made in)."""
        graph = source.graph
        if source.op in ("placeholder", "get_attr"):
            if graph not in self.tops:
                self.tops[graph] = _first_op(graph)
            return graph.inserting_before(self.tops[graph])
        return graph.inserting_after(source)

    def bodies(self) -> list[fx.GraphModule]:
        return [body for call in self.handles.calls.values() for _, body in call.bodies]

    def value(self, name: str, graph: fx.Graph) -> fx.Node:
        """The node holding OpGraph value ``name`` in ``graph``."""
        node = self.values[name]
        if node.graph is graph:
            return node
        if (name, graph) in self.local:
            return self.local[(name, graph)]
        call = self.calls.get(graph)
        if call is not None and self._encloses(node.graph, graph):
            outer = self.value(name, call.node.graph)
            for attribute_name, placeholder in hops.add_operand(call, outer).items():
                self.local[(name, dict(call.bodies)[attribute_name].graph)] = placeholder
            return self.local[(name, graph)]
        if name not in self.casts:
            raise InternalError(f"value {name!r} is read in a graph it cannot reach")
        source, dtype = self.casts[name]
        value = self.value(source, graph)
        with self.after(value):
            cast = graph.call_function(
                torch.ops.aten._to_copy.default, (value,), {"dtype": torch_dtype(dtype)}
            )
        self.local[(name, graph)] = cast
        return cast

    def _encloses(self, outer: fx.Graph, graph: fx.Graph) -> bool:
        while graph is not outer:
            call = self.calls.get(graph)
            if call is None:
                return False
            graph = call.node.graph
        return True

    def rewire_boundary(self, boundary: Boundary, slot: int, name: str) -> None:
        """A boundary node's slot reads ``name``: a loop enters with it, a map slices it, or a
        body returns it."""
        call = self.handles.calls[boundary.call]
        if boundary.role in ("carried", "slice") and slot == 0:
            value = self.value(name, call.node.graph)
            hops.set_entering(call.node, boundary.index, value)
            return
        body = dict(call.bodies)[call.results[0 if boundary.role == "carried" else slot]]
        hops.set_returned(body, boundary.index, self.value(name, body.graph))


def _weight(module: nn.Module, node: fx.Node) -> tuple[str, torch.Tensor]:
    """The attribute path a weight's ``get_attr`` node reads, and the tensor there."""
    value = attribute_of(module, node)
    if not isinstance(value, torch.Tensor):
        raise InternalError(f"weight node {node.name!r} reads no tensor ({node.target!r})")
    return str(node.target), value


def _to_low(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """``values`` in ``dtype``, float32's lowest/highest stored at +-half ``dtype``'s largest
    (a mask's stand-in for infinity; see graphamp.passes.numerics.FLOAT32_LIMIT), not as inf."""
    if values.dtype == torch.float32:
        at_limit = values.abs() == FLOAT32_LIMIT
        if bool(at_limit.any()):
            values = torch.where(at_limit, values.sign() * stand_in(dtype), values)
    return values.to(torch_dtype(dtype))
