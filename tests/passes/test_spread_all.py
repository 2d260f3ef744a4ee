"""``--spread all`` (the spread_all pass): every float op low that no rule keeps float32, as
onnxconverter-common's and onnxruntime's float16 tools and Paddle's O2 do, inside If/Loop
bodies too; tested on onnxconverter-common's own Loop and If test models with its own dtype
assertions (its tests/test_float16.py: test_float16_with_loop and
test_convert_to_float16_with_subgraph)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.reference
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphamp.cli import main
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy
from tests.helpers import chain, convert, model, weight

LOOP_DATA = np.array([[2, 3], [4, 5], [6, 7]], dtype=np.float32)


def peers_loop_model() -> onnx.ModelProto:
    """onnxconverter-common's test_float16_with_loop model, built with its own onnx_fx builder
    exactly as its test does: a Loop over the rows of ``data`` whose body gathers a row and
    adds it to a carried total (Gather + Add), returning the total and every partial sum."""
    from onnxconverter_common.onnx_fx import Graph
    from onnxconverter_common.onnx_fx import GraphFunctionType as _Ty

    Graph.opset = 9
    onnx_function = Graph.trace

    @onnx_function(
        outputs=["y1", "y2"],
        input_types=[_Ty.F([None, None])],
        output_types=[_Ty.F([None]), _Ty.F([None, None])],
    )
    def loop_test(data):  # type: ignore[no-untyped-def]
        ox = data.ox
        shape = ox.shape(data)
        dim_0 = ox.gather([shape, ox.constant(value=0)], axis=0)
        dim_1 = ox.gather([shape, ox.constant(value=np.array([1], dtype=np.int64))], axis=0)
        zeros = ox.constant_of_shape(dim_1, value=0.0)
        is_true = ox.constant(value=True)

        @onnx_function(
            outputs=["c_o", "total_o", "scan_o"],
            output_types=[_Ty.b, _Ty.F([None]), _Ty.F([None])],
            input_types=[_Ty.I([1]), _Ty.b, _Ty.F([None])],
        )
        def range_body(iter_n, cond, total):  # type: ignore[no-untyped-def]
            ox = iter_n.ox
            iter_scalar = ox.squeeze(iter_n, axes=[0])
            col = ox.gather([data, iter_scalar], axis=0)
            total = ox.add([total, col])
            return (is_true, total, total)

        final_total, scan_res = ox.loop(
            dim_0, is_true, range_body, inputs=[zeros], outputs=["final_total", "scan_res"]
        )
        return final_total, scan_res

    return loop_test.to_model()


def peers_if_model() -> onnx.ModelProto:
    """onnxconverter-common's tests/data/test_subgraph.onnx, node for node: If(x + y > 0) whose
    then branch is ReduceMax, Max with 0 (CastLike), Unsqueeze and whose else branch an
    Identity; the graph output and the branches' results are declared with no type."""

    def zero(name: str, node: str) -> onnx.NodeProto:
        value = helper.make_tensor(name, TensorProto.INT64, [], [0])
        return helper.make_node("Constant", [], [name], name=node, value=value)

    untyped = onnx.ValueInfoProto
    then_result, else_result = untyped(name="result"), untyped(name="result_2")
    then_result.type.SetInParent()
    else_result.type.SetInParent()
    then_branch = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["a"], ["b"], name="n0", keepdims=0),
            zero("int64_0_0", "n1"),
            helper.make_node("CastLike", ["int64_0_0", "b"], ["int64_0_0_cast"], name="n2"),
            helper.make_node("Max", ["b", "int64_0_0_cast"], ["c"], name="n3"),
            zero("int64_0_1", "n4"),
            helper.make_node("Unsqueeze", ["c", "int64_0_1"], ["result"], name="n5"),
        ],
        "thenGraph_4",
        [],
        [then_result],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["result_2"], name="n0")],
        "elseGraph_4",
        [],
        [else_result],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "y"], ["a"], name="n0"),
            zero("int64_0", "n1"),
            helper.make_node("CastLike", ["int64_0", "a"], ["int64_0_cast"], name="n2"),
            helper.make_node("Greater", ["a", "int64_0_cast"], ["cond"], name="n3"),
            helper.make_node(
                "If",
                ["cond"],
                ["result_3"],
                name="n4",
                then_branch=then_branch,
                else_branch=else_branch,
            ),
        ],
        "model",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("x", "y")],
        [untyped(name="result_3")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def ort_run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The peers' ``_ort_inference``."""
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def float_math(plan: Plan) -> dict[str, str]:
    """Precision of every node that computes on a float type."""
    return {n: d.precision for n, d in plan.nodes.items() if d.precision != "none"}


def rules(plan: Plan) -> dict[str, tuple[str, str]]:
    """(precision, rule) of every node that computes on a float type."""
    return {n: (d.precision, d.rule) for n, d in plan.nodes.items() if d.precision != "none"}


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_the_peers_loop_model_runs_its_body_in_float16(keep_io_types):
    source = peers_loop_model()
    expected = ort_run(source, {"data": LOOP_DATA})
    converted, plan = convert(source, spread="all", keep_io_types=keep_io_types)
    body = {n: p for n, p in float_math(plan).items() if "/body/" in n}
    assert body == dict.fromkeys(
        [
            "loop_test_loop/body/range_body_gather",
            "loop_test_loop/body/range_body_add",
            "loop_test_loop/body/range_body_identity1",
            "loop_test_loop/body/range_body_identity2",
        ],
        "float16",
    )
    assert plan.nodes["loop_test_loop/carried:total"].precision == "float16"
    # ConstantOfShape's float type is its value attribute's: kept, one Cast before the loop
    assert plan.nodes["loop_test_constant_of_shape"].rule == "schema"
    onnx.checker.check_model(converted, full_check=True)
    fed = LOOP_DATA if keep_io_types else LOOP_DATA.astype(np.float16)
    actual = ort_run(converted, {"data": fed})
    for want, got in zip(expected, actual, strict=True):  # the peers' own assertions
        assert np.allclose(want, got)
        assert got.dtype == (np.float32 if keep_io_types else np.float16)
    # computed in float16 as stored (onnx.reference): partial sums of small integers, exact
    reference = onnx.reference.ReferenceEvaluator(converted).run(None, {"data": fed})
    for want, got in zip(expected, reference, strict=True):
        np.testing.assert_array_equal(got.astype(np.float32), want)


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_the_peers_if_model_runs_its_branches_in_float16(keep_io_types):
    source = peers_if_model()
    converted, plan = convert(source, spread="all", keep_io_types=keep_io_types)
    assert float_math(plan) == {
        "n0": "float16",
        "n2": "float16",
        "n3": "float16",
        "n4/then_branch/n0": "float16",
        "n4/then_branch/n2": "float16",
        "n4/then_branch/n3": "float16",
        "n4/then_branch/n5": "float16",
        "n4/else_branch/n0": "float16",
        "n4/output:result_3": "float16",
    }
    assert plan.nodes["n2"].rule == "unlisted"  # CastLike: in no list, low all the same
    fed = np.float32 if keep_io_types else np.float16
    # the peers' inputs (then branch), and scalars as declared into the else branch (an
    # Identity: the source model too refuses a shape [1] there)
    for x, y in (([1.0], [2.0]), (-3.0, 1.5)):
        output_32 = ort_run(source, {"x": np.array(x, np.float32), "y": np.array(y, np.float32)})
        actual = ort_run(converted, {"x": np.array(x, fed), "y": np.array(y, fed)})
        assert np.allclose(actual, output_32, atol=1e-2)  # the peers' own assertions
        assert actual[0].dtype == fed


def test_unlisted_ops_go_low_deny_ops_stay_and_do_not_spread():
    """MatMul -> Exp (deny) -> Relu -> Softmax -> Sin (unlisted) -> MatMul: under the cost
    spread deny reaches Softmax and Sin stays float32; under all only Exp is float32."""
    nodes = chain(["MatMul", "Exp", "Relu", "Softmax", "Sin", "MatMul"])
    _, cost = convert(nodes)
    assert cost.nodes["sin4"].rule == "unlisted" and cost.nodes["sin4"].precision == "float32"
    assert cost.nodes["softmax3"].rule == "deny_spread"
    converted, plan = convert(nodes, spread="all")
    assert {n for n, p in float_math(plan).items() if p == "float32"} == {"exp1"}
    assert plan.nodes["sin4"].rule == "unlisted" and "--spread all" in plan.nodes["sin4"].reason
    assert plan.policy["spread"] == "all"
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    wide = onnx.reference.ReferenceEvaluator(nodes).run(None, {"x": x})[0]
    low = onnx.reference.ReferenceEvaluator(converted).run(None, {"x": x.astype(np.float16)})[0]
    assert np.isfinite(low).all()
    assert np.abs(low.astype(np.float32) - wide).max() <= 2e-2 * np.abs(wide).max()


def test_rules_that_keep_float32_still_do():
    """deny_names, deny_tensors, a weight past float16's range, the schema (an output type
    fixed by an attribute), the target's kernels: each keeps its op."""
    one = onnx.numpy_helper.from_array(np.array([1.0], np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["a"], name="mm"),
        helper.make_node("Relu", ["a"], ["b"], name="denied"),
        helper.make_node("Sigmoid", ["a"], ["c"], name="tensor_rule"),
        helper.make_node("Mul", ["b", "big"], ["d"], name="big_weight"),
        helper.make_node("Shape", ["d"], ["s"], name="shape"),
        helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros", value=one),
        helper.make_node("Add", ["a", "z"], ["y"], name="add"),
    ]
    big = onnx.numpy_helper.from_array(np.full((4, 4), 1e6, np.float32), "big")
    proto = model(nodes, outputs=("y", "c"), initializers=[weight("w0"), big])
    _, plan = convert(proto, spread="all", deny_names=["denied"], deny_tensors=["c"])
    assert rules(plan) == {
        "mm": ("float16", "allow"),
        "denied": ("float32", "deny_name"),
        "tensor_rule": ("float32", "deny_tensor"),
        "big_weight": ("float32", "weight_range"),
        "zeros": ("float32", "schema"),
        "add": ("float16", "infer"),
    }
    grid = helper.make_node("GridSample", ["x", "g"], ["y"], name="grid")
    proto = model([grid], inputs=("x", "g"), shape=(1, 1, 4, 4))
    proto.graph.input[1].CopyFrom(
        helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 2, 2, 2])
    )
    _, plan = convert(proto, spread="all")  # CUDA has no float16 GridSample at opset 22
    assert plan.nodes["grid"].rule == "no_kernel"


