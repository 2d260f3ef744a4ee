"""A float16 softmax computed in float32 as CUDA's one kernel does it, in an eager step on a GPU.

CUDA autocast runs ``softmax`` in float32 (its fp32_set_opt_dtype list), and PyTorch computes a
float16 input's float32 softmax in one kernel (``_softmax(x, dim, half_to_float=True)``),
whose backward writes the float16 gradient directly (``_softmax_backward_data(...,
input_dtype=float16)``). A traced step, under the same lists, casts the input to float32 and
the gradient back: two more passes over the attention's largest tensors (on BERT-base at
sequence 512, batch 32: about 4 ms of an H200's step, ``tools/bench/traffic_steps.py``).
:func:`fused` calls the fused kernels instead; the values are the same (each computes in
float32 and rounds once, where the cast rounded). CUDA has these kernels for float16 only,
and a CPU has none, so the pass runs on CUDA steps alone
(:func:`graphamp.fx.training.eager.on_cuda`).
"""

from __future__ import annotations

import torch
from torch import fx

from graphamp.fx.dialect.ops import plain_cast
from graphamp.fx.training.in_place import recompiled

aten = torch.ops.aten


def fused(module: fx.GraphModule) -> int:
    """Each ``_softmax(_to_copy(x, float32))`` of a float16 ``x`` as ``_softmax(x,
    half_to_float=True)``, and each ``_to_copy(_softmax_backward_data(..., float32), float16)``
    as the backward with ``input_dtype=float16``, where the cast has no other reader; how many
    nodes changed. Call it on a graph that runs on CUDA only (see the module docstring)."""
    graph, made = module.graph, 0
    for node in list(graph.nodes):
        if node.target is aten._softmax.default and node.args[2] is False:
            widened = node.args[0]
            if (
                plain_cast(widened, torch.float32, only_reader=node)
                and _dtype(widened.args[0]) == torch.float16
            ):
                node.args = (widened.args[0], node.args[1], True)
                graph.erase_node(widened)
                made += 1
        elif plain_cast(node, torch.float16):
            backward = node.args[0]
            if (
                isinstance(backward, fx.Node)
                and backward.target is aten._softmax_backward_data.default
                and backward.args[3] == torch.float32
                and list(backward.users) == [node]
                and _dtype(backward.args[0]) == torch.float32
            ):
                backward.args = (*backward.args[:3], torch.float16)
                backward.meta["val"] = node.meta.get("val")
                node.replace_all_uses_with(backward)
                graph.erase_node(node)
                made += 1
    return recompiled(module, made)


def unfused(module: fx.GraphModule) -> int:
    """:func:`fused` undone: the casts written out again, for ``torch.compile`` (which fuses
    them into its own kernels); how many nodes changed."""
    graph, made = module.graph, 0
    for node in list(graph.nodes):
        if node.target is aten._softmax.default and node.args[2] is True:
            source = node.args[0]
            with graph.inserting_before(node):
                widened = graph.call_function(
                    aten._to_copy.default, (source,), {"dtype": torch.float32}
                )
            widened.meta["val"] = node.meta.get("val")
            node.args = (widened, node.args[1], False)
            made += 1
        elif (
            node.target is aten._softmax_backward_data.default
            and node.args[3] == torch.float16
            and _dtype(node.args[0]) == torch.float32
        ):
            narrow = node.meta.get("val")
            with graph.inserting_after(node):
                cast = graph.call_function(aten._to_copy.default, (node,), {"dtype": torch.float16})
            for user in list(node.users):
                if user is not cast:
                    user.replace_input_with(node, cast)
            node.args = (*node.args[:3], torch.float32)
            cast.meta["val"] = narrow
            if isinstance(narrow, torch.Tensor):
                node.meta["val"] = narrow.to(torch.float32)
            made += 1
    return recompiled(module, made)


def _dtype(node: object) -> torch.dtype | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None
