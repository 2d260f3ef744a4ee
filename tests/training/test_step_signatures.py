"""A training step meets batches of another shape: the last batch of an epoch, padded
lengths. Each batch signature gets graphs of its own, captured from the step's state."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from graphamp import RecaptureWarning
from graphamp.errors import GraphampError
from graphamp.fx import train_step
from graphamp.fx.training.signatures import MANY_SIGNATURES
from graphamp.models.transformer import BertEncoder


def bert() -> nn.Module:
    torch.manual_seed(0)
    return BertEncoder(50, 16, 1, 2, 32, 8)


def bert_batch(size: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (size, 8), generator=generator)
    types = torch.randint(0, 2, (size, 8), generator=generator)
    return ids, types, torch.randn(size, 16, generator=generator)


def pooled_loss(output: tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output[1].float(), target)


def bert_step(model: nn.Module, optimizer=None, **options: object):  # type: ignore[no-untyped-def]
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train_step(model, pooled_loss, optimizer, dtype="bfloat16", **options)


def parameters(step) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    return [value.clone() for value in step.state_dict().values()]


@pytest.mark.slow
def test_a_smaller_last_batch_steps_as_a_step_captured_on_it():
    # The captured graph views the batch at its traced size: the last, smaller batch of an
    # epoch raised a shape error from inside the graph before the step specialised.
    model = bert()
    step = bert_step(model, keep_model=True)  # the reference below trains the model's own
    full, last = bert_batch(4, 1), bert_batch(3, 2)
    step(*full)
    # the reference: a step captured on the smaller batch, from the parameters and momentum
    # after the first step (copy_to writes both into the model and its optimizer)
    step.copy_to()
    reference = bert_step(model, step.optimizer)
    reference_loss = reference(*last)
    loss = step(*last)
    assert torch.equal(loss, reference_loss)
    for ours, theirs in zip(parameters(step), parameters(reference), strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.slow
def test_a_seen_signature_reuses_its_graphs():
    step = bert_step(bert())
    step(*bert_batch(4, 1))
    first = step.graph
    step(*bert_batch(3, 2))
    assert step.graph is not first
    step(*bert_batch(4, 3))
    assert step.graph is first  # not captured again
    assert step.plan is not None and "loss_scale" not in step.plan.nodes  # bfloat16: no scaling


@pytest.mark.slow
def test_accumulation_over_micro_batches_of_two_sizes():
    model = bert()
    reference = copy.deepcopy(model)
    step = bert_step(model, accumulate=2)
    micro = [bert_batch(4, 1), bert_batch(2, 2)]
    for batch in micro:
        step(*batch)
    # float32 eager: the mean of the two micro-batches' gradients, then SGD with momentum
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for batch in micro:
        (pooled_loss(reference(*batch[:-1]), batch[-1]) / 2).backward()
    optimizer.step()
    expected = [p.detach() for p in reference.parameters()]
    start = [p.detach() for p in bert().parameters()]
    for ours, theirs, before in zip(parameters(step), expected, start, strict=True):
        moved = (theirs - before).abs().max()
        assert (ours - theirs).abs().max() <= 0.05 * moved + 1e-6


@pytest.mark.slow
def test_a_compiled_step_compiles_a_new_signature_too():
    eager, compiled = bert_step(bert()), bert_step(bert())
    compiled.compile(*bert_batch(4, 1), backend="eager")
    for batch in (bert_batch(4, 1), bert_batch(3, 2)):
        assert torch.equal(eager(*batch), compiled(*batch))
    assert not isinstance(compiled.graph, torch.fx.GraphModule)  # the new one is compiled
    for ours, theirs in zip(parameters(eager), parameters(compiled), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_many_signatures_warn_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for size in range(1, MANY_SIGNATURES + 3):
            step(torch.randn(size, 4), torch.randn(size, 2))
    recaptures = [w for w in caught if issubclass(w.category, RecaptureWarning)]
    assert len(recaptures) == 1
    assert f"{MANY_SIGNATURES} batch signatures" in str(recaptures[0].message)
    assert f"float32[{MANY_SIGNATURES}, 4]" in str(recaptures[0].message)


@pytest.mark.slow
def test_other_index_types_and_layouts_are_signatures_of_their_own():
    step = bert_step(bert())
    ids, types, target = bert_batch(4, 1)
    step(ids, types, target)
    first = step.graph
    loss = step(ids.int(), types, target)  # int32 token ids: another capture
    assert step.graph is not first and torch.isfinite(loss)
    second = step.graph
    step(ids, types, torch.randn(16, 4).t())  # a transposed target: not contiguous
    assert step.graph not in (first, second)


def test_a_batch_the_model_cannot_take_is_one_line_naming_it(capfd):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    step = train_step(model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(6, 4), torch.randn(6, 2)
    step(x, y)
    for bad in ((torch.randn(6, 5), y), (x.double(), y)):  # too wide; float64 into float32
        with pytest.raises(GraphampError, match=r"capturing the step on a batch of .*\[6, ") as e:
            step(*bad)
        assert "\n" not in str(e.value)
        # and nothing else: torch.fx prints the generated code's traceback from __call__
        assert "Traceback" not in capfd.readouterr().err
        step(x, y)  # the first signature's graphs again, unharmed
    assert step.graph is not None and torch.isfinite(step(x, y))
