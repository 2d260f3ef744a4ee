"""PyTorch's higher-order ops (``torch.cond``, ``torch.while_loop``, ``torch.map``) as scopes.

torch.export writes such a call as one node of ``torch.ops.higher_order.*`` whose bodies are
GraphModules read with ``get_attr``; each body takes the call's operands as its placeholders
and returns the call's outputs. This module knows, for each op, which arguments are bodies,
which values bind to each body's placeholders (the same operand list for every body of a
call), which of them are loop-carried, and how to pass one more operand in: what the reader
needs to read the bodies as scopes of the same graph (their nodes named by scope path,
``cond/true_graph_0/linear``) and what the writer needs to put casts inside them.

    cond(pred, true_fn, false_fn, operands)            outputs: each branch's, one type
    while_loop(cond_fn, body_fn, carried, additional)  carried: one type at entry, in the
                                                       body and at exit; additional: invariant
    map_impl(body_fn, xs, args)                        xs sliced on the first dimension

Any other higher-order op (``scan``, ``invoke_subgraph``, ...) is left as it is: the reader
keeps it float32 with its bodies untouched, under rule ``control_flow``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from graphamp.errors import InternalError

COND = torch.ops.higher_order.cond
WHILE_LOOP = torch.ops.higher_order.while_loop
MAP = torch.ops.higher_order.map_impl
CONVERTED = (COND, WHILE_LOOP, MAP)


@dataclass
class HopCall:
    """One call of a higher-order op the reader enters.

    ``bodies`` are (attribute name, GraphModule) in argument order; ``operands`` are the values
    bound to every body's placeholders, in order (the first ``carried`` of a while_loop are
    loop-carried; the first ``fixed`` are never dropped: a loop's carried values, a map's
    sliced inputs); ``results`` names the bodies whose outputs are the call's outputs (both
    branches of a cond; a loop's body).
    """

    node: fx.Node
    bodies: list[tuple[str, fx.GraphModule]]
    operands: list[fx.node.Argument]
    carried: int
    results: list[str]
    fixed: int = 0

    @property
    def op(self) -> str:
        return str(self.node.target)  # "cond", "while_loop", "map_impl"


def operand_list(node: fx.Node, index: int) -> list[fx.node.Argument]:
    """Argument ``index`` of a higher-order call, a tuple or list of operands, as a new list."""
    value = node.args[index]
    if not isinstance(value, tuple | list):
        raise InternalError(f"{node.name}: argument {index} is {value!r}, not operands")
    return list(value)


def is_higher_order(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)


def call_of(module: fx.GraphModule, node: fx.Node) -> HopCall | None:
    """The call ``node`` makes, or None when it is not a higher-order op the reader enters."""
    if node.op != "call_function" or node.target not in CONVERTED:
        return None
    args = node.args

    def body(arg: object) -> tuple[str, fx.GraphModule]:
        assert isinstance(arg, fx.Node) and arg.op == "get_attr"
        submodule = module.get_submodule(str(arg.target))
        assert isinstance(submodule, fx.GraphModule)
        return str(arg.target), submodule

    if node.target is COND:
        true_fn, false_fn = body(args[1]), body(args[2])
        operands = operand_list(node, 3)
        return HopCall(node, [true_fn, false_fn], operands, 0, [true_fn[0], false_fn[0]])
    if node.target is WHILE_LOOP:
        cond_fn, body_fn = body(args[0]), body(args[1])
        carried, additional = operand_list(node, 2), operand_list(node, 3)
        operands = carried + additional
        return HopCall(node, [cond_fn, body_fn], operands, len(carried), [body_fn[0]], len(carried))
    body_fn = body(args[0])
    xs, rest = operand_list(node, 1), operand_list(node, 2)
    return HopCall(node, [body_fn], xs + rest, 0, [body_fn[0]], len(xs))


def placeholders(module: fx.GraphModule) -> list[fx.Node]:
    return [n for n in module.graph.nodes if n.op == "placeholder"]


def returned(module: fx.GraphModule) -> list[object]:
    """What a body returns, flattened (a single value or a tuple of them)."""
    output = next(n for n in module.graph.nodes if n.op == "output")
    value = output.args[0]
    return list(value) if isinstance(value, tuple | list) else [value]


def set_returned(module: fx.GraphModule, index: int, value: fx.Node) -> None:
    """Make the body return ``value`` as its ``index``-th output."""
    output = next(n for n in module.graph.nodes if n.op == "output")
    results = output.args[0]
    if isinstance(results, tuple | list):
        results = list(results)
        results[index] = value
        output.args = (type(output.args[0])(results),)
    else:
        output.args = (value,)


def set_entering(node: fx.Node, index: int, value: fx.Node) -> None:
    """Make a while_loop call start with ``value`` as its ``index``-th carried value, or a map
    slice ``value`` as its ``index``-th input."""
    position = 1 if node.target is MAP else 2
    values = operand_list(node, position)
    values[index] = value
    container = tuple if isinstance(node.args[position], tuple) else list
    node.args = (*node.args[:position], container(values), *node.args[position + 1 :])


def add_operand(call: HopCall, value: fx.Node) -> dict[str, fx.Node]:
    """Pass ``value`` into every body of ``call`` as a new last operand (a cond's operand, a
    loop's loop-invariant input, a map's extra argument); returns each body's new placeholder,
    by attribute name."""
    node = call.node
    index = 2 if node.target is MAP else 3
    extended = [*operand_list(node, index), value]
    container = tuple if isinstance(node.args[index], tuple) else list
    node.args = (*node.args[:index], container(extended), *node.args[index + 1 :])
    call.operands.append(value)
    new = {}
    for name, module in call.bodies:
        graph = module.graph
        last = placeholders(module)[-1] if placeholders(module) else None
        context = graph.inserting_after(last) if last else graph.inserting_before(None)
        with context:
            placeholder = graph.placeholder(f"{value.name}_in")
        placeholder.meta = {k: v for k, v in value.meta.items() if k == "val"}
        new[name] = placeholder
    return new


def drop_unread_operands(call: HopCall) -> None:
    """Drop the operands no body reads any more (their readers now read a cast passed in)."""
    node, index = call.node, 2 if call.node.target is MAP else 3
    lists = [placeholders(module) for _, module in call.bodies]
    unread = [
        position
        for position in range(call.fixed, len(call.operands))
        if all(not found[position].users for found in lists)
    ]
    if not unread:
        return
    for (_, module), found in zip(call.bodies, lists, strict=True):
        for position in unread:
            module.graph.erase_node(found[position])
    # the droppable operands are the last argument list (a cond's operands, a loop's
    # additional inputs, a map's extra arguments)
    last = operand_list(node, index)
    offset = len(call.operands) - len(last)
    kept = [v for i, v in enumerate(last) if i + offset not in unread]
    container = tuple if isinstance(node.args[index], tuple) else list
    node.args = (*node.args[:index], container(kept), *node.args[index + 1 :])
    call.operands = [v for i, v in enumerate(call.operands) if i not in unread]
