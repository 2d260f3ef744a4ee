"""Dropout masks an eager step holds as booleans, not as scaled copies in the value's type.

Traced on a CPU, ``nn.functional.dropout`` is its composite form: a mask drawn by
``bernoulli.p`` in the type of the value it drops from (float32 for attention probabilities),
divided by the keep probability, and multiplied into the value; its backward multiplies the
gradient by the same scaled mask. The step's forward holds every such mask until the backward
reads it: on BERT-base at batch 32 (sequence 128), 37 masks, 444 MiB of the step's peak
(BENCHMARKS.md, History, issue 42). PyTorch's own fused dropout keeps a boolean mask (one byte
an element) and multiplies by the scale after (traced on a GPU, dropout is that op already).

:func:`as_bool` rewrites each such mask into that form with the same values: the mask drawn
by ``bernoulli.p`` into a boolean tensor (torch's CPU kernel draws the same numbers for any
type of the same shape and layout, and leaves the generator where it leaves it), and each
``mul(x, mask / p)`` as ``mul(mul(x, mask), s)``, ``s`` the scaled mask's one non-zero value
as the division computed it in the mask's type: ``x * 1 = x`` and ``x * 0 = x * 0.0`` are
exact, so each product rounds once, at the same place, as before (signed zeros, inf * 0 = NaN
included). A compiled step keeps this form: inductor draws each boolean mask itself
(``partition.random_masks``) and holds it, not a scaled copy, for the backward.

Traced on a GPU, dropout is ``native_dropout`` already, but its traced backward is autograd's
differentiable formula, ``grad * (mask.type_as(grad) * scale)``: three elementwise passes over
the value (the mask widened, scaled, multiplied), where eager autocast's backward runs one
``native_dropout_backward`` kernel. On BERT-base's attention probabilities (batch 32, sequence
512) that is 29 bytes an element against 9, about 24 GB a step (``tools/bench/
traffic_steps.py``). :func:`fused_backward` calls that kernel instead, with the same values.
"""

from __future__ import annotations

import torch
from torch import fx

from graphamp.fx.dialect.ops import cast_type
from graphamp.fx.training.in_place import recompiled

aten = torch.ops.aten


def as_bool(module: fx.GraphModule) -> int:
    """Each dropout mask of ``module`` drawn as booleans (see the module docstring); how
    many. A mask is rewritten when ``bernoulli.p`` draws it contiguous on a CPU (the device
    whose kernel was checked to draw the same numbers for a boolean tensor), one ``div`` by a
    number reads it, and every reader of that quotient multiplies it with a tensor of its own
    type (so the product's type is the value's either way)."""
    graph, made = module.graph, 0
    for draw in list(graph.nodes):
        scaled = _scaled_mask(draw)
        if scaled is None:
            continue
        divisor = scaled.args[1]
        assert isinstance(divisor, (int, float))  # (_scaled_mask checked it)
        scale = torch.div(torch.ones((), dtype=draw.meta["val"].dtype), divisor).item()
        with graph.inserting_before(draw):
            empty = graph.call_function(
                aten.empty_like.default,
                (draw.args[0],),
                {"dtype": torch.bool, "memory_format": torch.contiguous_format},
            )
            mask = graph.call_function(aten.bernoulli.p, (empty, *draw.args[1:]), draw.kwargs)
        empty.meta["val"] = mask.meta["val"] = torch.empty_like(draw.meta["val"], dtype=torch.bool)
        for product in list(scaled.users):
            value = product.args[1] if product.args[0] is scaled else product.args[0]
            with graph.inserting_before(product):
                kept = graph.call_function(aten.mul.Tensor, (value, mask))
                scaled_product = graph.call_function(aten.mul.Tensor, (kept, scale))
            kept.meta["val"] = scaled_product.meta["val"] = product.meta["val"]
            product.replace_all_uses_with(scaled_product)
            graph.erase_node(product)
        graph.erase_node(scaled)
        graph.erase_node(draw)
        made += 1
    return recompiled(module, made)


