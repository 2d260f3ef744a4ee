"""graphamp.fx.convert's shapes: by default the first dimension of every input of two or more
dimensions is dynamic, so one conversion runs at any batch size; ``dynamic_shapes`` has
torch.export's meaning; a dimension that cannot be dynamic is named once."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.export import Dim

import graphamp.fx as gfx
from graphamp.errors import GraphampError, StaticShapeWarning
from graphamp.models import build


def first(output):  # type: ignore[no-untyped-def]
    return output[0] if isinstance(output, tuple | list) else output


def batch_of(inputs: tuple[torch.Tensor, ...], size: int) -> tuple[torch.Tensor, ...]:
    """``inputs`` repeated along the first dimension and cut to ``size`` rows."""
    return tuple(x.repeat(size, *[1] * (x.dim() - 1))[:size] for x in inputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_one_conversion_runs_at_every_batch_size_as_a_conversion_at_that_size(name):
    model, inputs = build(name, "small")
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaticShapeWarning)
        dynamic, plan = gfx.convert(model, inputs)
    for size in (1, 3, 7):
        batch = batch_of(inputs, size)
        static, static_plan = gfx.convert(model, batch, dynamic_shapes="static")
        with torch.no_grad():
            ours, theirs = first(dynamic(*batch)), first(static(*batch))
            reference = first(model(*batch))
        assert ours.shape[0] == size
        # the same decisions (the dynamic graph adds ops on sizes) and the same kernels: the
        # same numbers as a conversion at that size
        for node, decision in static_plan.nodes.items():
            assert plan.nodes[node].precision == decision.precision, node
        assert torch.equal(ours, theirs), size
        assert (ours.float() - reference).abs().max() <= 5e-2 * reference.abs().max()


def test_static_keeps_the_example_shapes():
    model, inputs = build("simplenet", "small")
    converted, _ = gfx.convert(model, inputs, dynamic_shapes="static")
    with pytest.raises(Exception, match="size"):
        converted(*batch_of(inputs, inputs[0].shape[0] + 1))


def test_keyword_inputs_and_a_named_dimension_with_a_range():
    model, (x,) = build("simplenet", "small")
    batch = Dim("batch", max=16)
    converted, _ = gfx.convert(model, example_kwargs={"x": x}, dynamic_shapes={"x": {0: batch}})
    assert converted(x=torch.randn(16, x.shape[1])).shape[0] == 16
    with pytest.raises(Exception, match=r"batch|16|size"):
        converted(x=torch.randn(17, x.shape[1]))


class Reshapes(nn.Module):
    """Fixes its batch: a view to the example's number of elements."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x).view(32).sum() + y.sum()


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ((torch.randn(4, 8), torch.randn(1, 3)), ["x (size 4)", "y (size 1)"]),
        ((torch.randn(4, 8), torch.randn(3)), ["x (size 4)"]),
    ],
)
def test_a_batch_that_cannot_be_dynamic_is_named_once(inputs, named):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        converted, _ = gfx.convert(Reshapes(), inputs)
    static = [w for w in caught if issubclass(w.category, StaticShapeWarning)]
    assert len(static) == 1, [str(w.message) for w in caught]
    message = str(static[0].message)
    assert all(name in message for name in named) and message.count("(size") == len(named)
    assert static[0].filename == __file__, "the warning points at the caller"
    assert converted(*inputs).shape == ()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"y": {0: Dim.AUTO}}, r"dynamic_shapes: .*arg names \['x'\]"),
        (({0: Dim.AUTO}, {0: Dim.AUTO}), "dynamic_shapes: .*1 elements"),
        (({5: Dim.AUTO},), r"dynamic_shapes\[0\]: no dimension 5 in an input of shape \(8, 64\)"),
        (({1: Dim("width")},), "dynamic_shapes: .*width.*specialized it to be a constant"),
        (({0: 3},), "dynamic_shapes: .*3 does not match input size of 8"),
        ("dynamic", "dynamic_shapes='dynamic': give torch.export's specification"),
    ],
)
def test_dynamic_shapes_that_do_not_match_the_inputs(spec, expected):
    model, inputs = build("simplenet", "small")
    with pytest.raises(GraphampError, match=expected) as caught:
        gfx.convert(model, inputs, dynamic_shapes=spec)
    assert "\n" not in str(caught.value)


def test_an_exported_program_keeps_its_own_shapes():
    model, inputs = build("simplenet", "small")
    program = torch.export.export(model, inputs)
    with pytest.raises(GraphampError, match="ExportedProgram's shapes were fixed"):
        gfx.convert(program, dynamic_shapes={"x": {0: Dim.AUTO}})
