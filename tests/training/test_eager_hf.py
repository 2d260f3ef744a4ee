"""The eager step graph's own passes (in-place writes, foreach calls, Python bindings, the
fused check, the guard on the host) change no value, on Hugging Face models nobody here
wrote: parameters bit for bit equal to the functional graph ``torch.compile`` is handed, run
eagerly, over float16 steps with dynamic loss scaling, dropout on."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from graphamp.fx import DynamicLossScaling, train_step
from graphamp.fx.training import bindings, eager, loss_head, masks, recompute
from graphamp.fx.training.foreach import each_in_place, updates_unless
from tests.hf_models import VOCAB, hf_model

pytestmark = pytest.mark.slow


def pooled_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output[0].float().mean(dim=1), target)


def optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "SGD":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-2)
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_alike(steps: list[Any], batch: tuple[torch.Tensor, ...], count: int) -> None:
    """``count`` steps of the eager step ``steps[0]`` and of ``steps[1]`` made functional
    after its first (the form ``torch.compile`` is handed, run eagerly), each pair from one
    seed (dropout draws alike): losses and parameters equal bit for bit."""
    for seed in range(count):
        losses = []
        for step in steps:
            torch.manual_seed(seed)
            losses.append(step(*batch))
        if seed == 0:
            eager.for_compile(steps[1].graph)
        assert torch.equal(*losses), seed
    ours, functional = steps
    for parameter, value in ours.params.items():
        assert torch.equal(value, functional.params[parameter]), parameter


@pytest.mark.parametrize(("name", "kind"), [("bert", "SGD"), ("gpt2", "AdamW")])
def test_the_eager_graph_trains_as_the_functional_graph(name, kind):
    model = hf_model(name).train()  # dropout on: the same seed before each step draws alike
    twin = copy.deepcopy(model)
    steps = [
        train_step(
            m, pooled_loss, optimizer(kind, m), dtype="float16", loss_scaling=DynamicLossScaling()
        )
        for m in (model, twin)
    ]
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 12), generator=generator)
    target = torch.randn(2, 64, generator=generator)
    train_alike(steps, (ids, target), 4)
    ours, functional = steps
    assert int(ours.skipped_steps) == int(functional.skipped_steps)
    # the eager graph did take the eager forms
    nodes = list(ours.graph.graph.nodes)  # type: ignore[union-attr]
    foreach_calls = [n for n in nodes if n.target in (each_in_place, updates_unless)]
    assert len(foreach_calls) >= 3, foreach_calls  # momentum / moments and the updates
    # most aten ops called through their Python bindings (how many other nodes there are,
    # getitems of foreach calls, depends on how the update is chunked: training/locality.py)
    aten = [n for n in nodes if isinstance(bindings.overload(n), torch._ops.OpOverload)]
    bound = [n for n in aten if bindings.overload(n) is not n.target]
    assert len(bound) > len(aten) / 2, (len(bound), len(aten))


@pytest.mark.parametrize("recompute_casts", [False, True, None])
def test_a_masked_language_model_step_holds_less_and_trains_the_same_bits(
    monkeypatch, recompute_casts
):
    """BERT with its masked-language-model head, bfloat16, AdamW, dropout on, the loss over
    the whole vocabulary: the eager graph holds its dropout masks as booleans, computes the
    dropout products again in the backward, and computes the cross-entropy head a block of
    rows at a time; parameters stay bit for bit those of the graph as traced (the twin is
    captured without the masks', the recomputation's and the head's passes; the form
    ``torch.compile`` is handed keeps the first two and writes the head's traced ops again).
    With ``recompute_casts`` (None: on a CPU) the weights' casts are computed again in the
    backward too, and in the form ``torch.compile`` gets only where asked for (True)."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).train()
    twin = copy.deepcopy(model)

    def mlm_loss(output: Any, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output[0].float().flatten(0, 1), labels.flatten())

    steps = [
        train_step(m, mlm_loss, optimizer("AdamW", m), dtype="bfloat16", recompute_casts=casts)
        for m, casts in ((model, recompute_casts), (twin, False))
    ]
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 12), generator=generator)
    labels = torch.randint(1, VOCAB, (2, 12), generator=generator)
    torch.manual_seed(7)
    first = steps[0](ids, labels)
    with monkeypatch.context() as passes:
        passes.setattr(masks, "as_bool", lambda module: 0)
        passes.setattr(recompute, "saved_less", lambda module, **options: 0)
        passes.setattr(loss_head, "chunked", lambda module: 0)
        torch.manual_seed(7)
        assert torch.equal(steps[1](ids, labels), first)  # the twin captured as traced
    twin_nodes = list(steps[1].graph.graph.nodes)
    assert not any("graphamp_recomputed" in n.meta for n in twin_nodes)
    train_alike(steps, (ids, labels), 3)
    ours, functional = steps
    nodes = list(ours.graph.graph.nodes)  # type: ignore[union-attr]
    draws = [n for n in nodes if bindings.overload(n) is torch.ops.aten.bernoulli.p]
    assert draws and all(n.meta["val"].dtype == torch.bool for n in draws)
    recomputed = [n for n in nodes if "graphamp_recomputed" in n.meta]
    kinds = {str(bindings.overload(n)) for n in recomputed}
    assert "aten.mul.Tensor" in kinds, kinds  # the attention's dropout products
    # a weight's cast stays held (read by the backward from the forward), unless asked
    arguments = {p for p in nodes if p.op == "placeholder"}
    by_name = {n.name: n for n in nodes}
    casts = [
        n
        for n in recomputed
        if set(by_name[n.meta["graphamp_recomputed"]].all_input_nodes) <= arguments
    ]
    assert bool(casts) == (recompute_casts is not False), casts  # None: on a CPU, yes
    # the head in blocks of rows, where the traced step has four ops over the whole matrix
    assert [n.target for n in nodes].count(loss_head.cross_entropy_chunked) == 1
    assert not any(bindings.overload(n) is torch.ops.aten._log_softmax.default for n in nodes)
    # the functional graph has none of it, the head's traced ops again
    functional_nodes = list(functional.graph.graph.nodes)  # type: ignore[union-attr]
    assert not any(n.target is loss_head.cross_entropy_chunked for n in functional_nodes)
    assert any(n.target is torch.ops.aten._log_softmax.default for n in functional_nodes)
    assert not any("graphamp_recomputed" in n.meta for n in functional_nodes)
    assert all(
        n.meta["val"].dtype != torch.bool
        for n in functional_nodes
        if n.target is torch.ops.aten.bernoulli.p
    )
    # torch.compile gets them held again unless they were asked for (True)
    compiled = eager.for_compile(ours.graph)  # type: ignore[arg-type]  # (its last use)
    compiled_nodes = {n.name: n for n in compiled.graph.nodes}
    copied_casts = [
        n
        for n in compiled.graph.nodes
        if "graphamp_recomputed" in n.meta
        and set(compiled_nodes[n.meta["graphamp_recomputed"]].all_input_nodes) <= arguments
    ]
    assert bool(copied_casts) == (recompute_casts is True), copied_casts
