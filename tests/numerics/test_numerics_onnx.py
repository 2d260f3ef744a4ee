"""Planted float16 faults, found and fixed through the Python API: calibrate and the range
rule, debug's first non-finite node and ranking, tune's search. Every accuracy figure comes
from the faithful evaluator (float16 rounding emulated), never from the CPU provider alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphamp.onnx as gonnx
from graphamp.core.vocab import Precision, Rule
from graphamp.onnx.numerics.runtime import run
from graphamp.onnx.numerics.tuning import tune
from graphamp.policy.policy import Policy
from tests.numerics import numerics_models as planted


def max_rel_error(original, converted, data) -> float:  # type: ignore[no-untyped-def]
    """The worst max |y - y32| / max |y32| over the batches, inf for a new inf/NaN."""
    worst = 0.0
    for feeds in data:
        want = run(original, feeds)[0]["y"].astype(np.float64)
        got, evaluator = run(converted, feeds)
        assert "float16 rounding emulated" in evaluator
        got = got["y"].astype(np.float64)
        if not np.isfinite(got).all():
            return math.inf
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    return worst


def test_calibrate_keeps_an_overflowing_hidden_layer_float32_and_the_output_finite():
    model, data = planted.overflowing_hidden_layer(), planted.batches()
    plain = gonnx.convert(model)
    assert max_rel_error(model, plain.to_proto(), data) == math.inf  # the fault is real
    ranges = gonnx.calibrate(model, data)
    assert ranges.batches == 3
    assert ranges.tensors["h"].max_abs > 65504 > ranges.tensors["y"].max_abs
    assert ranges.tensors["x"].min_abs is not None and ranges.tensors["x"].min_abs > 0
    fixed = gonnx.convert(model, ranges=ranges)
    nodes = fixed.plan.nodes
    assert {n for n, d in nodes.items() if d.rule is Rule.RANGE} == {"hidden", "relu", "down"}
    assert "'h' reaches |x| = " in nodes["hidden"].reason
    assert nodes["side"].precision == Precision.FLOAT16  # the healthy branch stays low
    assert max_rel_error(model, fixed.to_proto(), data) < 1e-2


def test_debug_names_the_overflowing_layer_first():
    model, data = planted.overflowing_hidden_layer(), planted.batches()
    plain = gonnx.convert(model)
    report = gonnx.debug(model, plain.to_proto(), data, plan=plain.plan)
    assert report.first_nonfinite == "hidden"
    assert report.nodes[0].name == "hidden" and math.isinf(report.nodes[0].error)
    assert report.nodes[0].rule == "allow" and report.nodes[0].precision == "float16"
    record = report.to_dict()
    assert record["first_nonfinite"] == "hidden"
    assert record["nodes"][0] == {"name": "hidden", "op": "MatMul", "precision": "float16",
                                  "error": "inf"}  # fmt: skip
    # relu reads the inf already: it adds none
    assert next(n for n in report.nodes if n.name == "relu").error == 0.0
    assert "first non-finite: hidden (MatMul, float16, allow)" in report.to_text()


def test_debug_of_a_healthy_conversion_finds_no_nonfinite_and_small_errors():
    model, data = planted.overflowing_hidden_layer(), planted.batches()
    fixed = gonnx.convert(model, ranges=gonnx.calibrate(model, data))
    report = gonnx.debug(model, fixed.to_proto(), data)
    assert report.first_nonfinite is None
    assert all(0 <= n.error < 1e-2 for n in report.nodes)
    assert {n.name: n.precision for n in report.nodes}["side"] == "float16"  # from the model


# The planted models below are built around TensorFlow's colouring (spread = "tensorflow"):
# the cost pass's cut keeps some of their planted failures float32 by itself.
COLOURING = Policy.create("float16", spread="tensorflow")


def test_tune_fixes_a_cancellation_and_leaves_the_healthy_branch_low():
    model, data = planted.cancellation_beside_a_healthy_branch(), planted.batches()
    assert max_rel_error(model, gonnx.convert(model, spread="tensorflow").to_proto(), data) > 0.1
    result = tune(model, data, rtol=1e-2, policy=COLOURING)
    assert result.met and result.baseline_errors["y"] > 0.1
    assert result.kept == ("cancel",)
    assert 0 < result.evaluations <= 8
    nodes = result.conversion.plan.nodes
    assert nodes["cancel"].rule is Rule.TUNED and nodes["cancel"].precision == Precision.FLOAT32
    assert all(nodes[name].precision == Precision.FLOAT16 for name in planted.HEALTHY)
    assert max_rel_error(model, result.conversion.to_proto(), data) < 1e-2
    assert result.errors["y"] < 1e-2
    assert result.snippet() == 'deny_names = ["cancel"]'
    # the snippet as a policy gives the same precisions
    again = gonnx.convert(model, deny_names=["cancel"], spread="tensorflow").plan.nodes
    assert {n: d.precision for n, d in again.items()} == {n: d.precision for n, d in nodes.items()}


def test_tune_keeps_the_overflowing_nodes_one_by_one_in_graph_order():
    """hidden overflows; kept, relu still reads its float32 output in float16, then down: found
    from the float32 magnitudes of the one attribution run, confirmed on the real conversion."""
    model, data = planted.overflowing_hidden_layer(), planted.batches()
    result = tune(model, data, rtol=1e-2, policy=COLOURING)
    assert result.met and result.kept == ("hidden", "relu", "down")
    assert result.rounds == 1 and result.evaluations == 2 and result.real_evaluations == 1
    assert result.conversion.plan.nodes["side"].precision == Precision.FLOAT16
    assert max_rel_error(model, result.conversion.to_proto(), data) < 1e-2


def test_tune_keeps_a_node_that_breaks_without_any_overflow():
    """0 / 0 from values that flush to zero: no float32 value leaves float16's range, so the
    second attribution round finds the Div by its new NaN; keeping it float32 leaves its
    infer-list inputs with no low neighbour on both sides, so they follow (paint)."""
    model, data = planted.ratio_of_tiny_values(), planted.batches()
    plain = gonnx.convert(model, spread="tensorflow")
    assert gonnx.debug(model, plain.to_proto(), data).first_nonfinite == "ratio"
    calibrated = gonnx.convert(
        model, ranges=gonnx.calibrate(model, data), spread="tensorflow"
    ).plan.nodes
    assert not any(d.rule == Rule.RANGE for d in calibrated.values())  # calibration misses it
    result = tune(model, data, rtol=1e-2, policy=COLOURING)
    assert result.met and result.kept == ("ratio",) and result.rounds == 2
    nodes = result.conversion.plan.nodes
    assert nodes["scale_b"].precision == Precision.FLOAT32
    assert nodes["embed"].precision == nodes["project"].precision == Precision.FLOAT16
    assert max_rel_error(model, result.conversion.to_proto(), data) < 1e-2


def test_tune_on_a_model_that_already_meets_the_tolerance_keeps_nothing():
    model, data = planted.cancellation_beside_a_healthy_branch(), planted.batches()
    result = tune(model, data, rtol=10.0)
    assert result.met and result.kept == ()
    # one attribution run of the baseline, and the real conversion checked
    assert result.evaluations == result.rounds == result.real_evaluations == 1
    assert result.snippet() == "deny_names = []"


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_softmax_over_large_logits(scale):
    """Offset logits (float16's spacing at 2000 is 1) need tune; overflowing ones calibrate."""
    model, data = planted.softmax_over_large_logits(scale), planted.batches()
    plain = gonnx.convert(model)
    assert max_rel_error(model, plain.to_proto(), data) > 0.1
    result = tune(model, data, rtol=1e-2)
    assert result.met and 1 <= len(result.kept) <= 2
    assert max_rel_error(model, result.conversion.to_proto(), data) < 1e-2
    assert result.conversion.plan.nodes["mix"].precision == Precision.FLOAT16
    if scale > 1:
        fixed = gonnx.convert(model, ranges=gonnx.calibrate(model, data))
        assert fixed.plan.nodes["softmax"].rule is Rule.RANGE
        assert max_rel_error(model, fixed.to_proto(), data) < 1e-2
        assert gonnx.debug(model, plain.to_proto(), data).first_nonfinite == "logits"
