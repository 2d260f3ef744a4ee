"""The fp8 pass on OpGraphs built in code: every rule, the scale records, and nothing changed
for a conversion without float8."""

from __future__ import annotations

import numpy as np
import pytest

from graphamp.core.graph import MatrixDims, NodeKind
from graphamp.core.vocab import Precision, Rule
from graphamp.numerics.ranges import TensorRange
from graphamp.passes import PassContext
from graphamp.training.float8 import Float8
from tests.opgraphs import Builder, M, calibrated, mlp, run


def rules(context: PassContext) -> dict[str, Rule]:
    return {name: decision.rule for name, decision in context.fp8_decisions.items()}


def test_a_weight_product_is_chosen_with_both_scale_sources():
    graph = mlp()
    context = run(graph, Float8.static(), calibrated(graph))
    assert rules(context) == {"up": Rule.FP8, "down": Rule.FP8, "head": Rule.FP8_DENY}
    up = context.fp8_decisions["up"]
    assert up.precision is Precision.FLOAT8_E4M3FN and up.operands == ["x", "w_up"]
    assert context.fp8_decisions["head"].precision is Precision.FLOAT16
    # the node's own decision keeps what decided it low
    assert context.decisions["up"].precision == "float16"
    assert context.decisions["up"].rule is Rule.ALLOW
    scales = {r.tensor: r for r in context.scales}
    assert set(scales) == {"x", "w_up", "relu", "w_down"}
    x = scales["x"]
    assert (x.format, x.granularity, x.source, x.consumers) == (
        "e4m3fn", "tensor", "calibration", ["up"]
    )  # fmt: skip
    assert (
        x.detail["batches"] == 4 and x.detail["amax"] == context.options.ranges.tensors["x"].max_abs
    )
    weight = scales["w_down"]
    assert (weight.granularity, weight.source, weight.detail) == ("channel", "weight", {"axis": 1})


def test_the_plan_records_decisions_and_scales_only_with_float8():
    graph = mlp()
    without = run(graph, None).plan("m")
    assert without.fp8_settings is None and not without.fp8 and not without.scales
    data = without.to_dict()
    assert data["version"] == 1 and not {"fp8", "scales", "fp8_settings"} & set(data)
    assert "matrix_ops_fp8" not in data["summary"]
    plan = run(mlp(), Float8.static(), calibrated(graph)).plan("m")
    data = plan.to_dict()
    assert data["version"] == 2 and data["fp8_settings"]["recipe"] == "static"
    assert data["summary"]["matrix_ops_fp8"] == 2 and data["summary"]["scales"] == 4
    # the same nodes, casts and weights as without float8: it changes no node's decision
    assert data["nodes"] == without.to_dict()["nodes"]


@pytest.mark.parametrize(
    ("k", "n", "why"),
    [(40, 128, "not both multiples of 16"), (64, 120, "not both multiples of 16")],
)
def test_dims_not_multiples_of_16_keep_the_low_type(k, n, why):
    graph = mlp(k, n)
    context = run(graph, Float8.static(), calibrated(graph))
    assert rules(context)["up"] is Rule.FP8_SHAPE
    assert why in context.fp8_decisions["up"].reason


@pytest.mark.slow
def test_torchaos_size_table_keeps_small_products_by_granularity():
    # tensorwise: K <= 4096 and N <= 1024 is under the table; rowwise: N <= 2048 is
    assert rules(run(mlp(64, 1024), Float8.current()))["up"] is Rule.FP8_SHAPE
    assert rules(run(mlp(64, 1040), Float8.current()))["up"] is Rule.FP8
    assert rules(run(mlp(4112, 16), Float8.current()))["up"] is Rule.FP8
    row = run(mlp(4112, 1040), Float8.current("row"))
    assert rules(row)["up"] is Rule.FP8_SHAPE and "rowwise" in row.fp8_decisions["up"].reason
    assert rules(run(mlp(4112, 4112), Float8.current("row")))["up"] is Rule.FP8
    # the table is off with sizes="none"
    assert rules(run(mlp(64, 128), Float8.current(sizes="none")))["up"] is Rule.FP8


def test_current_scaling_needs_no_data_and_names_its_source():
    context = run(mlp(), Float8.current(sizes="none", keep_last=False))
    assert rules(context) == {"up": Rule.FP8, "down": Rule.FP8, "head": Rule.FP8}
    assert {(r.source, r.granularity) for r in context.scales} == {("current", "tensor")}
    delayed = run(mlp(), Float8.delayed(history=16, sizes="none"))
    record = next(r for r in delayed.scales if r.tensor == "x")
    assert record.source == "delayed"
    assert record.detail == {"history": 16, "algorithm": "max", "margin": 0}
    assert record.state == ["x/amax_history", "x/scale"]


