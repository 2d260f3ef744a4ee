"""Attention masks that mask nothing, dropped from a traced graph.

A Hugging Face model run eagerly looks at its attention mask's values: a mask with no padding
(every position attended) is passed to ``scaled_dot_product_attention`` as ``None``. Traced, it
cannot look (transformers' ``is_tracing``), so the graph builds the mask from the shapes it
knows (BERT's: ``arange(n) + 0 >= 0`` expanded to [batch, 1, n, n]) and passes it. A mask makes
the dispatcher pass over the kernels that take none: on a GPU, flash attention, which eager
autocast runs for the same model; on a CPU the masked kernel adds it to every score.

:func:`drop_all_true_masks` finds each attention mask computed from constants alone (no input,
parameter or buffer, no random op, no symbolic size, nothing written in place), evaluates it,
and where it masks nothing (a boolean mask all true, a float mask all zero: each score is kept,
or has 0.0 added) passes ``None`` instead and erases the nodes only the mask read. Attention
then computes what it computed with the mask, as the eager model does.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx

from graphamp.fx.dialect.ops import op_name

log = logging.getLogger("graphamp")

_ATTENTION = torch.ops.aten.scaled_dot_product_attention.default
_MASK_INDEX = 3  # attn_mask's position in scaled_dot_product_attention's schema
# Ops that only lay out, repeat or select their first operand's values: the mask masks
# nothing after them if it masked nothing before.
_LAYOUT_OPS = frozenset(
    {
        "alias",
        "clone",
        "contiguous",
        "detach",
        "expand",
        "permute",
        "reshape",
        "select",
        "slice",
        "squeeze",
        "transpose",
        "unsqueeze",
        "view",
    }
)
# The largest constant mask (or value it is made from) evaluated to check it, in elements: a
# sequence of 4096 squared.
_MAX_ELEMENTS = 1 << 24


def drop_all_true_masks(module: fx.GraphModule) -> list[str]:
    """Pass no mask to each ``scaled_dot_product_attention`` in ``module`` whose mask is a
    constant that masks nothing (see the module docstring); the attention nodes changed."""
    changed = []
    verdicts: dict[fx.Node, bool] = {}  # one mask is often read by every layer's attention
    for node in list(module.graph.nodes):
        if node.op != "call_function" or node.target is not _ATTENTION:
            continue
        mask = _mask_of(node)
        if not isinstance(mask, fx.Node):
            continue
        if mask not in verdicts:
            verdicts[mask] = _masks_nothing(mask)
        if verdicts[mask]:
            _set_mask(node, None)
            _erase_unread(mask)
            changed.append(node.name)
    if changed:
        module.graph.lint()
        module.recompile()
        log.debug("attention masks that mask nothing dropped at %s", ", ".join(changed))
    return changed


def _mask_of(node: fx.Node) -> object:
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"]
    return node.args[_MASK_INDEX] if len(node.args) > _MASK_INDEX else None


def _set_mask(node: fx.Node, mask: fx.Node | None) -> None:
    if "attn_mask" in node.kwargs:
        node.update_kwarg("attn_mask", mask)
    else:
        node.update_arg(_MASK_INDEX, mask)


def _masks_nothing(mask: fx.Node) -> bool:
    """Whether ``mask`` is computed from constants alone and is all true (boolean) or all
    zero (float)."""
    source, layout = mask, [mask]
    while (
        source.op == "call_function"
        and op_name(source) in _LAYOUT_OPS
        and isinstance(source.args[0], fx.Node)
    ):
        source = source.args[0]
        layout.append(source)
    if any(_written(node) for node in layout):
        return False
    value = _constant(source)
    if value is None:
        return False
    if value.dtype == torch.bool:
        return bool(value.all())
    return value.is_floating_point() and bool((value == 0).all())


def _constant(node: fx.Node) -> torch.Tensor | None:
    """``node``'s value where its graph computes it from constants alone by deterministic ops
    with sizes known now; None otherwise."""
    known = node.meta.get("val")
    if not isinstance(known, torch.Tensor) or not _static(known):
        return None
    if known.numel() > _MAX_ELEMENTS:
        return None
    order = _ancestors(node)
    if order is None:
        return None
    values: dict[fx.Node, Any] = {}
    for each in order:
        op = each.target
        assert isinstance(op, torch._ops.OpOverload)  # (_ancestors checked it)
        args = fx.node.map_aggregate(each.args, lambda a: _value(a, values))
        kwargs = dict(fx.node.map_aggregate(each.kwargs, lambda a: _value(a, values)))
        if "device" in kwargs:  # evaluated where it costs nothing to (a trace's may be fake)
            kwargs["device"] = "cpu"
        try:
            values[each] = op(*args, **kwargs)
        except Exception:  # an op this evaluation cannot run (a device's own): not proven
            return None
    value = values[node]
    return value if isinstance(value, torch.Tensor) else None


def _value(arg: Any, values: dict[fx.Node, Any]) -> Any:
    return values[arg] if isinstance(arg, fx.Node) else arg


def _ancestors(node: fx.Node) -> list[fx.Node] | None:
    """``node`` and the nodes it is computed from, in graph order; None where one of them
    reads an input, a parameter or buffer, draws random numbers, is written in place, or has
    a symbolic size or more elements than this check evaluates."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        each = stack.pop()
        if each in seen:
            continue
        if each.op != "call_function" or not isinstance(each.target, torch._ops.OpOverload):
            return None
        if torch.Tag.nondeterministic_seeded in each.target.tags or _written(each):
            return None
        known = each.meta.get("val")
        if isinstance(known, torch.Tensor) and (
            not _static(known) or known.numel() > _MAX_ELEMENTS
        ):
            return None
        if any(isinstance(a, torch.SymInt) for a in _flat_args(each)):
            return None
        seen.add(each)
        stack.extend(each.all_input_nodes)
    return [n for n in node.graph.nodes if n in seen]


def _written(node: fx.Node) -> bool:
    """Whether an op writes ``node``'s value in place, itself or through a view of it (the
    training IR keeps in-place ops: ``mask[0, 1:] = False`` is a ``fill_`` of a slice, after
    which the mask is not what its own node computes). A reader that is not an aten op counts
    as a writer: what it does is not known."""
    stack = [node]
    while stack:
        each = stack.pop()
        if _mutates(each):
            return True
        for reader in each.users:
            if reader.target is _ATTENTION:
                continue
            if reader.op != "call_function" or not isinstance(reader.target, torch._ops.OpOverload):
                return True
            if _mutates(reader):
                return True
            if any(r.alias_info is not None for r in reader.target._schema.returns):
                stack.append(reader)  # a view: a write into it writes the value
    return False


def _mutates(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _flat_args(node: fx.Node) -> list[object]:
    flat: list[object] = []
    fx.node.map_aggregate((node.args, node.kwargs), flat.append)
    return flat


def _static(value: torch.Tensor) -> bool:
    return all(isinstance(size, int) for size in value.shape)


def _erase_unread(node: fx.Node) -> None:
    """Erase ``node`` and, from it upwards, every node nothing reads any more."""
    stack = [node]
    while stack:
        each = stack.pop()
        if each.op != "call_function" or each.users:
            continue
        inputs = each.all_input_nodes
        each.graph.erase_node(each)
        stack.extend(inputs)