def _scaled_mask(draw: fx.Node) -> fx.Node | None:
    """The ``div`` scaling the dropout mask ``draw`` draws, when :func:`as_bool` can rewrite
    it (see there); None otherwise."""
    if draw.target is not aten.bernoulli.p or draw.kwargs.get("generator") is not None:
        return None
    value = draw.meta.get("val")
    if not isinstance(value, torch.Tensor) or not value.is_contiguous():
        return None
    if value.device.type != "cpu":  # the same numbers for any type: checked on a CPU only
        return None
    if not isinstance(draw.args[0], fx.Node) or len(draw.users) != 1:
        return None
    (scaled,) = draw.users
    if scaled.target is not aten.div.Scalar or scaled.args[0] is not draw:
        return None
    if not isinstance(scaled.args[1], (int, float)) or scaled.kwargs:
        return None
    if not _multiplied_into(scaled, value.dtype):
        return None
    return scaled if scaled.users else None


def fused_backward(module: fx.GraphModule) -> int:
    """Each dropout backward of ``module`` traced as ``mul(grad, mul(_to_copy(mask), s))``
    (``mask`` boolean, widened to the gradient's type) as one ``native_dropout_backward(grad,
    mask, s')``, ``s'`` the scale as the widened mask's product rounds it (``1 * s`` in the
    gradient's type); how many products. The values are the same: ``grad * 1`` and
    ``grad * 0`` are exact, so both forms round ``grad * s'`` once (signed zeros, inf * 0 =
    NaN included)."""
    graph, made = module.graph, 0
    for scaled in list(graph.nodes):
        found = _widened_mask(scaled)
        if found is None:
            continue
        widened, mask, dtype = found
        scale = torch.mul(torch.ones((), dtype=dtype), scaled.args[1]).item()
        for product in list(scaled.users):
            grad = product.args[1] if product.args[0] is scaled else product.args[0]
            with graph.inserting_before(product):
                fused = graph.call_function(
                    aten.native_dropout_backward.default, (grad, mask, scale)
                )
            fused.meta["val"] = product.meta["val"]
            product.replace_all_uses_with(fused)
            graph.erase_node(product)
            made += 1
        graph.erase_node(scaled)
        if not widened.users:
            graph.erase_node(widened)
    return recompiled(module, made)


def _widened_mask(scaled: fx.Node) -> tuple[fx.Node, fx.Node, torch.dtype] | None:
    """For ``scaled = mul(_to_copy(mask, dtype=t), s)`` read only by products with gradients
    of ``mask``'s shape and type ``t`` (:func:`fused_backward` rewrites it): the cast, the
    boolean mask and ``t``; None otherwise."""
    if scaled.target is not aten.mul.Scalar or scaled.kwargs or not scaled.users:
        return None
    widened, scale = scaled.args
    if not isinstance(widened, fx.Node) or not isinstance(scale, (int, float)):
        return None
    dtype = cast_type(widened)  # the type changes, nothing else (layout, device, format)
    mask = widened.args[0]
    if dtype is None or not isinstance(mask, fx.Node):
        return None
    value = mask.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
        return None
    if not _multiplied_into(scaled, dtype, value.shape):
        return None
    return widened, mask, dtype


def _multiplied_into(scaled: fx.Node, dtype: torch.dtype, shape: torch.Size | None = None) -> bool:
    """Whether every reader of ``scaled`` is ``mul(x, scaled)`` (either order) with ``x`` and
    the product of type ``dtype`` (and, given ``shape``, of that shape: no broadcast)."""
    for product in scaled.users:
        if product.target is not aten.mul.Tensor or product.kwargs:
            return False
        first, second = product.args
        other = second if first is scaled else first
        if other is scaled or not isinstance(other, fx.Node):
            return False
        other_value, result = other.meta.get("val"), product.meta.get("val")
        if not isinstance(other_value, torch.Tensor) or not isinstance(result, torch.Tensor):
            return False
        if other_value.dtype != dtype or result.dtype != dtype:
            return False
        if shape is not None and (other_value.shape != shape or result.shape != shape):
            return False
    return True