def test_a_policy_file_and_the_command_line_say_spread_all(tmp_path, capsys):
    assert Policy.from_mapping({"spread": "all"}, where="p.toml").spread == "all"
    source, out, plan = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "plan.json"
    onnx.save(chain(["MatMul", "Sin", "MatMul"]), str(source))
    argv = ["convert", str(source), "-o", str(out), "--spread", "all", "--plan", str(plan)]
    assert main(argv) == 0
    assert Plan.load(plan).nodes["sin1"].precision == "float16"
    # a reviewed plan made with --spread all is applied as it is
    again = ["convert", str(source), "-o", str(tmp_path / "b.onnx"), "--from-plan", str(plan)]
    assert main(again) == 0
    assert (tmp_path / "b.onnx").read_bytes() == out.read_bytes()


def test_help_documents_spread_all(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{cost,tensorflow,autocast,all}" in text and "or all (every float op low" in text


@pytest.mark.slow
def test_an_fx_module_converts_with_spread_all():
    torch = pytest.importorskip("torch")
    import graphamp.fx as gfx
    from graphamp.models import build

    model_, inputs = build("bert", "small")
    gm, plan = gfx.convert(model_, inputs, spread="all")
    _, default = gfx.convert(model_, inputs)

    def low(p: Plan) -> int:
        return sum(d.precision == "bfloat16" for d in p.nodes.values())

    assert low(plan) > low(default)
    assert all(d.rule == "deny" for d in plan.nodes.values() if d.precision == "float32")
    with torch.no_grad():
        got, want = gm(*inputs), model_(*inputs)
    got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
    assert torch.isfinite(got.float()).all()
    assert (got.float() - want).abs().max() <= 0.05 * want.abs().max()


def test_calibration_keeps_an_overflowing_op_float32(tmp_path):
    from tests.numerics import numerics_models as planted

    source, data, plan = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "plan.json"
    onnx.save(planted.overflowing_hidden_layer(), str(source))
    np.savez(data, x=np.concatenate([batch["x"] for batch in planted.batches(3)]))
    argv = ["convert", str(source), "-o", str(tmp_path / "out.onnx"), "--spread", "all"]
    assert main([*argv, "--calibrate", str(data), "--plan", str(plan)]) == 0
    assert rules(Plan.load(plan)) == {
        "hidden": ("float32", "range"),
        "relu": ("float32", "range"),
        "down": ("float32", "range"),
        "side": ("float16", "allow"),
        "sum": ("float16", "infer"),
    }
