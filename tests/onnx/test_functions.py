"""Model-local functions: each call site's body converted like inline nodes and named by its
call path, written back as a function copy per distinct precision signature (or inline with
``--inline-functions``); a custom op with no function stays opaque; bad calls refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import graphamp.onnx as gonnx
from graphamp.errors import GraphampError
from graphamp.models.onnx_cases import feeds_for, function_cases, loads
from tests.helpers import assert_valid, run
from tests.onnx.node_cases import TOLERANCE, relative_error

F32 = TensorProto.FLOAT


def block_function() -> onnx.FunctionProto:
    """y = x + MatMul(Relu(MatMul(LayerNorm(x), w1)), w2)."""
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    return helper.make_function(
        "local",
        "Block",
        ["x", "w1", "w2"],
        ["y"],
        [
            helper.make_node("Constant", [], ["scale"], value=scale),
            helper.make_node("LayerNormalization", ["x", "scale"], ["n"], axis=-1),
            helper.make_node("MatMul", ["n", "w1"], ["h"], name="up"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "w2"], ["o"], name="down"),
            helper.make_node("Add", ["x", "o"], ["y"], name="residual"),
        ],
        opset_imports=[helper.make_opsetid("", 22)],
    )


def two_blocks(calls: int = 2, function: onnx.FunctionProto | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float32), f"w{i}")
        for i in range(2 * calls)
    ]
    nodes, previous = [], "x"
    for index in range(calls):
        out = "y" if index == calls - 1 else f"b{index}"
        inputs = [previous, f"w{2 * index}", f"w{2 * index + 1}"]
        nodes.append(helper.make_node("Block", inputs, [out], domain="local", name=f"block{index}"))
        previous = out
    graph = helper.make_graph(
        nodes,
        "blocks",
        [helper.make_tensor_value_info("x", F32, [2, 8])],
        [helper.make_tensor_value_info("y", F32, [2, 8])],
        weights,
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid("local", 1)],
        functions=[function or block_function()],
    )
    proto.ir_version = 10
    return proto


X = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)


def converted(proto, **policy):
    result = gonnx.convert(proto, **policy)
    return result.to_proto(), result.plan


def test_a_function_body_is_converted_per_call_path_and_written_as_one_copy_per_signature():
    proto = two_blocks(calls=3)
    # TensorFlow's colouring keeps the last residual float32 (an infer op not between low
    # ops), so two signatures; the cost pass would run all three calls alike (one copy)
    out, plan = converted(proto, spread="tensorflow")
    for call in ("block0", "block1", "block2"):
        assert plan.nodes[call].rule == "control_flow" and plan.nodes[call].precision == "none"
        assert plan.nodes[f"{call}/Block/up"].precision == "float16"
        assert plan.nodes[f"{call}/Block/down"].precision == "float16"
    # the first two calls decide alike, the last one's residual ends the graph (float32):
    # two copies, each named by its content, the original gone
    names = sorted(f.name for f in out.functions)
    assert len(names) == 2 and all(name.startswith("Block__") for name in names)
    calls = [node.op_type for node in out.graph.node]
    assert calls[0] == calls[1] != calls[2]
    assert_valid(out)
    again, _ = converted(out, spread="tensorflow")
    assert again.SerializeToString() == out.SerializeToString()
    assert sorted(f.name for f in again.functions) == names  # same content, same name
    alike, _ = converted(proto)
    assert len(alike.functions) == 1
    expected, actual = run(proto, {"x": X})[0], run(out, {"x": X})[0].astype(np.float32)
    assert 0 < np.abs(actual - expected).max() <= 1e-2 * np.abs(expected).max()


def test_a_name_rule_on_one_call_path_makes_its_own_copy():
    proto = two_blocks(calls=3)
    _, plain = converted(proto)
    out, plan = converted(proto, deny_names=["block0/Block/down"])
    assert plan.nodes["block0/Block/down"].rule == "deny_name"
    assert plan.nodes["block1/Block/down"].precision == "float16"
    assert len({node.op_type for node in out.graph.node}) == 3
    # and by its own name in the function: every call's
    _, plan = converted(proto, deny_names=["down"])
    assert all(plan.nodes[f"block{i}/Block/down"].rule == "deny_name" for i in range(3))
    assert plain.nodes["block0/Block/down"].rule == "allow"


def test_inline_functions_writes_each_call_site_inline_named_by_its_path():
    proto = two_blocks()
    out, plan = converted(proto, inline_functions=True)
    assert not out.functions
    names = {node.name for node in out.graph.node}
    assert {"block0/Block/up", "block1/Block/down"} <= names
    assert plan.policy["inline_functions"] is True
    assert_valid(out)
    again, replan = converted(out)
    assert again.SerializeToString() == out.SerializeToString()
    # the inlined model's plan names those nodes as the conversion's plan did
    inner = {n for n in plan.nodes if "/Block/" in n and "__" not in n}
    assert inner <= set(replan.nodes)
    for name in inner:
        assert replan.nodes[name].precision == plan.nodes[name].precision, name
    expected, actual = run(proto, {"x": X})[0], run(out, {"x": X})[0].astype(np.float32)
    assert np.abs(actual - expected).max() <= 1e-2 * np.abs(expected).max()


def test_a_custom_op_with_no_function_stays_opaque():
    proto = two_blocks(calls=1)
    proto.graph.node[0].op_type = "Unknown"  # a domain the model imports, no such function
    _, plan = converted(proto)
    assert plan.nodes["block0"].rule == "opaque" and plan.nodes["block0"].precision == "float32"


def test_bad_calls_are_refused_in_one_line_naming_the_call_and_the_function():
    proto = two_blocks()
    proto.graph.node[1].input.append("x")
    with pytest.raises(GraphampError, match=r"node 'block1' calls function 'local\.Block' with 4"):
        converted(proto)
    # Block calls Inner, Inner calls Block
    block = block_function()
    block.node.append(helper.make_node("Inner", ["y"], ["unused"], domain="local"))
    block.opset_import.append(helper.make_opsetid("local", 1))
    inner = helper.make_function(
        "local",
        "Inner",
        ["a"],
        ["b"],
        [helper.make_node("Block", ["a", "a", "a"], ["b"], domain="local", name="back")],
        opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid("local", 1)],
    )
    proto = two_blocks(calls=1, function=block)
    proto.functions.append(inner)
    with pytest.raises(GraphampError, match="functions may not call each other in a cycle"):
        converted(proto)


FUNCTION_CASES = function_cases()


def _inlined(proto: onnx.ModelProto) -> onnx.ModelProto:
    # onnx.reference fills a function's unset attributes from the op schema of the same name
    # only: a renamed copy is run inlined (as onnxruntime runs it)
    return onnx.inliner.inline_local_functions(proto)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_onnx_function_ops_as_local_functions_convert_inside(dtype):
    """Every ONNX node case whose op ONNX defines by a function, that function as a
    model-local one: valid, a fixed point, loads where the original does, within tolerance
    of float32 under onnx.reference; and their bodies do run low."""
    assert len(FUNCTION_CASES) > 300
    failures, low_nodes, compared = [], 0, 0
    for name, proto, case in FUNCTION_CASES:
        try:
            onnx.checker.check_model(proto, full_check=True)
        except onnx.checker.ValidationError:
            continue  # a case ONNX itself cannot state this way (Bernoulli's untyped attr)
        out, plan = converted(proto, dtype=dtype)
        try:
            onnx.checker.check_model(out, full_check=True)
        except onnx.checker.ValidationError as exc:
            failures.append((name, f"invalid: {exc}"))
            continue
        if converted(out, dtype=dtype)[0].SerializeToString() != out.SerializeToString():
            failures.append((name, "not a fixed point"))
        if loads(proto) and not loads(out):
            failures.append((name, "onnxruntime refuses it"))
        low_nodes += sum(
            1 for node, d in plan.nodes.items() if "/" in node and d.precision == dtype
        )
        inputs = case.data_sets[0][0]
        try:
            want = ReferenceEvaluator(_inlined(proto)).run(None, feeds_for(proto, inputs))
        except Exception:  # the evaluator cannot run the original: converted only
            continue
        got = ReferenceEvaluator(_inlined(out)).run(None, feeds_for(out, inputs))
        compared += 1
        for a, b in zip(got, want, strict=True):
            if isinstance(b, np.ndarray) and b.dtype.kind == "f":
                error = relative_error(a, b)
                if error > TOLERANCE[dtype]:
                    failures.append((name, f"error {error:.3g}"))
    assert not failures, failures
    assert compared > 250 and low_nodes > 500, (compared, low_nodes)


def test_calibrated_ranges_reach_each_call_sites_values():
    proto = two_blocks()
    for init in proto.graph.initializer[2:]:  # block1's weights: its values leave float16's range
        array = numpy_helper.to_array(init) * 300
        init.CopyFrom(numpy_helper.from_array(array.astype(np.float32), init.name))
    ranges = gonnx.calibrate(proto, {"x": X})
    assert (
        ranges.tensors["block1/Block/o"].max_abs > 65504 > ranges.tensors["block0/Block/o"].max_abs
    )
    result = gonnx.convert(proto, ranges=ranges)
    assert result.plan.nodes["block1/Block/down"].rule == "range"
    assert result.plan.nodes["block0/Block/down"].precision == "float16"
    assert_valid(result.to_proto())


def test_tune_switches_the_ops_inside_each_call_of_a_function():
    from graphamp.onnx.numerics.tuning import tune

    proto = two_blocks()
    for init in proto.graph.initializer[2:]:  # block1's values leave float16's range
        array = numpy_helper.to_array(init) * 300
        init.CopyFrom(numpy_helper.from_array(array.astype(np.float32), init.name))
    result = tune(proto, {"x": X}, rtol=1e-2)
    # found by the switchable model (one real conversion: the final check), not by the
    # search on real conversions it fell back to when it could not address a call's ops
    assert result.kept == ("block1/Block/down",) and result.met
    assert result.real_evaluations == 1
    plan = result.conversion.plan
    assert plan.nodes["block1/Block/down"].rule == "tuned"
    assert plan.nodes["block0/Block/down"].precision == "float16"
    assert_valid(result.conversion.to_proto())
