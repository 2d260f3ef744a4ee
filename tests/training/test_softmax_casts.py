"""graphamp.fx.training.softmax_casts: a float16 softmax computed in float32 calls CUDA's fused
kernels in an eager step on a GPU, and a compiled step gets the casts back. (The fused kernels
exist on CUDA only: here the rewrite is checked node by node, and its inverse by value.)"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx.training import eager, softmax_casts

aten = torch.ops.aten


def attention_step(scores: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A float16 score's softmax in float32 (as autocast's lists put it) read by a float16
    product, and the gradient to the scores."""

    def loss(s: torch.Tensor) -> torch.Tensor:
        probabilities = torch.softmax(s.float(), dim=-1).half()
        return (probabilities * other).float().sum()

    return torch.func.grad(loss)(scores), loss(scores)


def traced(*examples: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(torch.func.functionalize(attention_step, remove="mutations"))(*examples)


def examples() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 16).half(), torch.randn(4, 16).half()


def calls(module: torch.fx.GraphModule, op) -> list[torch.fx.Node]:  # type: ignore[no-untyped-def]
    return [n for n in module.graph.nodes if n.target is op]


def test_the_casts_around_a_float16_softmax_become_the_fused_kernels_arguments():
    module = traced(*examples())
    casts = len(calls(module, aten._to_copy.default))
    assert softmax_casts.fused(module) == 3  # two forward softmaxes (value, grad's), a backward
    softmaxes = calls(module, aten._softmax.default)
    assert softmaxes and all(n.args[2] is True for n in softmaxes)
    assert all(n.args[0].meta["val"].dtype == torch.float16 for n in softmaxes)
    (backward,) = calls(module, aten._softmax_backward_data.default)
    assert backward.args[3] == torch.float16 and backward.meta["val"].dtype == torch.float16
    assert len(calls(module, aten._to_copy.default)) == casts - 3


def test_the_rewrite_undone_for_compile_computes_the_traced_values():
    scores, other = examples()
    module = traced(scores, other)
    want = module(scores, other)
    softmax_casts.fused(module)
    assert softmax_casts.unfused(module) == 3
    assert not [n for n in calls(module, aten._softmax.default) if n.args[2]]
    have = module(scores, other)
    for a, b in zip(want, have, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_cast_with_another_reader_or_a_bfloat16_softmax_is_left_and_a_cpu_step_is_not_cuda():
    scores, other = examples()
    bf16 = traced(scores.bfloat16(), other.bfloat16())  # CUDA fuses float16 only
    assert softmax_casts.fused(bf16) == 0

    def shared(s: torch.Tensor) -> torch.Tensor:
        wide = s.float()
        return torch.softmax(wide, dim=-1) + wide  # the float32 copy is read twice

    module = make_fx(shared)(scores)
    assert softmax_casts.fused(module) == 0
    assert not eager.on_cuda(module)
