"""graphamp.fx.training.loss_head: a cross-entropy head computed a block of rows at a time
gives the traced ops' loss and gradient bit for bit, and is fused only where it has their form."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx.training import loss_head

aten = torch.ops.aten


def traced_head(logits, labels, seed, reduction, ignore_index):  # type: ignore[no-untyped-def]
    """The four traced ops over the whole matrix (a bfloat16 step's casts around them)."""
    wide = logits.to(torch.float32).reshape(-1, logits.shape[-1])
    log_probs = aten._log_softmax(wide, 1, False)
    loss, total = aten.nll_loss_forward(
        log_probs, labels.reshape(-1), None, reduction, ignore_index
    )
    nll = aten.nll_loss_backward(
        seed, log_probs, labels.reshape(-1), None, reduction, ignore_index, total
    )
    gradient = aten._log_softmax_backward_data(nll, log_probs, 1, torch.float32)
    return loss, total, gradient.reshape(logits.shape).to(logits.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("reduction", "seed"), [(1, 1.0), (1, 65536.0), (2, 0.125)])
@pytest.mark.parametrize("ignore_index", [-1, 0])  # 0: BERT's and T5's padding id
def test_the_blocks_give_the_traced_values_bit_for_bit(
    monkeypatch, dtype, reduction, seed, ignore_index
):
    # blocks of 3 rows over 61: a last block shorter than the rest
    monkeypatch.setattr(loss_head, "_BLOCK_ELEMENTS", 3 * 997)
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(61, 997, generator=generator) * 4).to(dtype).reshape(1, 61, 997)
    labels = torch.randint(0, 997, (1, 61), generator=generator)
    labels[0, ::5] = ignore_index  # ignored rows
    labels[0, 1::5] = 1 - ignore_index  # and rows of the classes next to it
    seed_tensor = torch.tensor(seed)
    want = traced_head(logits, labels, seed_tensor, reduction, ignore_index)
    have = loss_head.cross_entropy_chunked(
        logits, labels, seed_tensor, reduction, ignore_index, torch.float32
    )
    for a, b in zip(want, have, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), (a, b)
    assert torch.isfinite(have[2]).all() and have[2].abs().sum() > 0


def scaled_cross_entropy(logits, labels, scale):  # type: ignore[no-untyped-def]
    flat = logits.float().flatten(0, 1)
    return torch.nn.functional.cross_entropy(flat, labels.flatten()) * scale


def traced_step(loss, *examples: torch.Tensor) -> fx.GraphModule:  # type: ignore[no-untyped-def]
    """The loss's gradient and value traced to aten ops (the seed a ``ones_like`` of the
    scaled loss, times the scale: what a step's backward starts from)."""
    return make_fx(torch.func.grad_and_value(loss))(*examples)


def examples() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 501, generator=generator).bfloat16()
    labels = torch.randint(0, 501, (3, 7), generator=generator)
    labels[1, 2] = -100
    return logits, labels, torch.tensor(1024.0)


def test_a_traced_head_is_fused_and_written_back_with_the_same_values():
    module = traced_step(scaled_cross_entropy, *examples())
    want = module(*examples())
    assert loss_head.chunked(module) == 1
    targets = [n.target for n in module.graph.nodes]
    assert loss_head.cross_entropy_chunked in targets
    for traced in (
        aten._log_softmax.default,
        aten.nll_loss_backward.default,
        aten.ones_like.default,
    ):
        assert traced not in targets
    have = module(*examples())
    for a, b in zip(want, have, strict=True):
        assert torch.equal(a, b)
    assert loss_head.unfused(module) == 1
    targets = [n.target for n in module.graph.nodes]
    assert loss_head.cross_entropy_chunked not in targets
    assert aten._log_softmax.default in targets and aten.nll_loss_backward.default in targets
    for a, b in zip(want, module(*examples()), strict=True):
        assert torch.equal(a, b)


def test_a_seed_that_is_the_losss_ones_like_is_made_before_it():
    """``loss.backward()``'s seed, ``ones_like(loss)`` itself (no scale): fused too."""

    def unscaled(logits, labels):  # type: ignore[no-untyped-def]
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    logits, labels, _ = examples()
    module = traced_step(unscaled, logits, labels)
    want = module(logits, labels)
    assert loss_head.chunked(module) == 1
    assert aten.ones_like.default not in [n.target for n in module.graph.nodes]
    for a, b in zip(want, module(logits, labels), strict=True):
        assert torch.equal(a, b)


def test_heads_of_another_form_are_left_as_traced():
    def weighted(logits, labels, scale):  # type: ignore[no-untyped-def]
        weight = torch.linspace(0.5, 1.5, logits.shape[-1])
        flat = logits.float().flatten(0, 1)
        return torch.nn.functional.cross_entropy(flat, labels.flatten(), weight=weight) * scale

    def per_row(logits, labels, scale):  # type: ignore[no-untyped-def]
        flat = logits.float().flatten(0, 1)
        rows = torch.nn.functional.cross_entropy(flat, labels.flatten(), reduction="none")
        return (rows * scale).sum()

    def log_probs_read_again(logits, labels, scale):  # type: ignore[no-untyped-def]
        log_probs = torch.log_softmax(logits.float().flatten(0, 1), dim=-1)
        nll = torch.nn.functional.nll_loss(log_probs, labels.flatten())
        return (nll + log_probs.exp().mean()) * scale

    def seed_reads_the_loss(logits, labels, scale):  # type: ignore[no-untyped-def]
        return scaled_cross_entropy(logits, labels, scale) ** 2  # the seed reads the loss's value

    for loss in (weighted, per_row, log_probs_read_again, seed_reads_the_loss):
        module = traced_step(loss, *examples())
        before = module.code
        assert loss_head.chunked(module) == 0, loss.__name__
        assert module.code == before, loss.__name__


def test_a_gradient_rounded_again_after_the_head_keeps_its_rounding():
    """Logits widened to float32 and read by a second op (a hit count): the head's input is
    the float32 value, whose gradient the backward rounds to bfloat16 and widens again. The
    fused call stands in for the first node of the logits' shape and type, so the rounding
    after it stays (it stood in for the last and skipped it)."""

    def with_hits(x, y, scale):  # type: ignore[no-untyped-def]
        wide = x.bfloat16().float()
        hits = (wide.argmax(-1) == y).sum()
        return (torch.nn.functional.cross_entropy(wide, y) + 0 * hits) * scale

    generator = torch.Generator().manual_seed(0)
    arguments = (
        torch.randn(16, 30, generator=generator),
        torch.randint(0, 30, (16,), generator=generator),
        torch.tensor(1.0),
    )
    module = traced_step(with_hits, *arguments)
    want = module(*arguments)
    assert loss_head.chunked(module) == 1
    for a, b in zip(want, module(*arguments), strict=True):
        assert torch.equal(a, b)
