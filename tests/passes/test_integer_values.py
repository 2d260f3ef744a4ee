"""The integer_values pass alone, on OpGraphs built in code: a wide integer cast to float keeps
its readers float32 (rule integer_range), float arithmetic used as an integer stays float32
(rule integer_valued), and calibrated ranges lift either where they show the values fit."""

from __future__ import annotations

import numpy as np
import pytest

from graphamp.core.graph import NodeKind
from graphamp.core.vocab import Rule
from graphamp.numerics.ranges import Ranges, TensorRange
from graphamp.passes import PassContext, PassManager
from graphamp.passes.integer_values import exact_limit
from graphamp.passes.options import Options
from graphamp.passes.pipeline import MODEL
from graphamp.policy.policy import Policy
from tests.opgraphs import GraphBuilder


def run(graph, dtype="float16", ranges=None, spread="cost"):  # type: ignore[no-untyped-def]
    context = PassContext(graph, Policy.create(dtype, spread=spread), Options(ranges=ranges))
    return PassManager(MODEL, check=True).run(context)


def calibrated(**largest: float) -> Ranges:
    return Ranges({name: TensorRange(value, None) for name, value in largest.items()}, batches=1)


def accumulator(source: str = "int32", through: str | None = None):  # type: ignore[no-untyped-def]
    """An integer accumulator (a graph input standing for MatMulInteger's output) cast to
    float32, optionally through a clear op, scaled, then a MatMul, as quantize_dynamic writes
    a layer followed by a float one."""
    b = GraphBuilder()
    acc = b.input("acc", source, fixed=True)
    value = b.op("cast", "Cast", [acc], kind=NodeKind.CAST, cast_to="float32")
    if through is not None:
        value = b.op("moved", through, [value])
    scaled = b.op("scale", "Mul", [value, b.weight("scales", 1e-4)])
    b.op("mm", "MatMul", [scaled, b.weight("w")])
    return b.output("mm")


@pytest.mark.parametrize("source", ["int32", "int64", "uint16", "uint32"])
def test_a_wide_integer_cast_keeps_float32_and_so_do_its_readers(source):
    context = run(accumulator(source))
    decisions, plan = context.decisions, context.plan()
    assert decisions["cast"].rule is Rule.INTEGER_RANGE
    assert f"{source} values reach" in decisions["cast"].reason
    assert decisions["scale"].rule is Rule.INTEGER_RANGE
    assert decisions["scale"].precision == "float32"
    assert "'cast'" in decisions["scale"].reason and "65504" in decisions["scale"].reason
    assert decisions["mm"].precision == "float16"  # the scaled value is an ordinary one
    assert plan.casts_retargeted == {}  # the Cast still writes float32
    assert [(c.tensor, c.dst) for c in plan.casts] == [("scale", "float16")]


@pytest.mark.parametrize("source", ["int8", "uint8", "int16"])
def test_a_narrow_integer_cast_is_an_ordinary_value(source):
    context = run(accumulator(source))
    assert context.decisions["cast"].rule is Rule.CAST
    assert context.decisions["scale"].rule is Rule.INFER
    assert context.plan().casts_retargeted == {"cast": "float16"}


def test_bfloat16_holds_every_integer_type_s_range():
    context = run(accumulator("int64"), dtype="bfloat16")
    assert context.decisions["cast"].rule is Rule.CAST
    assert context.decisions["scale"].precision == "bfloat16"


def test_the_readers_of_a_clear_op_that_moves_the_values_are_held_too():
    context = run(accumulator(through="Reshape"))
    assert context.decisions["moved"].rule is Rule.INTEGER_RANGE
    assert context.decisions["scale"].rule is Rule.INTEGER_RANGE


def test_calibration_that_shows_the_values_fit_lifts_the_range_rule():
    context = run(accumulator(), ranges=calibrated(cast=3000.0))
    assert context.decisions["cast"].rule is Rule.CAST
    assert context.decisions["scale"].precision == "float16"
    assert context.plan().casts_retargeted == {"cast": "float16"}
    held = run(accumulator(), ranges=calibrated(cast=70000.0))
    assert held.decisions["scale"].rule is Rule.INTEGER_RANGE


