"""If/Loop/Scan bodies converted as if they were inline: their nodes decided by the same lists
and rules, named by their path; an If output one type in both branches; a loop-carried value
one type at entry, in the body and at exit; Casts of outer values in the scope that reads them;
and bad input refused in one line."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto, helper

import graphamp.onnx as gonnx
from graphamp.errors import GraphampError
from graphamp.models.control_flow import CASES
from graphamp.onnx.numerics.runtime import run as run_faithfully
from graphamp.onnx.numerics.tuning import tune
from tests.helpers import F32, assert_user_error, assert_valid, convert, model, run, weight


def branches(then_nodes, then_out, else_nodes, else_out, shape=(4, 4)):
    then_body = helper.make_graph(
        then_nodes, "then", [], [helper.make_tensor_value_info(then_out, F32, shape)]
    )
    else_body = helper.make_graph(
        else_nodes, "else", [], [helper.make_tensor_value_info(else_out, F32, shape)]
    )
    return {"then_branch": then_body, "else_branch": else_body}


def if_model(then_nodes, then_out, else_nodes, else_out, *, before=(), after=(), out="y"):
    nodes = [
        *before,
        helper.make_node(
            "If",
            ["cond"],
            ["branch" if after else out],
            name="if",
            **branches(then_nodes, then_out, else_nodes, else_out),
        ),
        *after,
    ]
    proto = model(
        nodes,
        inputs=("x", "cond"),
        outputs=(out,),
        initializers=[weight("w"), weight("v", seed=1)],
        input_types={"cond": TensorProto.BOOL},
    )
    proto.graph.input[1].type.tensor_type.shape.ClearField("dim")
    return proto


def body_graph(proto: onnx.ModelProto, node: str, attribute: str) -> onnx.GraphProto:
    owner = next(n for n in proto.graph.node if n.name == node)
    return next(a.g for a in owner.attribute if a.name == attribute)


def close(proto, out, feeds, tolerance=1e-2):
    expected = run(proto, feeds)[0]
    actual = run(out, feeds)[0].astype(np.float32)
    assert np.abs(actual - expected).max() <= tolerance * np.abs(expected).max()


X = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)


def test_body_nodes_are_decided_like_inline_ones_and_named_by_their_path():
    # m = MatMul(x, w); If { then: Relu(m); else: Neg(m) }; MatMul(branch, w): the branches
    # lie between two MatMuls, as they would inline.
    proto = if_model(
        [helper.make_node("Relu", ["m"], ["then_out"], name="relu")],
        "then_out",
        [helper.make_node("Neg", ["m"], ["else_out"], name="neg")],
        "else_out",
        before=[helper.make_node("MatMul", ["x", "w"], ["m"], name="mm")],
        after=[helper.make_node("MatMul", ["branch", "w"], ["y"], name="mm2")],
    )
    out, plan = convert(proto)
    assert plan.nodes["if"].precision == "none" and plan.nodes["if"].rule == "control_flow"
    for name in ("mm", "if/then_branch/relu", "if/else_branch/neg", "if/output:branch", "mm2"):
        assert plan.nodes[name].precision == "float16", name
    assert plan.casts == []  # the body reads the float16 m as it is
    assert_valid(out)
    for cond in (True, False):
        close(proto, out, {"x": X, "cond": np.array(cond)})


def test_an_if_output_has_one_type_with_a_cast_only_in_the_branch_that_differs():
    # then: MatMul (low); else: Exp (deny, float32): the output is float16, and only the else
    # branch ends with a Cast.
    proto = if_model(
        [helper.make_node("MatMul", ["x", "w"], ["then_out"], name="mm")],
        "then_out",
        [helper.make_node("Exp", ["x"], ["else_out"], name="exp")],
        "else_out",
        after=[helper.make_node("MatMul", ["branch", "v"], ["y"], name="mm2")],
    )
    out, plan = convert(proto, keep_io_types=True)
    assert plan.nodes["if/output:branch"].precision == "float16"
    assert plan.nodes["if/else_branch/exp"].precision == "float32"
    ends = [c for c in plan.casts if c.consumers == ["if/output:branch"]]
    assert [(c.tensor, c.dst) for c in ends] == [("if/else_branch/else_out", "float16")]
    else_body = body_graph(out, "if", "else_branch")
    then_body = body_graph(out, "if", "then_branch")
    assert [n.op_type for n in else_body.node] == ["Exp", "Cast"]
    assert else_body.output[0].name == else_body.node[-1].output[0]
    # the then branch casts only x, which its MatMul reads, and returns the MatMul's result
    assert [n.op_type for n in then_body.node] == ["Cast", "MatMul"]
    assert then_body.output[0].name == then_body.node[-1].output[0]
    assert_valid(out)
    for cond in (True, False):
        close(proto, out, {"x": X, "cond": np.array(cond)})


def test_a_cast_of_an_outer_value_is_shared_by_both_branches_or_sits_in_the_one_reading_it():
    both = if_model(
        [helper.make_node("MatMul", ["x", "w"], ["then_out"], name="mm")],
        "then_out",
        [helper.make_node("MatMul", ["x", "v"], ["else_out"], name="mm")],
        "else_out",
    )
    out, plan = convert(both, keep_io_types=True)
    casts = [c for c in plan.casts if c.tensor == "x"]
    assert len(casts) == 1 and casts[0].consumers == ["if/else_branch/mm", "if/then_branch/mm"]
    assert [n.op_type for n in out.graph.node] == ["Cast", "If", "Cast"]  # once, before the If
    assert_valid(out)
    one = if_model(
        [helper.make_node("MatMul", ["x", "w"], ["then_out"], name="mm")],
        "then_out",
        [helper.make_node("Exp", ["x"], ["else_out"], name="exp")],
        "else_out",
    )
    out, plan = convert(one, keep_io_types=True)
    then_body = body_graph(out, "if", "then_branch")
    assert [n.op_type for n in then_body.node][:2] == ["Cast", "MatMul"]  # only when taken
    # the output float32 (the cheapest cut: one Cast of the MatMul's result, in the branch that
    # computes it, where a float16 output would cast Exp's result and cast the output back)
    assert [n.op_type for n in then_body.node] == ["Cast", "MatMul", "Cast"]
    assert [n.op_type for n in out.graph.node] == ["If"]
    assert_valid(out)
    for cond in (True, False):
        close(one, out, {"x": X, "cond": np.array(cond)})


def loop_reading(outer: str) -> onnx.ModelProto:
    """A Loop whose body multiplies the carried h by an outer value 8 times."""
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", outer], ["h_mm"], name="mm"),
            helper.make_node("Tanh", ["h_mm"], ["h_out"], name="tanh"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", F32, [4, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", F32, [4, 4]),
        ],
    )
    steps = helper.make_tensor("steps_value", TensorProto.INT64, [], [8])
    nodes = [
        helper.make_node("Constant", [], ["steps"], value=steps),
        helper.make_node("Loop", ["steps", "", "x"], ["y"], name="loop", body=body),
    ]
    return model(nodes, inputs=("x", "z"), initializers=[weight("w")])


def test_a_loop_invariant_outer_value_is_cast_once_outside_the_loop():
    proto = loop_reading("z")
    out, plan = convert(proto, keep_io_types=True)
    assert plan.nodes["loop/body/mm"].precision == "float16"
    assert plan.nodes["loop/carried:h_in"].precision == "float16"
    body = body_graph(out, "loop", "body")
    assert "Cast" not in [n.op_type for n in body.node]  # nothing cast per iteration
    main = [n.op_type for n in out.graph.node]
    assert main.count("Cast") == 3  # x and z before the loop, y back to float32 after it
    assert main.index("Loop") == 3
    assert_valid(out)
    feeds = {"x": X, "z": X.T / 2}
    close(proto, out, feeds)
    # a weight the body reads is converted, not cast
    out, plan = convert(loop_reading("w"), keep_io_types=True)
    assert [w.name for w in plan.weights] == ["w"] and plan.weights[0].dst == "float16"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_built_bodies_convert_as_well_as_the_same_computation_unrolled(name, dtype):
    case = CASES[name]()
    out, plan = convert(case.model, dtype=dtype)
    assert_valid(out)
    again, _ = convert(out, dtype=dtype)
    assert again.SerializeToString() == out.SerializeToString()
    matrix = [d for d in plan.nodes.values() if d.op == "MatMul"]
    assert matrix and all(d.precision == dtype for d in matrix)
    flats = case.unrolled if isinstance(case.unrolled, list) else [case.unrolled]
    for feeds, flat in zip(case.feeds, flats * len(case.feeds), strict=False):
        flat_feeds = {k: v for k, v in feeds.items() if k in {i.name for i in flat.graph.input}}
        error = _relative_error(out, case.model, feeds)
        flat_error = _relative_error(convert(flat, dtype=dtype)[0], flat, flat_feeds)
        assert 0 < error <= 2 * flat_error, (error, flat_error)


def _relative_error(converted, original, feeds) -> float:
    want, _ = run_faithfully(original, feeds)
    got, how = run_faithfully(converted, feeds)
    assert "emulated" in how
    worst = 0.0
    for key, value in want.items():
        value64, got64 = np.asarray(value, np.float64), np.asarray(got[key], np.float64)
        worst = max(worst, np.abs(got64 - value64).max() / np.abs(value64).max())
    return worst


def test_the_rnn_loop_casts_nothing_per_iteration():
    case = CASES["loop_rnn"]()
    out, plan = convert(case.model, keep_io_types=True)
    body = body_graph(out, "loop", "body")
    assert "Cast" not in [n.op_type for n in body.node]
    assert plan.nodes["loop/carried:h_in"].precision == "float16"
    assert plan.nodes["loop/body/step_tanh"].precision == "float16"


def test_name_rules_reach_body_nodes_and_deny_spreads_there():
    case = CASES["if_in_loop"]()
    # by its own name: every node of that name in any body; by path: that one
    _, plan = convert(case.model, deny_names=["even_matmul"])
    assert plan.nodes["loop/body/alternate/then_branch/even_matmul"].rule == "deny_name"
    assert plan.nodes["loop/body/alternate/then_branch/even_tanh"].rule == "deny_spread"
    assert plan.nodes["loop/body/alternate/else_branch/odd_matmul"].precision == "float16"
    _, plan = convert(case.model, deny_names=["loop/body/alternate/else_branch/*"])
    assert plan.nodes["loop/body/alternate/else_branch/odd_matmul"].rule == "deny_name"
    assert plan.nodes["loop/body/alternate/then_branch/even_matmul"].precision == "float16"
    _, plan = convert(case.model, deny_tensors=["odd_mm"])
    assert plan.nodes["loop/body/alternate/else_branch/odd_matmul"].rule == "deny_tensor"


def test_a_body_that_graphamp_does_not_enter_is_kept_whole_with_a_warning():
    body = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y_elem"], name="relu")],
        "body",
        [],
        [helper.make_tensor_value_info("y_elem", F32, [4, 4])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Apply", ["m"], ["y"], name="apply", domain="custom", body=body),
    ]
    proto = model(nodes, initializers=[weight("w")])
    proto.opset_import.append(helper.make_opsetid("custom", 1))
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", F32, [4, 4]))
    with pytest.warns(UserWarning, match="'apply' \\(custom.Apply\\): graphamp does not enter"):
        out, plan = convert(proto)
    assert plan.nodes["apply"].rule == "control_flow" and plan.nodes["apply"].precision == "float32"
    assert plan.nodes["mm"].precision == "float16"
    # it reads m, and the x its body reads, as they were: float32
    apply = next(n for n in out.graph.node if n.name == "apply")
    assert apply.input[0] != "m"
    onnx.checker.check_model(out)  # (the full check infers types: none for a custom op)


def test_a_sequence_map_body_is_converted_its_sequences_kept():
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_elem", "w"], ["y_elem"], name="mm")],
        "body",
        [helper.make_tensor_value_info("x_elem", F32, [4, 4])],
        [helper.make_tensor_value_info("y_elem", F32, [4, 4])],
    )
    nodes = [
        helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
        helper.make_node("SequenceMap", ["seq"], ["mapped"], name="map", body=body),
        helper.make_node("ConcatFromSequence", ["mapped"], ["y"], axis=0),
    ]
    proto = model(nodes, initializers=[weight("w")])
    out, plan = convert(proto)
    assert plan.nodes["map/body/mm"].precision == "float16"
    assert plan.nodes["map/input:x_elem"].rule == "control_flow"  # a sequence: kept
    onnx.checker.check_model(out)  # (the full check refuses the float32 model's sequences too)
    body_out = body_graph(out, "map", "body")
    assert [n.op_type for n in body_out.node] == ["Cast", "MatMul", "Cast"]
    expected = run(proto, {"x": X})[0]
    actual = run(out, {"x": X})[0]
    assert np.abs(actual - expected).max() <= 1e-2 * np.abs(expected).max()


def _loop_with_body_input(dtype: int) -> onnx.ModelProto:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["h_in"], ["h_out"], name="same"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", dtype, [4, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", dtype, [4, 4]),
        ],
    )
    steps = helper.make_tensor("steps_value", TensorProto.INT64, [], [2])
    nodes = [
        helper.make_node("Constant", [], ["steps"], value=steps),
        helper.make_node("Loop", ["steps", "", "x"], ["y"], name="loop", body=body),
    ]
    return model(nodes)


def test_bad_bodies_are_refused_in_one_line_naming_the_node_and_the_body():
    with pytest.raises(GraphampError, match="node 'loop' \\(Loop\\): carried value 'h_in'"):
        convert(_loop_with_body_input(TensorProto.FLOAT16))
    mismatched = if_model(
        [helper.make_node("Relu", ["x"], ["then_out"], name="relu")],
        "then_out",
        [helper.make_node("Neg", ["x"], ["else_out"], name="neg")],
        "else_out",
    )
    then_body = next(a.g for a in mismatched.graph.node[0].attribute if a.name == "then_branch")
    then_body.output.append(then_body.output[0])
    with pytest.raises(GraphampError, match="node 'if' \\(If\\): then_branch returns 2 values"):
        convert(mismatched)
    dangling = if_model(
        [helper.make_node("Relu", ["nowhere"], ["then_out"], name="relu")],
        "then_out",
        [helper.make_node("Neg", ["x"], ["else_out"], name="neg")],
        "else_out",
    )
    with pytest.raises(GraphampError, match="node 'if/then_branch/relu' reads 'nowhere'"):
        convert(dangling)


def test_the_viewer_folds_each_body_under_its_node():
    from graphamp.viewer.hierarchy import build_hierarchy

    _, plan = convert(CASES["if_in_loop"]().model)
    hierarchy = build_hierarchy(list(plan.nodes))
    groups = hierarchy.groups
    assert groups["loop"].children == ["loop/body"]
    assert groups["loop/body/alternate"].children == [
        "loop/body/alternate/then_branch",
        "loop/body/alternate/else_branch",
    ]
    assert hierarchy.group_of["loop/body/alternate/then_branch/even_matmul"] == (
        "loop/body/alternate/then_branch"
    )
    assert hierarchy.group_of["loop/carried:h_in"] == "loop"


def test_calibrated_ranges_reach_body_values():
    proto = _growing_loop()
    feeds = {"x": np.full((4, 4), 1.5, np.float32), "z": X}
    ranges = gonnx.calibrate(proto, feeds)
    assert ranges.tensors["loop/body/h_mm"].max_abs == pytest.approx(1.5 * 20**4)
    assert ranges.tensors["loop/body/h_in"].max_abs == pytest.approx(1.5 * 20**3)
    _, plan = convert(proto)
    assert plan.nodes["loop/body/mm"].precision == "float16"
    result = gonnx.convert(proto, ranges=ranges)
    assert result.plan.nodes["loop/body/mm"].rule == "range"
    assert_valid(result.to_proto())


def _growing_loop() -> onnx.ModelProto:
    """h grows 20x per iteration: past float16's range on the last of 4."""
    proto = loop_reading("w")
    proto.graph.initializer[0].CopyFrom(
        onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32) * 20, "w")
    )
    proto.graph.node[0].attribute[0].t.CopyFrom(
        helper.make_tensor("steps_value", TensorProto.INT64, [], [4])
    )
    body_graph(proto, "loop", "body").node[1].op_type = "Identity"  # nothing bounds h
    return proto


