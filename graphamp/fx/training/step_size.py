"""Adam's last formula in an eager CPU step as the one ``addcdiv`` torch.optim calls.

torch.optim's Adam and AdamW end each parameter's update with
``param.addcdiv_(exp_avg, denom, value=-step_size)``, the step size a Python number. The
traced step reads the step size from a tensor (it changes every step), so
:func:`graphamp.fx.training.optim.update` writes that formula as the three operations its
kernel computes, ``param - (step_size * exp_avg) / denom``: one more tensor as large as the
parameter, and two more passes over it, per parameter and step. On a CPU reading a 0-d tensor
on the host costs nothing, so :func:`with_addcdiv` puts the kernel back: the step size is
negated and read once (``neg``, ``_local_scalar_dense``), and each such triple becomes
``addcdiv(param, exp_avg, denom, value=<that number>)``, which the in-place and foreach passes
then make ``_foreach_addcdiv_`` as torch.optim's own step.

The bits are the same: ``addcdiv``'s float32 kernel computes ``param + value * exp_avg /
denom`` in that order, with ``value`` rounded to float32, as the three operations round the
0-d step size to float32 in ``mul``; negating is exact. Only float32 tensors on a CPU are
rewritten (a bfloat16/float16 parameter's formula widens its operands first, and elsewhere
reading the step size would wait for the device). ``torch.compile`` gets the three operations
back (:func:`without_addcdiv`): inductor fuses them itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import torch
from torch import fx

from graphamp.fx.training.in_place import recompiled

_aten = torch.ops.aten
_TRACED_META = "graphamp_traced_step_size"  # on a rewritten node: the 0-d step size it read


def with_addcdiv(module: fx.GraphModule) -> int:
    """Each ``sub(param, div(mul(step_size, exp_avg), denom))`` of float32 CPU tensors, whose
    product and quotient nothing else reads, as one ``addcdiv`` (see the module docstring);
    how many."""
    graph = module.graph
    values: dict[fx.Node, fx.Node] = {}  # step size -> its negated number, read once
    made = 0
    for node in list(graph.nodes):
        matched = _adam_descent(node)
        if matched is None:
            continue
        param, step_size, exp_avg, denom, quotient, product = matched
        if step_size not in values:
            with graph.inserting_after(step_size):
                negated = graph.call_function(_aten.neg.default, (step_size,))
            negated.meta["val"] = step_size.meta["val"]
            with graph.inserting_after(negated):
                values[step_size] = graph.call_function(
                    _aten._local_scalar_dense.default, (negated,)
                )
        with graph.inserting_before(node):
            descent = graph.call_function(
                _aten.addcdiv.default, (param, exp_avg, denom), {"value": values[step_size]}
            )
        descent.meta.update(node.meta)
        descent.meta[_TRACED_META] = step_size
        node.replace_all_uses_with(descent)
        for erased in (node, quotient, product):
            graph.erase_node(erased)
        made += 1
    return recompiled(module, made)


def without_addcdiv(module: fx.GraphModule) -> int:
    """Undo :func:`with_addcdiv`: each such ``addcdiv`` the three traced operations again, in
    the order the trace wrote them (the products of one step size, then the quotients, then
    the differences where the ``addcdiv`` nodes are), the numbers read from the step sizes
    removed; how many."""
    graph = module.graph
    runs: dict[fx.Node, list[fx.Node]] = {}  # step size -> its addcdiv nodes, in order
    for node in graph.nodes:
        if _TRACED_META in node.meta:
            runs.setdefault(node.meta.pop(_TRACED_META), []).append(node)
    for size, run in runs.items():
        with graph.inserting_before(run[0]):
            products = [graph.call_function(_aten.mul.Tensor, (size, n.args[1])) for n in run]
            quotients = [
                graph.call_function(_aten.div.Tensor, (product, n.args[2]))
                for product, n in zip(products, run, strict=True)
            ]
        for node, product, quotient in zip(run, products, quotients, strict=True):
            product.meta["val"] = quotient.meta["val"] = node.meta.get("val")
            with graph.inserting_before(node):
                traced = graph.call_function(_aten.sub.Tensor, (node.args[0], quotient))
            traced.meta.update(node.meta)
            value = node.kwargs["value"]
            node.replace_all_uses_with(traced)
            graph.erase_node(node)
            if isinstance(value, fx.Node) and not value.users:
                negated = value.args[0]
                graph.erase_node(value)
                if isinstance(negated, fx.Node) and not negated.users:
                    graph.erase_node(negated)
    return recompiled(module, sum(len(run) for run in runs.values()))


def _adam_descent(
    node: fx.Node,
) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node, fx.Node, fx.Node] | None:
    """(param, step size, exp_avg, denom, quotient, product) when ``node`` is the last of
    Adam's three operations on float32 CPU tensors of one layout, else ``None``."""
    if node.target is not _aten.sub.Tensor or node.kwargs or len(node.args) != 2:
        return None
    param, quotient = node.args
    if not (isinstance(param, fx.Node) and _only_reader(quotient, node, _aten.div.Tensor)):
        return None
    product, denom = quotient.args
    if not (isinstance(denom, fx.Node) and _only_reader(product, quotient, _aten.mul.Tensor)):
        return None
    step_size, exp_avg = product.args
    if not (isinstance(step_size, fx.Node) and isinstance(exp_avg, fx.Node)):
        return None
    scalar = step_size.meta.get("val")
    if not (isinstance(scalar, torch.Tensor) and scalar.ndim == 0 and scalar.device.type == "cpu"):
        return None
    layouts = {_float32_cpu_layout(n) for n in (param, exp_avg, denom, product, quotient, node)}
    if len(layouts) != 1 or None in layouts:
        return None
    return param, step_size, exp_avg, denom, quotient, product


def _float32_cpu_layout(node: fx.Node) -> tuple | None:
    """The shape and strides of ``node``'s value when it is a float32 CPU tensor with a
    dimension, else ``None``. A symbolic size (a step traced with symbolic shapes: a
    while_loop's) is compared by its expression: a SymInt is not hashable."""
    value = node.meta.get("val")
    if not (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.float32
        and value.device.type == "cpu"
        and value.ndim > 0
    ):
        return None
    return _dims(value.shape), _dims(value.stride())


def _dims(sizes: Sequence[object]) -> tuple[object, ...]:
    """``sizes`` hashable: a number as it is, a symbolic size as its expression."""
    return tuple(size if isinstance(size, int) else str(size) for size in sizes)


def _only_reader(value: object, reader: fx.Node, target: object) -> TypeGuard[fx.Node]:
    """Whether ``value`` is a node calling ``target`` with two arguments, read by ``reader``
    alone."""
    return (
        isinstance(value, fx.Node)
        and value.target is target
        and not value.kwargs
        and len(value.args) == 2
        and set(value.users) == {reader}
    )
