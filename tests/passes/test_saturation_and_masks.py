"""Two patterns every unfused transformer export has, which float16 tools handle by luck or by
clamping: the tanh-GELU's ``Pow(x, 3)`` (its overflow saturates the Tanh: safe in float16) and
attention masks filled with float32's lowest value (a stand-in for -inf: stored at float16's
lowest, counted in the plan). Everything else that overflows keeps its float32 guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from graphamp.core.dtypes import numpy_type
from tests.helpers import assert_valid, casts_in, convert, model, weight

LOWEST = np.finfo(np.float32).min


def scalar(name: str, value: float):
    return numpy_helper.from_array(np.array(value, np.float32), name)


def tanh_gelu(*, cube_readers: int = 1, scale: float = 0.044715, offset: float | None = None):
    """MatMul -> 0.5 x (1 + tanh(sqrt(2/pi) (x + scale x^3))) -> MatMul, as exporters write
    GPT-2's activation; ``cube_readers=2`` gives x^3 a second reader (an output); ``offset``
    adds that constant instead of x."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("Mul", ["h", "half"], ["half_h"], name="half_h"),
        helper.make_node("Pow", ["h", "three"], ["cube"], name="cube"),
        helper.make_node("Mul", ["cube", "coef"], ["scaled"], name="scaled"),
        helper.make_node(
            "Add", ["h" if offset is None else "offset", "scaled"], ["inner"], name="inner"
        ),
        helper.make_node("Mul", ["inner", "root"], ["arg"], name="arg"),
        helper.make_node("Tanh", ["arg"], ["t"], name="tanh"),
        helper.make_node("Add", ["t", "one"], ["t1"], name="t1"),
        helper.make_node("Mul", ["half_h", "t1"], ["g"], name="gelu"),
        helper.make_node("MatMul", ["g", "w2"], ["y"], name="down"),
    ]
    inits = [
        weight("w1", seed=1),
        weight("w2", seed=2),
        scalar("half", 0.5),
        scalar("three", 3.0),
        scalar("coef", scale),
        scalar("root", float(np.sqrt(2 / np.pi))),
        scalar("one", 1.0),
        scalar("offset", offset or 0.0),
    ]
    outputs = ("y", "cube") if cube_readers == 2 else ("y",)
    return model(nodes, outputs=outputs, initializers=inits)


def test_tanh_gelu_cube_runs_low_and_its_overflow_saturates_as_in_float32():
    converted, plan = convert(tanh_gelu(), keep_io_types=True)
    cube = plan.nodes["cube"]
    assert cube.precision == "float16"
    assert "saturating" in cube.reason and "tanh" in cube.reason
    assert len(casts_in(converted)) == 2  # the graph's input and output only
    assert_valid(converted)
    # |x| up to 200: x**3 is inf in float16 for |x| > 40, and the activation still matches
    x = np.linspace(-200, 200, 16, dtype=np.float32).reshape(4, 4)
    reference = ReferenceEvaluator(tanh_gelu()).run(None, {"x": x})[0]
    actual = ReferenceEvaluator(converted).run(None, {"x": x})[0]
    assert np.isfinite(actual).all()
    assert np.max(np.abs(actual - reference)) <= 1e-2 * np.max(np.abs(reference))


@pytest.mark.parametrize(
    ("variant", "why"),
    [
        ({"cube_readers": 2}, "x**3 is also a graph output: its inf would leak"),
        ({"scale": 0.0}, "0 * inf is NaN"),
        ({"scale": 1e-8}, "the coefficient flushes to zero in float16: 0 * inf is NaN"),
        (
            {"scale": 1e-3, "offset": -100.0},
            "at |x| = 41 float32 gives tanh(1e-3 * 41**3 - 100) = -1, the overflow +1",
        ),
        ({"scale": 1e-7, "offset": 0.0}, "1e-7 * 65504 does not saturate float32's Tanh"),
    ],
)
def test_a_cube_that_could_leak_its_overflow_stays_float32(variant, why):
    _, plan = convert(tanh_gelu(**variant))
    assert (plan.nodes["cube"].precision, plan.nodes["cube"].rule) == ("float32", "deny"), why


def test_a_user_who_denies_pow_keeps_it_denied():
    _, plan = convert(tanh_gelu(), deny=["Pow"])
    assert plan.nodes["cube"].precision == "float32"


