"""A widening cast folded into the one elementwise op that reads it, in an eager step on a GPU.

A causal decoder's attention, as transformers' "eager" implementation writes it, adds a float32
mask to the scores; under CUDA autocast the scores are float16, and the add is one kernel that
reads float16, computes in float32 by type promotion and writes float32. Traced, the step
writes that promotion out: a cast of the scores to float32, then the add (in place on the
cast's buffer), two passes over the layer's largest tensor where eager code makes one (on a
LLaMA-shaped layer at sequence 2048, a [batch, heads, 2048, 2048] float16 read and float32
write more, every layer, every step). :func:`promoted` hands the op the narrow value, so that
PyTorch's type promotion widens it as the cast did: the values are the same (the float16 or
bfloat16 value widened exactly, then the op in float32). CUDA's elementwise kernels cast as
they load; the pass runs on CUDA steps only (:func:`graphamp.fx.training.eager.on_cuda`), as
the CPU's mixed-type loops were not timed against a cast and a same-type op;
:func:`widened` writes the casts back for ``torch.compile``.
"""

from __future__ import annotations

import torch
from torch import fx

from graphamp.fx.dialect.ops import plain_cast, tensor_value
from graphamp.fx.training.in_place import recompiled

aten = torch.ops.aten

# Elementwise ops of two tensors whose result type PyTorch promotes from both operands.
_BINARY = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor})
_NARROW = frozenset({torch.float16, torch.bfloat16})
_PROMOTED_META = "graphamp_promoted"  # on an op given the narrow value: the operand's index


def promoted(module: fx.GraphModule) -> int:
    """Each ``op(_to_copy(x, float32), y)`` (either order) of a float16 or bfloat16 ``x``,
    whose cast nothing else reads, and a float32 ``y`` of one dimension or more (a 0-d ``y``
    would not promote the result), as ``op(x, y)``; how many."""
    graph, made = module.graph, 0
    for node in list(graph.nodes):
        if node.target not in _BINARY or len(node.args) != 2:
            continue
        for index in (0, 1):
            cast, other = node.args[index], node.args[1 - index]
            if not _foldable(cast, other, node):
                continue
            assert isinstance(cast, fx.Node)  # (_foldable checked it)
            node.update_arg(index, cast.args[0])
            node.meta[_PROMOTED_META] = index
            graph.erase_node(cast)
            made += 1
            break
    return recompiled(module, made)


def widened(module: fx.GraphModule) -> int:
    """:func:`promoted` undone: each cast written out again, for ``torch.compile``; how many."""
    graph, made = module.graph, 0
    for node in list(graph.nodes):
        index = node.meta.pop(_PROMOTED_META, None)
        if index is None:
            continue
        narrow = node.args[index]
        assert isinstance(narrow, fx.Node)  # (promoted put a node there)
        with graph.inserting_before(node):
            cast = graph.call_function(aten._to_copy.default, (narrow,), {"dtype": torch.float32})
        value = narrow.meta.get("val")
        if isinstance(value, torch.Tensor):
            cast.meta["val"] = value.to(torch.float32)
        node.update_arg(index, cast)
        made += 1
    return recompiled(module, made)


def _foldable(cast: object, other: object, reader: fx.Node) -> bool:
    """Whether ``cast`` widens a float16 or bfloat16 value to float32 for ``reader`` alone,
    and ``reader`` computes in float32 without it (``other``: a float32 tensor of one
    dimension or more)."""
    # the op reads the value in the cast's layout (its result's layout follows its operands')
    if not plain_cast(cast, torch.float32, only_reader=reader) or not isinstance(other, fx.Node):
        return False
    assert isinstance(cast, fx.Node)  # (plain_cast checked it)
    source, wide, result = (tensor_value(n) for n in (cast.args[0], other, reader))
    if source is None or wide is None or result is None:
        return False
    return (
        source.dtype in _NARROW
        and wide.dtype == torch.float32
        and wide.dim() > 0
        and result.dtype == torch.float32
        and source.device == wide.device
    )
