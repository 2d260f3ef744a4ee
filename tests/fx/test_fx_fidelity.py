"""PyTorch models computed as under torch.autocast: an op outside the lists runs in the
promoted type of its inputs, so graphamp's error on Hugging Face models (random weights,
built from configs) is no worse than autocast's, and the matrix products run in the same types.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import graphamp.fx as gfx
from graphamp.core.vocab import Precision
from tests.fx.recording import matrix_dtypes
from tests.hf_models import hf_model


def hidden(output) -> torch.Tensor:  # type: ignore[no-untyped-def]
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state.float()
    return (output[0] if isinstance(output, tuple | list) else output).float()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_error_no_worse_than_autocast_and_the_same_matrix_types(name):
    model = hf_model(name)
    ids = torch.randint(1, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, plan = gfx.convert(model, (ids,), dtype="bfloat16")
    with torch.no_grad():
        reference = hidden(model(ids))
        ours = hidden(converted(ids))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = hidden(model(ids))
    scale = reference.abs().max()
    our_error = float((ours - reference).abs().max() / scale)
    autocast_error = float((theirs - reference).abs().max() / scale)
    assert 0 < our_error <= autocast_error * 1.05 + 1e-6, (our_error, autocast_error)
    ours_types = matrix_dtypes(converted, ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_types = matrix_dtypes(model, ids)
    assert ours_types == autocast_types and torch.bfloat16 in ours_types
    # the residual stream stays float32: some adds are float32, as under autocast
    adds = [d for d in plan.nodes.values() if d.op == "add"]
    assert any(d.precision is Precision.FLOAT32 for d in adds)


def test_low_weights_stay_trainable():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, _ = gfx.convert(model, (x,), dtype="bfloat16", weights="low")
    low = [p for p in converted.parameters() if p.dtype == torch.bfloat16]
    assert low and all(p.requires_grad for p in low)
    converted(x).float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in low)
