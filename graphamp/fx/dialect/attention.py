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

A model's own attention (transformers' "eager" implementation: matrix product, mask added,
softmax) traced adds such a float mask of zeros to every layer's scores, a pass over the
largest tensor of the layer that the eager model does not make (on BERT-base at sequence 512,
batch 32: 10 GB a step, 12 adds of 0.0). Where every reader of the sum is a softmax, the add
is dropped too: ``x + 0.0`` is ``x`` but for ``-0.0``, which becomes ``+0.0``, and a softmax
computes the same from either (``exp(-0.0) = exp(0.0)``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import is_fake

from graphamp.fx.dialect.ops import attribute_of, op_name, written_arguments

log = logging.getLogger("graphamp")

_ATTENTION = torch.ops.aten.scaled_dot_product_attention.default
_MASK_INDEX = 3  # attn_mask's position in scaled_dot_product_attention's schema
_WHERES = frozenset(
    {
        torch.ops.aten.where.self,
        torch.ops.aten.where.ScalarOther,
        torch.ops.aten.where.ScalarSelf,
        torch.ops.aten.where.Scalar,
    }
)
_ADDS = frozenset({torch.ops.aten.add.Tensor})
_LIFT_FRESH_COPY = torch.ops.aten.lift_fresh_copy.default
_SOFTMAXES = frozenset({torch.ops.aten.softmax.int, torch.ops.aten._softmax.default})
# Ops that only lay out, repeat or select their first operand's values: the mask masks
# nothing after them if it masked nothing before.
_LAYOUT_OPS = frozenset(
    {
        "alias",
        "clone",
        "contiguous",
        "detach",
        "detach_",
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
    constant that masks nothing, and drop each such mask's add to scores only softmaxes read
    (see the module docstring); the attention and add nodes changed."""
    changed = []
    verdicts: dict[fx.Node, bool] = {}  # one mask is often read by every layer's attention
    for node in list(module.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _ATTENTION:
            mask = _mask_of(node)
        elif node.target in _ADDS:
            mask = _added_mask(node)
        else:
            continue
        if not isinstance(mask, fx.Node):
            continue
        if mask not in verdicts:
            verdicts[mask] = _masks_nothing(mask)
        if not verdicts[mask]:
            continue
        changed.append(node.name)
        if node.target is _ATTENTION:
            _set_mask(node, None)
        else:
            scores = node.args[1] if node.args[0] is mask else node.args[0]
            node.replace_all_uses_with(scores)
            module.graph.erase_node(node)
        _erase_unread(mask)
    if changed:
        module.graph.lint()
        module.recompile()
        log.debug("attention masks that mask nothing dropped at %s", ", ".join(changed))
    return changed


def _added_mask(add: fx.Node) -> fx.Node | None:
    """The mask operand of ``add``, a sum of scores and a float mask that only softmaxes read,
    where the sum is the scores' shape and type (the mask broadcasts into them); else None."""
    if add.kwargs or len(add.args) != 2 or not add.users:
        return None
    if not all(reader.target in _SOFTMAXES for reader in add.users):
        return None
    total = add.meta.get("val")
    if not isinstance(total, torch.Tensor):
        return None
    for scores, mask in (add.args, add.args[::-1]):
        if not isinstance(scores, fx.Node) or not isinstance(mask, fx.Node):
            continue
        value, masked = scores.meta.get("val"), mask.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(masked, torch.Tensor):
            continue
        if value.shape == total.shape and value.dtype == total.dtype and masked.is_floating_point():
            return mask
    return None


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
    if source.op == "call_function" and source.target in _WHERES:
        # transformers' float mask: where(keep, 0.0, min) with keep expanded to the batch (a
        # symbolic size, so not evaluated as a whole): zero where keep is all true
        keep, kept = source.args[:2]
        if isinstance(kept, fx.Node):
            zero = _is_float(kept) and _masks_nothing(kept)
        else:
            zero = isinstance(kept, (int, float)) and kept == 0 and _is_float(source)
        return zero and isinstance(keep, fx.Node) and _masks_nothing(keep)
    value = _constant(source)
    if value is None:
        return False
    if value.dtype == torch.bool:
        return bool(value.all())
    return value.is_floating_point() and bool((value == 0).all())


def _is_float(node: fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.is_floating_point()


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
        literal = _literal(each)
        if literal is not None:
            values[each] = literal
            continue
        op = each.target
        assert isinstance(op, torch._ops.OpOverload)  # (_ancestors checked it)
        args = fx.node.map_aggregate(each.args, lambda a: _value(a, values))
        kwargs = dict(fx.node.map_aggregate(each.kwargs, lambda a: _value(a, values)))
        if "device" in kwargs:  # evaluated where it costs nothing to (a trace's may be fake)
            kwargs["device"] = "cpu"
        try:
            values[each] = op(*args, **kwargs)
        except Exception as error:  # an op this evaluation cannot run (a device's own)
            log.debug("mask check: %s not evaluated (%s): kept", each.name, error)
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
        if _literal(each) is not None:
            seen.add(each)
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


def _literal(node: fx.Node) -> torch.Tensor | None:
    """The value of ``node`` where it is a tensor literal of the traced code: a
    ``torch.tensor(0.0)`` is kept as an attribute (``lifted_tensor_0``, ``_tensor_constant0``)
    that only ``lift_fresh_copy`` reads, a copy each call, so its value is the one traced (a
    parameter or buffer is read directly); else None. transformers 5.17 writes its float mask's
    zero so: ``where(keep, torch.tensor(0.0), min)``."""
    owner = node.graph.owning_module
    if node.op != "get_attr" or not node.users or owner is None:
        return None
    if any(reader.target is not _LIFT_FRESH_COPY for reader in node.users):
        return None
    try:  # a submodule's literal: "bert.lifted_tensor_0"
        value = attribute_of(owner, node)
    except AttributeError:
        return None
    if isinstance(value, torch.Tensor) and is_fake(value):
        value = getattr(value, "constant", None)  # a fake literal keeps its real value there
    if not isinstance(value, torch.Tensor) or is_fake(value):
        return None
    # evaluated on the CPU, as the check evaluates everything (the literal may be on a GPU)
    return value.detach().cpu()


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
    """Whether ``node`` writes values in place; ``detach_`` changes what autograd records of
    its argument, not the values (a traced ``torch.tensor(0.0)`` is detached so)."""
    if node.target is torch.ops.aten.detach_.default:
        return False
    return isinstance(node.target, torch._ops.OpOverload) and bool(written_arguments(node))


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
        if each.op not in ("call_function", "get_attr") or each.users:
            continue
        inputs = each.all_input_nodes
        each.graph.erase_node(each)
        stack.extend(inputs)