def requantisation(dtype_out: str = "int32"):  # type: ignore[no-untyped-def]
    """bias / (input_scale x weight_scale), floored and cast to an integer, beside a MatMul
    (what a quantised layer computes for its integer bias)."""
    b = GraphBuilder()
    x = b.input("x")
    b.op("mm", "MatMul", [x, b.weight("w")])
    product = b.op("scales", "Mul", [b.weight("input_scale", 0.02), b.weight("weight_scale", 0.01)])
    quotient = b.op("divide", "Div", [b.weight("bias", 3.0), product])
    floored = b.op("floor", "Floor", [quotient])
    b.op("to_int", "Cast", [floored], kind=NodeKind.CAST, cast_to=dtype_out)
    return b.output("mm", "to_int")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_arithmetic_whose_result_is_floored_stays_float32(dtype):
    context = run(requantisation(), dtype=dtype)
    decisions = context.decisions
    for name in ("scales", "divide"):
        assert decisions[name].rule is Rule.INTEGER_VALUED, name
        assert decisions[name].precision == "float32"
    assert "Floor 'floor'" in decisions["divide"].reason
    assert f"up to {exact_limit(dtype)}" in decisions["divide"].reason
    assert decisions["mm"].precision == dtype


def test_exact_limits():
    assert exact_limit("float16") == 2048
    assert exact_limit("bfloat16") == 256
    assert float(np.float16(2049)) != 2049 and float(np.float16(2048)) == 2048


def test_a_cast_to_an_integer_is_a_use_as_an_integer():
    b = GraphBuilder()
    x = b.input("x")
    b.op("mm", "MatMul", [x, b.weight("w")])
    ratio = b.op("ratio", "Mul", [b.input("length"), b.weight("hop", 0.25)])
    b.op("count", "Cast", [ratio], kind=NodeKind.CAST, cast_to="int64")
    b.op(
        "mask",
        "Cast",
        [b.op("half", "Mul", ["mm", b.weight("h")])],
        kind=NodeKind.CAST,
        cast_to="bool",
    )
    context = run(b.output("mm", "count", "mask"), spread="tensorflow")
    assert context.decisions["ratio"].rule is Rule.INTEGER_VALUED
    assert "a Cast to int64 'count'" in context.decisions["ratio"].reason
    assert context.decisions["half"].rule is Rule.INFER  # a Cast to bool is a comparison
    assert "length" not in context.script.retype  # the input the count comes from stays float32


def test_calibration_within_the_exact_limit_lifts_the_integer_rule():
    assert "no calibrated range" in run(requantisation()).decisions["divide"].reason
    held = run(requantisation(), ranges=calibrated(divide=6656.0, floor=6656.0))
    assert held.decisions["divide"].rule is Rule.INTEGER_VALUED
    assert "|x| = 6656 on the calibration data" in held.decisions["divide"].reason
    lifted = run(requantisation(), ranges=calibrated(divide=2000.0, floor=2000.0))
    assert lifted.decisions["divide"].rule is Rule.INFER


def test_the_walk_stops_at_an_allow_op_and_passes_through_float32_ops():
    b = GraphBuilder()
    x = b.input("x")
    mm = b.op("mm", "MatMul", [x, b.weight("w")])
    shifted = b.op("shift", "Add", [mm, b.weight("b")])
    unlisted = b.op("odd", "Frobnicate", [shifted])
    scaled = b.op("scale", "Mul", [unlisted, b.weight("s")])
    b.op("round", "Round", [scaled])
    context = run(b.output("round"), spread="tensorflow")
    decisions = context.decisions
    assert decisions["scale"].rule is Rule.INTEGER_VALUED
    assert decisions["odd"].rule is Rule.UNLISTED
    assert decisions["shift"].rule is Rule.INTEGER_VALUED
    assert decisions["mm"].rule is Rule.ALLOW and decisions["mm"].precision == "float16"


@pytest.mark.parametrize(("integers", "held"), [("uint8", False), ("int8", False), ("int16", True)])
def test_a_quantiser_holds_its_input_only_where_the_low_type_cannot_hold_its_steps(integers, held):
    b = GraphBuilder()
    x = b.input("x")
    mm = b.op("mm", "MatMul", [x, b.weight("w")])
    shifted = b.op("shift", "Add", [mm, b.weight("b")])
    b.op("q", "QuantizeLinear", [shifted, b.weight("scale", 0.1)], follow=[0], dtype=integers)
    context = run(b.output("q"), spread="tensorflow")
    rule = context.decisions["shift"].rule
    assert (rule is Rule.INTEGER_VALUED) is held
    if held:
        assert "QuantizeLinear to int16" in context.decisions["shift"].reason


def test_under_spread_all_an_unlisted_rounding_op_and_its_arithmetic_stay_float32():
    """--spread all runs unlisted ops low too (Floor among them): the rule holds them as well."""
    context = run(requantisation(), spread="all")
    decisions = context.decisions
    for name in ("scales", "divide", "floor"):
        assert decisions[name].rule is Rule.INTEGER_VALUED, name
        assert decisions[name].precision == "float32"
    assert decisions["mm"].precision == "float16"