def test_tune_keeps_a_body_node_float32_when_the_model_needs_it():
    feeds = {"x": np.full((4, 4), 1.5, np.float32) + X * 0.1, "z": X}
    result = tune(_growing_loop(), feeds, rtol=1e-2)
    assert result.kept == ("loop/body/mm",) and result.met
    assert result.conversion.plan.nodes["loop/body/mm"].rule == "tuned"


def test_the_faithful_evaluator_rounds_a_low_input_where_a_body_reads_it():
    # x becomes a float16 graph input that only the branches read: the emulation must read it
    # rounded there too, as onnx.reference (which computes in float16) does
    case = CASES["if_softmax"]()
    # (TensorFlow's colouring keeps the Softmax float32: in float16 the two evaluators compute
    # it differently, onnx.reference in numpy's float16 arithmetic, the emulation as a float32
    # kernel rounded at its output, by more than this test's tolerance; the cost pass runs it
    # low: no Cast before it)
    out, _ = convert(case.model, spread="tensorflow")
    for feeds in case.feeds:
        faithful, _ = run_faithfully(out, feeds)
        x = feeds["x"].astype(np.float16)
        reference = onnx.reference.ReferenceEvaluator(out).run(None, {**feeds, "x": x})[0]
        np.testing.assert_allclose(faithful["y"], reference, rtol=1e-3, atol=1e-6)


