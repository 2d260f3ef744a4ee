"""graphamp.fx.training.promotion: a cast to float32 read by one elementwise op with a float32
operand is folded into the op (its type promotion widens the value), with the same values;
a compiled step gets the cast back. (The pass runs on CUDA steps; here it is called itself.)"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx.training import promotion

aten = torch.ops.aten


def masked_scores(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A causal attention's float16 scores widened, a float32 mask added, the softmax."""
    return torch.softmax(scores.float() + mask, dim=-1)


def examples(dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    scores = (torch.randn(2, 4, 8, 8) * 30).to(dtype)
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None]
    return scores, mask


def casts(module: torch.fx.GraphModule) -> int:
    return sum(n.target is aten._to_copy.default for n in module.graph.nodes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_widening_cast_is_left_to_the_add_with_the_same_bits(dtype):
    scores, mask = examples(dtype)
    module = make_fx(masked_scores)(scores, mask)
    want = module(scores, mask)
    assert casts(module) == 1 and promotion.promoted(module) == 1 and casts(module) == 0
    (add,) = [n for n in module.graph.nodes if n.target is aten.add.Tensor]
    assert add.args[0].meta["val"].dtype == dtype
    have = module(scores, mask)
    assert have.dtype == torch.float32 and torch.equal(have, want)
    assert promotion.widened(module) == 1 and casts(module) == 1  # for torch.compile
    assert torch.equal(module(scores, mask), want)


@pytest.mark.parametrize(
    "step",
    [
        lambda s, m: torch.softmax(s.float() + m[0, 0, 0, 0], dim=-1),  # a 0-d float32
        lambda s, m: (lambda w: torch.softmax(w + m, dim=-1) + w.sum())(s.float()),  # read twice
        lambda s, m: torch.softmax(s.float() + m.double(), dim=-1),  # the other is float64
    ],
    ids=["zero-dim-other", "cast-read-twice", "wider-other"],
)
def test_a_cast_the_op_would_not_promote_alone_or_that_others_read_stays(step):
    scores, mask = examples()
    module = make_fx(step)(scores, mask)
    want = module(scores, mask)
    assert promotion.promoted(module) == 0
    assert torch.equal(module(scores, mask), want)


def test_a_decoder_step_with_the_casts_left_to_promotion_trains_bit_for_bit(monkeypatch):
    """A LLaMA-shaped decoder with transformers' eager attention (a float32 causal mask added
    to float16 scores, rotary embeddings of float32, a float32 residual stream), its eager
    step with the pass (switched on here as on a GPU, the fused softmax aside: a CPU has no
    such kernel) and without: the same losses and weights. (The CPU-only passes that change
    the casts, the blocked loss head and the weights' casts computed again, are left out of
    both: the count compares the promotion alone.)"""
    from graphamp.fx import train_step
    from graphamp.fx.training import eager, loss_head, softmax_casts
    from tests.hf_models import VOCAB, hf_model

    def loss_fn(out, labels):  # type: ignore[no-untyped-def]
        logits = out.logits.float().flatten(0, 1)
        return torch.nn.functional.cross_entropy(logits, labels.flatten())

    def trained(cuda_passes: bool) -> tuple[list[float], torch.nn.Module, int]:
        model = hf_model("llama", lm_head=True).train()
        model.config._attn_implementation = "eager"
        optimizer = torch.optim.AdamW(model.parameters())
        step = train_step(model, loss_fn, optimizer, dtype="float16", recompute_casts=False)
        with monkeypatch.context() as patch:
            patch.setattr(eager, "on_cuda", lambda module: cuda_passes)
            patch.setattr(softmax_casts, "fused", lambda module: 0)
            patch.setattr(loss_head, "chunked", lambda module: 0)
            generator = torch.Generator().manual_seed(0)
            batches = [torch.randint(0, VOCAB, (2, 16), generator=generator) for _ in range(3)]
            losses = [float(step(ids, ids)) for ids in batches]
        graph = step.captured["update"].module.graph
        return losses, model, sum(n.target is aten._to_copy.default for n in graph.nodes)

    losses, model, cast_count = trained(cuda_passes=True)
    plain_losses, plain, plain_casts = trained(cuda_passes=False)
    # per layer the widened scores (the mask's add), the rotary products and the residual
    # adds' widened outputs: each read by one op with a float32 operand, as under autocast
    assert cast_count == plain_casts - 14
    assert losses == plain_losses
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)
