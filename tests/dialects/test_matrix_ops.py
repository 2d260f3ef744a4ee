"""Each dialect states the op types that do matrix work, with its op lists: the registry, which
declares the built-in dialects without importing them, and the dialect classes agree."""

from __future__ import annotations

from graphamp.dialects import registry
from graphamp.plans.plan import Plan
from graphamp.plans.records import NodeDecision


def test_each_built_in_dialect_states_its_matrix_ops_and_the_registry_agrees():
    stated = {entry.name: entry.load_class().matrix_ops for entry in registry.entries()}
    assert {"MatMul", "Gemm", "Conv", "com.microsoft.Attention"} <= stated["onnx"]
    assert {"linear", "mm", "convolution", "scaled_dot_product_attention"} <= stated["fx"]
    assert stated["pt2"] == stated["fx"] and not stated["fx"] & stated["onnx"]
    for entry in registry.entries():
        assert entry.matrix_ops == stated[entry.name], entry.name
    for lists in ("onnx", "fx_cpu", "fx_cuda"):
        assert registry.matrix_ops_for(lists), lists


def test_a_plans_summary_counts_its_own_dialects_matrix_ops():
    nodes = {
        "mm": NodeDecision(op="mm", precision="float16", rule="allow", reason=""),
        "MatMul": NodeDecision(op="MatMul", precision="float16", rule="allow", reason=""),
    }
    for dialect, counted in (("fx_cuda", ["mm"]), ("onnx", ["MatMul"])):
        plan = Plan(dtype="float16", policy={"dtype": "float16", "dialect": dialect}, nodes=nodes)
        assert plan.matrix_nodes() == counted