def test_the_commands_work_on_body_nodes(tmp_path, capsys):
    from graphamp.cli import main

    source = tmp_path / "if_in_loop.onnx"
    onnx.save(CASES["if_in_loop"]().model, source)
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    assert main(["convert", str(source), "-o", str(out), "--plan", str(plan)]) == 0
    node = "loop/body/alternate/then_branch/even_tanh"
    capsys.readouterr()
    assert main(["explain", str(plan), node]) == 0
    explained = capsys.readouterr().out
    assert explained.startswith(f"{node} (Tanh): float16") and "even_matmul" in explained
    # a reviewed plan reproduces the model byte for byte; check finds no drift
    again = tmp_path / "again.onnx"
    assert main(["convert", str(source), "-o", str(again), "--from-plan", str(plan)]) == 0
    assert again.read_bytes() == out.read_bytes()
    assert main(["check", str(source), "--baseline", str(plan)]) == 0
    denied = tmp_path / "denied.json"
    assert (
        main(["plan", str(source), "--deny-name", "even_*", "--format", "json", "-o", str(denied)])
        == 0
    )
    capsys.readouterr()
    assert main(["diff", str(plan), str(denied), "--exit-code"]) == 1
    assert f"+{node}  Tanh  float32" in capsys.readouterr().out


def test_a_bad_body_is_one_line_exit_2_and_nothing_written(cli, tmp_path):
    source, out = tmp_path / "bad.onnx", tmp_path / "out.onnx"
    onnx.save(_loop_with_body_input(TensorProto.FLOAT16), source)
    assert_user_error(cli("convert", str(source), "-o", str(out)), "node 'loop' (Loop)", "h_in")
    assert not out.exists()