def masked_scores(mask: np.ndarray, scores: np.ndarray | None = None):
    """x @ w (``scores`` if given), plus an additive mask, Softmax, @ v: the attention
    path."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
        helper.make_node("Add", ["s", "mask"], ["m"], name="masked"),
        helper.make_node("Softmax", ["m"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="attend"),
    ]
    values = np.eye(4, dtype=np.float32) + 0.1  # y row i = probabilities row i, plus 0.1
    w = weight("w", seed=3) if scores is None else numpy_helper.from_array(scores, "w")
    inits = [w, numpy_helper.from_array(mask, "mask")]
    inits.append(numpy_helper.from_array(values, "v"))
    return model(nodes, initializers=inits)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_mask_at_float32s_lowest_is_stored_at_half_the_targets_largest(dtype):
    causal = np.triu(np.full((4, 4), LOWEST, np.float32), k=1)
    source = masked_scores(causal)
    converted, plan = convert(source, dtype=dtype, keep_io_types=True)
    assert plan.nodes["masked"].precision == dtype
    (record,) = [w for w in plan.weights if w.name == "mask"]
    assert record.at_limit == 6 and record.to_dict()["at_limit"] == 6
    stored = numpy_helper.to_array(next(i for i in converted.graph.initializer if i.name == "mask"))
    low_limit = -float(torch.finfo(getattr(torch, dtype)).max) / 2
    assert stored.dtype == numpy_type(dtype)
    assert np.count_nonzero(stored.astype(np.float32) == low_limit) == 6
    assert np.isfinite(stored.astype(np.float32)).all()
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    reference = ReferenceEvaluator(source).run(None, {"x": x})[0]
    actual = ReferenceEvaluator(converted).run(None, {"x": x})[0].astype(np.float32)
    assert not np.isnan(actual).any()
    assert np.max(np.abs(actual - reference)) < 2e-2
    # masked entries stay masked: each output row is its probabilities (plus 0.1 each)
    assert np.allclose(actual[np.triu_indices(4, k=1)], 0.1, atol=1e-3)


def test_values_beyond_range_that_are_not_the_limit_still_keep_their_readers_float32():
    mask = np.triu(np.full((4, 4), LOWEST, np.float32), k=1)
    mask[0, 0] = -1e6  # a real magnitude float16 cannot hold: never clamped
    _, plan = convert(masked_scores(mask))
    assert plan.nodes["masked"].rule == "weight_range"
    (kept,) = plan.kept_weights
    assert kept.out_of_range == 1


def test_traced_module_weight_at_float32s_lowest_is_stored_at_half_float16s_largest():
    from graphamp import fx as gfx

    torch.manual_seed(0)
    # a bias that masks two of four classes with float32's lowest, as masking code writes it
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Softmax(dim=-1)).eval()
    with torch.no_grad():
        module[0].bias[2:] = float(LOWEST)
    x = torch.randn(3, 4)
    converted, plan = gfx.convert(module, (x,), device="cpu", dtype="float16", weights="low")
    (bias,) = [w for w in plan.weights if w.name.endswith("bias")]
    assert bias.at_limit == 2
    assert bias.in_place
    stored = dict(converted.named_parameters())[bias.name]
    assert stored.dtype == torch.float16
    assert bool((stored[2:] == -32752.0).all())  # half float16's largest magnitude
    with torch.no_grad():
        out = converted(x).float()
        expected = module(x)
    assert not torch.isnan(out).any()
    assert torch.max(torch.abs(out - expected)) < 2e-2
    assert bool((out[:, 2:] == 0).all())


def test_a_fully_masked_row_stays_a_distribution_not_nan():
    """A padded query masks its whole row. Its output is ignored, but a NaN there would spread
    (0 * NaN in the next attention's P @ V): at half float16's largest a score added to the
    mask stays finite, so the row is still a distribution (which one differs from float32's
    uniform row: float16 cannot absorb the scores), where float16's lowest plus a negative
    score is -inf and the row NaN. The other rows match float32."""
    mask = np.zeros((4, 4), np.float32)
    mask[0, :] = LOWEST
    source = masked_scores(mask, scores=np.eye(4, dtype=np.float32))  # the scores are x
    converted, plan = convert(source, keep_io_types=True)
    assert plan.nodes["masked"].precision == "float16"
    x = -20.0 - np.arange(16, dtype=np.float32).reshape(4, 4)
    reference = ReferenceEvaluator(source).run(None, {"x": x})[0]
    actual = ReferenceEvaluator(converted).run(None, {"x": x})[0].astype(np.float32)
    assert np.isfinite(actual).all()
    assert abs(actual[0].sum() - 1.4) < 1e-2  # probabilities summing to 1, each plus 0.1
    assert np.max(np.abs(actual[1:] - reference[1:])) < 2e-2
