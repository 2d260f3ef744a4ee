"""Applying an edit script to a torch.fx GraphModule.

Casts are explicit ``aten._to_copy(x, dtype=...)`` nodes, one per (value, dtype), so autograd
flows through them and ``torch.compile`` sees them. Nodes a training pass added are built by
:mod:`graphamp.fx.lowering`; state a pass added becomes new placeholders and outputs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import fx, nn

from graphamp.dialects.base import ReadGraph
from graphamp.edits import EditScript
from graphamp.fx import lowering
from graphamp.fx.reader import FxHandles, attribute, flat, set_attribute
from graphamp.fx.types import torch_dtype
from graphamp.passes.numerics import FLOAT32_LIMIT, stand_in


def apply(read: ReadGraph, script: EditScript) -> fx.GraphModule:
    """Apply ``script`` to the captured module (modified in place and returned)."""
    module: fx.GraphModule = read.model
    graph = module.graph
    handles: FxHandles = read.handles
    values = dict(handles.nodes)  # tensor name -> fx node holding it; grows with the casts
    body = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))

    def after(source: fx.Node) -> AbstractContextManager[None]:
        # Casts of inputs and parameters go at the top of the body, after every placeholder.
        return (
            graph.inserting_before(body)
            if source.op in ("placeholder", "get_attr")
            else graph.inserting_after(source)
        )

    for record in script.weights:
        source = values[record.name]
        param = attribute(module, source.target)  # type: ignore[arg-type]
        # Stored low (weights="low", the inference mode) but still trainable where it was:
        # backward then gives it gradients in the low type instead of silently none.
        converted = nn.Parameter(
            _to_low(param.detach(), record.dst),  # type: ignore[attr-defined]
            requires_grad=bool(getattr(param, "requires_grad", False)),
        )
        if record.in_place:
            set_attribute(module, source.target, converted)  # type: ignore[arg-type]
        else:
            target = record.stored_as.replace(".", "_")
            module.register_parameter(target, converted)
            with after(source):
                values[record.stored_as] = graph.get_attr(target)

    for record in script.casts:
        source = values[record.tensor]
        with after(source):
            values[record.output] = graph.call_function(
                torch.ops.aten._to_copy.default, (source,), {"dtype": torch_dtype(record.dst)}
            )

    for name, initial in script.new_inputs.items():  # state: placeholders after the others
        with graph.inserting_before(body):
            values[name] = graph.placeholder(name.replace(".", "_"))
        dtype = torch_dtype(read.graph.tensors[name].dtype)
        values[name].meta["val"] = torch.tensor(initial, dtype=dtype)
    for name in script.new_nodes:
        lowering.build(graph, read.graph.nodes[name], values)

    # Kept outputs: the low value cast back for the caller, right after it, so that a float32
    # reader of the output (rewired below) reads the same Cast.
    output = next(n for n in graph.nodes if n.op == "output")
    for record in script.output_casts:
        source = values[record.output]
        with after(source):
            cast = graph.call_function(
                torch.ops.aten._to_copy.default, (source,), {"dtype": torch_dtype(record.dst)}
            )
        output.replace_input_with(source, cast)
        values[record.tensor], values[record.output] = source, cast

    for (node_name, slot), tensor in script.rewire.items():
        # The slot-th tensor argument as traced (the reader's order): a pass that reroutes
        # (the training passes) has already changed the OpGraph's inputs to the new value.
        node = values[node_name]
        old = [a for a in flat([node.args, node.kwargs]) if isinstance(a, fx.Node)][slot]
        node.replace_input_with(old, values[tensor])  # type: ignore[arg-type]

    for node_name in script.hoist_casts:  # right after the producer of its (rewired) input
        node, source = values[node_name], values[node_name].args[0]
        if source.op == "placeholder":  # type: ignore[union-attr]
            source = [n for n in graph.nodes if n.op == "placeholder"][-1]
        source.append(node)  # type: ignore[union-attr]

    for node_name, dtype in script.retarget_casts.items():
        node = values[node_name]
        node.kwargs = {**node.kwargs, "dtype": torch_dtype(dtype)}
    for node_name in script.remove_nodes:
        node = values[node_name]
        node.replace_all_uses_with(node.args[0])  # type: ignore[arg-type]
        graph.erase_node(node)

    for old, new in script.replace_outputs.items():
        output.replace_input_with(values[old], values[new])
    if script.new_outputs:
        results = output.args[0]
        results = list(results) if isinstance(results, tuple | list) else [results]
        output.args = (tuple(results + [values[name] for name in script.new_outputs]),)

    graph.lint()
    module.recompile()
    return module


def _to_low(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """``values`` in ``dtype``, float32's lowest/highest stored at +-half ``dtype``'s largest
    (a mask's stand-in for infinity; see graphamp.passes.numerics.FLOAT32_LIMIT), not as inf."""
    if values.dtype == torch.float32:
        at_limit = values.abs() == FLOAT32_LIMIT
        if bool(at_limit.any()):
            values = torch.where(at_limit, values.sign() * stand_in(dtype), values)
    return values.to(torch_dtype(dtype))