def test_attention_products_keep_the_low_type():
    b = Builder()
    b.input("x", (M, 64))
    q = b.matmul("q", "x", b.weight("wq", (64, 64)))
    kt = b.op("kt", "Transpose", [b.matmul("k", "x", b.weight("wk", (64, 64)))], (64, M))
    b.matmul("scores", q, kt)
    b.matmul("out", "scores", b.weight("wo", (M, 64)))
    context = run(b.output("out"), Float8.current(sizes="none", keep_last=False))
    assert rules(context)["scores"] is Rule.FP8_OPERANDS
    assert "both operands ('q', 'kt') are activations" in context.fp8_decisions["scores"].reason
    assert rules(context)["q"] is rules(context)["k"] is Rule.FP8
    # one record for x, read by both projections
    assert next(r for r in context.scales if r.tensor == "x").consumers == ["q", "k"]


def test_a_weight_computed_from_stored_values_is_a_weight():
    b = Builder()
    b.input("x", (M, 64))
    transposed = b.op("wt", "Transpose", [b.weight("w", (128, 64))], (64, 128))
    b.matmul("mm", "x", transposed)
    b.op("out", "Relu", ["mm"], (M, 128))
    context = run(b.output("out"), Float8.current(sizes="none"))
    assert rules(context) == {"mm": Rule.FP8_DENY}  # the last matrix op
    context = run(b.graph, Float8.current(sizes="none", keep_last=False))
    assert rules(context) == {"mm": Rule.FP8}


def test_deny_names_and_routers_are_kept_by_policy():
    graph = mlp()
    context = run(graph, Float8.static(deny_names=("dow*",)), calibrated(graph))
    assert rules(context)["down"] is Rule.FP8_DENY
    assert "'dow*'" in context.fp8_decisions["down"].reason
    b = Builder()
    b.input("x", (M, 64))
    b.matmul("router", "x", b.weight("wr", (64, 16)))
    b.op("probs", "Softmax", ["router"], (M, 16))
    b.op("topk", "TopK", ["probs"], (M, 2))
    b.matmul("expert", "x", b.weight("we", (64, 64)))
    context = run(b.output("expert"), Float8.current(sizes="none", keep_last=False))
    assert rules(context) == {"router": Rule.FP8_DENY, "expert": Rule.FP8}
    assert "MoE router" in context.fp8_decisions["router"].reason
    # Mixtral's router widens its logits first (aten `to`, its `.float()`): still a router
    b = Builder()
    b.input("x", (M, 64))
    b.matmul("router", "x", b.weight("wr", (64, 16)))
    b.op("wide", "to", ["router"], (M, 16))
    b.op("probs", "softmax", ["wide"], (M, 16))
    b.op("topk", "topk", ["probs"], (M, 2))
    b.matmul("expert", "x", b.weight("we", (64, 64)))
    context = run(b.output("expert"), Float8.current(sizes="none", keep_last=False))
    assert rules(context) == {"router": Rule.FP8_DENY, "expert": Rule.FP8}


def test_a_node_kept_float32_gets_no_float8_decision():
    graph = mlp()
    context = run(graph, Float8.static(), calibrated(graph), deny_names=["down"])
    assert context.decisions["down"].precision == "float32"
    assert "down" not in context.fp8_decisions and "up" in context.fp8_decisions


def test_calibration_rules_keep_unmeasured_zero_and_underflowing_values():
    graph = mlp()
    context = run(graph, Float8.static())  # static scales need calibration data
    assert rules(context)["up"] is Rule.FP8_RANGE
    assert "no calibrated range of 'x'" in context.fp8_decisions["up"].reason
    zero = calibrated(graph)
    zero.tensors["x"] = TensorRange(0.0, None, 0)
    assert (
        "was 0 on every calibration batch"
        in run(graph, Float8.static(), zero).fp8_decisions["up"].reason
    )
    # a few large values and a crowd of tiny ones: at scale max/448 the crowd flushes to zero
    rng = np.random.default_rng(1)
    values = rng.standard_normal((M, 64)) * 1e-6
    values[0, :4] = 100.0
    ranges = calibrated(graph, {"x": values})
    context = run(graph, Float8.static(), ranges)
    assert rules(context)["up"] is Rule.FP8_RANGE
    assert "flush to zero" in context.fp8_decisions["up"].reason
    # ... which a looser max_underflow lets through
    assert rules(run(graph, Float8.static(max_underflow=1.0), ranges))["up"] is Rule.FP8
    # normal data underflows nowhere near 1%
    assert rules(run(graph, Float8.static(), calibrated(graph)))["up"] is Rule.FP8


def test_unknown_dims_keep_the_low_type():
    graph = mlp()
    graph.nodes["up"].matrix = MatrixDims(None, None, 128)
    context = run(graph, Float8.current(sizes="none"))
    assert (
        rules(context)["up"] is Rule.FP8_SHAPE and "unknown" in context.fp8_decisions["up"].reason
    )
    graph.nodes["up"].matrix = None  # a matrix op whose dialect gave no dims at all
    assert rules(run(graph, Float8.current(sizes="none")))["up"] is Rule.FP8_SHAPE


def test_control_flow_nodes_are_not_matrix_ops():
    graph = mlp()
    graph.nodes["relu"].kind = NodeKind.OPAQUE
    assert set(rules(run(graph, Float8.current(sizes="none")))) == {"up", "down", "head"}
