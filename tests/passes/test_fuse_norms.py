"""The fuse_norms pass: a decomposed RMSNorm becomes one fused op whose kernel accumulates in
float32, taking float16 in and out with no Cast, and stays right where squaring the hidden
values overflows float16 (|x| ~ 2000)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.numerics import verify
from graphamp.plans.plan import Plan
from tests.helpers import casts_in

F32 = TensorProto.FLOAT
WIDTH = 16


def rms_model(
    opset: int = 18,
    *,
    square: str = "Pow",
    inverse: str = "Reciprocal",
    weight_left: bool = False,
    own_cast: bool = False,
    cast_back: bool = False,
    lead: tuple[int, ...] = (4,),
) -> onnx.ModelProto:
    """x -> MatMul -> RMSNorm (decomposed as exporters write it) -> MatMul -> y, x of shape
    ``lead`` + [WIDTH]; the hidden values have two channels near +-2000 (a trained LLM's
    massive activations)."""
    rng = np.random.default_rng(0)
    first = (rng.standard_normal((WIDTH, WIDTH)) * 0.3).astype(np.float32)
    first[:, :2] = 2000.0 / WIDTH * np.sign(first[:, :2])  # x of ones: channels 0-1 at ~2000
    weights = {
        "W1": first,
        "W2": (rng.standard_normal((WIDTH, 8)) * 0.3).astype(np.float32),
        "norm.weight": (1.0 + rng.standard_normal(WIDTH) * 0.1).astype(np.float32),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-6, np.float32),
        "axes": np.array([-1], np.int64),
    }
    if inverse == "Div1":
        weights["one"] = np.array(1.0, np.float32)
    if opset < 18:
        del weights["axes"]
    if square == "Mul":
        del weights["two"]
    h = "h"
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="up")]
    if own_cast:  # T5: hidden_states.to(torch.float32) on float32 values
        nodes.append(helper.make_node("Cast", ["h"], ["h32"], to=F32, name="to_float"))
        h = "h32"
    squared = [h, h] if square == "Mul" else [h, "two"]
    nodes.append(helper.make_node(square, squared, ["sq"], name="square"))
    if opset >= 18:
        nodes.append(helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean"))
    else:
        nodes.append(helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], name="mean"))
    nodes += [
        helper.make_node("Add", ["ms", "eps"], ["var"], name="add_eps"),
        helper.make_node("Sqrt", ["var"], ["rms"], name="sqrt"),
    ]
    if inverse == "Reciprocal":
        nodes.append(helper.make_node("Reciprocal", ["rms"], ["inv"], name="inverse"))
        nodes.append(helper.make_node("Mul", [h, "inv"], ["normed"], name="normalise"))
    elif inverse == "Div1":
        nodes.append(helper.make_node("Div", ["one", "rms"], ["inv"], name="inverse"))
        nodes.append(helper.make_node("Mul", [h, "inv"], ["normed"], name="normalise"))
    else:
        nodes.append(helper.make_node("Div", [h, "rms"], ["normed"], name="normalise"))
    if cast_back:  # LLaMA's .to(input_dtype), float32 to float32 (the TorchScript exporter)
        nodes.append(helper.make_node("Cast", ["normed"], ["normed32"], to=F32, name="back"))
    normed = "normed32" if cast_back else "normed"
    scaled = ["norm.weight", normed] if weight_left else [normed, "norm.weight"]
    nodes += [
        helper.make_node("Mul", scaled, ["n"], name="scale"),
        helper.make_node("MatMul", ["n", "W2"], ["y"], name="down"),
    ]
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", F32, [*lead, WIDTH])],
        [helper.make_tensor_value_info("y", F32, [*lead, 8])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 23 else 8
    return model


def feeds(lead: tuple[int, ...] = (4,)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": (0.5 + rng.random((*lead, WIDTH))).astype(np.float32)}


def error(
    original: onnx.ModelProto, converted: onnx.ModelProto, lead: tuple[int, ...] = (4,)
) -> float:
    report = verify.verify(original, converted, feeds(lead), rtol=1e-2)
    assert all(o.nan_inf == 0 for o in report.outputs)
    return max(o.max_rel_error for o in report.outputs)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"square": "Mul"},
        {"inverse": "Div1"},
        {"inverse": "Div"},
        {"weight_left": True},
        {"own_cast": True},
        {"own_cast": True, "cast_back": True},
    ],
    ids=[
        "pow-reciprocal",
        "mul-square",
        "div-one",
        "div-x",
        "weight-left",
        "own-cast",
        "identity-casts",
    ],
)
def test_rms_norm_fused_for_onnxruntime_with_no_cast(variant):
    model = rms_model(23, **variant)
    result = gonnx.convert(model, keep_io_types=True, target="cuda")
    out, plan = result.to_proto(), result.plan
    onnx.checker.check_model(out, full_check=True)
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("RMSNormalization") == 1
    assert not {"Pow", "ReduceMean", "Sqrt", "Reciprocal"} & set(ops)
    # only the kept input and output: the norm reads and writes float16
    assert sorted(c.input[0] for c in casts_in(out)) == ["x", "y__float16"]
    [rewrite] = plan.rewrites
    assert rewrite.rule == "fuse_norm" and "float32" in rewrite.reason
    assert rewrite.attributes == {"axis": -1, "epsilon": pytest.approx(1e-6), "stash_type": 1}
    assert plan.nodes[rewrite.node].precision == "float16"
    assert "scale" not in plan.nodes and "square" not in plan.nodes
    # the constants only the norm read are gone with it
    names = {i.name for i in out.graph.initializer}
    assert not {"two", "eps", "one", "axes"} & names
    assert error(model, out) < 1e-2


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_below_opset_23_a_norm_without_residual_add_is_a_skip_norm_of_x_and_x(opset, target):
    """onnxruntime registers SimplifiedLayerNormalization in ONNX's domain, but onnx.checker
    refuses a model holding it: a norm with no residual Add before it becomes
    SkipSimplifiedLayerNormalization (com.microsoft) reading x as both input and skip, epsilon
    x4 (it normalises 2x, exactly); full check, onnxruntime loads and runs it right on the
    +-2000 channels, and a second conversion changes no byte."""
    import onnxruntime as ort

    model = rms_model(opset)
    result = gonnx.convert(model, keep_io_types=True, target=target)
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    [rewrite] = result.plan.rewrites
    assert rewrite.op == "SkipSimplifiedLayerNormalization" and rewrite.domain == "com.microsoft"
    assert rewrite.inputs == ["h", "h", "norm.weight"]
    assert rewrite.attributes == {"epsilon": pytest.approx(4e-6)}
    assert "both input and skip" in rewrite.reason and "epsilon x4" in rewrite.reason
    ops = [n.op_type for n in out.graph.node]
    assert "SimplifiedLayerNormalization" not in ops
    assert not {"Pow", "ReduceMean", "Sqrt", "Reciprocal"} & set(ops)
    assert ops.count("SkipSimplifiedLayerNormalization") == 1
    # on the cpu target the MatMuls have no float16 kernel: low, the norm alone would sit
    # between Casts (passes/isolated.py)
    assert plan_precision(result, rewrite.node) == ("float16" if target == "cuda" else "float32")
    assert error(model, out) < 5e-3  # the faithful evaluator, against float32
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got, want = (s.run(None, feeds())[0] for s in (session, reference))
    assert np.max(np.abs(got - want) / (np.abs(want) + 1e-3)) < 1e-2
    again = gonnx.convert(out, keep_io_types=True, target=target).to_proto()
    assert again.SerializeToString() == out.SerializeToString()


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_a_norm_over_a_4d_value_is_no_skip_norm(target):
    """onnxruntime's Skip norms take inputs of rank 2 or 3 and check it when they run
    ('input is expected to have 3 or 2 dimensions, got 4'), not when they load: a per-head
    norm over [batch, sequence, heads, head_dim] (Qwen3's and Gemma-3's q_norm and k_norm)
    keeps its ops below opset 23, and the converted model runs; at opset 23 it is ONNX's
    RMSNormalization, which takes any rank."""
    import onnxruntime as ort

    lead = (2, 3, 4)
    model = rms_model(18, lead=lead)
    result = gonnx.convert(model, keep_io_types=True, target=target)
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    assert not result.plan.rewrites
    assert "Pow" in [n.op_type for n in out.graph.node]
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got, want = (s.run(None, feeds(lead))[0] for s in (session, reference))
    assert np.max(np.abs(got - want) / (np.abs(want) + 1e-3)) < 1e-2
    assert error(model, out, lead) < 5e-3
    at_23 = gonnx.convert(rms_model(23, lead=lead), keep_io_types=True, target=target)
    assert [r.op for r in at_23.plan.rewrites] == ["RMSNormalization"]


def plan_precision(result, node: str) -> str:
    return result.plan.nodes[node].precision


def test_massive_activations_stay_right_where_a_float16_norm_loses_the_output():
    model = rms_model()
    fused = gonnx.convert(model, keep_io_types=True).to_proto()
    assert error(model, fused) < 5e-3
    # the same norm all in float16 (what a converter that does not keep it float32 writes)
    everything = gonnx.convert(
        model, keep_io_types=True, allow=["Pow", "ReduceMean", "Sqrt", "Reciprocal", "Mul", "Add"]
    ).to_proto()
    report = verify.verify(model, everything, feeds(), rtol=1e-2)
    assert report.outputs[0].max_rel_error > 0.5 or report.outputs[0].nan_inf > 0


def test_no_fuse_keeps_the_model_ops():
    model = rms_model()
    result = gonnx.convert(model, keep_io_types=True, fuse=False)
    ops = [n.op_type for n in result.to_proto().graph.node]
    assert "SimplifiedLayerNormalization" not in ops and "Pow" in ops
    assert not result.plan.rewrites
    assert result.plan.policy["fuse"] is False


def test_target_any_fuses_only_where_onnx_has_the_op():
    below = gonnx.convert(rms_model(18), keep_io_types=True, target="any")
    assert not below.plan.rewrites
    assert "Pow" in [n.op_type for n in below.to_proto().graph.node]
    # at most one Cast pair per norm where nothing fuses (besides the kept input's)
    assert len([c for c in below.plan.casts if c.tensor != "x"]) <= 2
    model = rms_model(23)
    at_23 = gonnx.convert(model, keep_io_types=True, target="any")
    out = at_23.to_proto()
    assert [r.op for r in at_23.plan.rewrites] == ["RMSNormalization"]
    assert sorted(c.input[0] for c in casts_in(out)) == ["x", "y__float16"]
    onnx.checker.check_model(out, full_check=True)
    assert error(model, out) < 5e-3


def test_a_name_rule_on_a_pattern_node_keeps_the_model_ops():
    result = gonnx.convert(rms_model(), keep_io_types=True, deny_names=["mean"])
    assert not result.plan.rewrites
    assert result.plan.nodes["mean"].rule == "deny_name"


def test_a_value_read_outside_the_pattern_is_not_fused_away():
    model = rms_model()
    model.graph.output.append(helper.make_tensor_value_info("ms", F32, None))
    result = gonnx.convert(model, keep_io_types=True)
    assert not result.plan.rewrites


def test_a_plan_of_a_fused_model_reapplies():
    model = rms_model()
    direct = gonnx.convert(model, keep_io_types=True)
    plan = Plan.from_dict(direct.plan.to_dict())
    assert plan.to_json() == direct.plan.to_json()
    again = gonnx.convert(model, reviewed=plan)
    assert again.to_proto().SerializeToString() == direct.to_proto().SerializeToString()
    # converting the converted model changes no byte
    converted = direct.to_proto()
    twice = gonnx.convert(converted, keep_io_types=True).to_proto()
    assert twice.SerializeToString() == converted.SerializeToString()


def layer_norm_model(tmp_path, opset: int, *, bias: bool = True) -> onnx.ModelProto:
    """Linear -> nn.LayerNorm -> Linear exported by torch.onnx's TorchScript exporter at opset
    14 (which decomposes layer_norm: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add) and converted to ``opset``; the hidden values have two channels near +-2000."""
    import torch
    from onnx import version_converter

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.LayerNorm(WIDTH, bias=bias),
        torch.nn.Linear(WIDTH, 8),
    ).eval()
    with torch.no_grad():
        module[0].weight[:2] = 2000.0 / WIDTH  # x near 1: channels 0-1 near 2000
    path = tmp_path / f"ln{opset}{bias}.onnx"
    torch.onnx.export(
        module,
        (torch.ones(4, WIDTH),),
        str(path),
        dynamo=False,
        opset_version=14,
        input_names=["x"],
        output_names=["y"],
    )
    model = version_converter.convert_version(onnx.load(str(path)), opset)
    assert "LayerNormalization" not in [n.op_type for n in model.graph.node]
    return model


@pytest.mark.parametrize("bias", [True, False])
def test_a_decomposed_layer_norm_becomes_layer_normalization(tmp_path, bias):
    for opset, target in ((17, "cuda"), (17, "cpu"), (17, "any")):
        model = layer_norm_model(tmp_path, opset, bias=bias)
        result = gonnx.convert(model, keep_io_types=True, target=target)
        out, plan = result.to_proto(), result.plan
        ops = [n.op_type for n in out.graph.node]
        assert ops.count("LayerNormalization") == 1, (opset, target, ops)
        assert not {"Pow", "ReduceMean", "Sqrt", "Sub"} & set(ops)
        [rewrite] = plan.rewrites
        assert rewrite.op == "LayerNormalization" and rewrite.attributes["stash_type"] == 1
        assert len(rewrite.inputs) == (3 if bias else 2)
        assert "decomposed LayerNorm" in rewrite.reason
        # only the kept input and output are cast: the norm reads and writes float16 (on the
        # cpu target, where the Gemms have no float16 kernel, the norm would run low alone
        # between Casts: it stays float32, passes/isolated.py)
        assert len(casts_in(out)) == (0 if target == "cpu" else 2)
        onnx.checker.check_model(out, full_check=True)
        assert error(model, out) < 5e-3  # the +-2000 channels stay right
    # below 17 ONNX has no LayerNormalization (onnxruntime's registration there fails the
    # checker): SkipLayerNormalization of x and x, epsilon x4, for onnxruntime's targets
    model = layer_norm_model(tmp_path, 14, bias=bias)
    for target in ("cuda", "cpu"):
        result = gonnx.convert(model, keep_io_types=True, target=target)
        out = result.to_proto()
        onnx.checker.check_model(out, full_check=True)
        [rewrite] = result.plan.rewrites
        assert rewrite.op == "SkipLayerNormalization" and rewrite.inputs[0] == rewrite.inputs[1]
        assert len(rewrite.inputs) == (4 if bias else 3)
        assert rewrite.attributes["epsilon"] == pytest.approx(4 * 1e-5)
        assert len(casts_in(out)) == (0 if target == "cpu" else 2)
        assert error(model, out) < 5e-3
        again = gonnx.convert(out, keep_io_types=True, target=target).to_proto()
        assert again.SerializeToString() == out.SerializeToString()


def test_a_layer_norm_nothing_fuses_keeps_one_cast_pair(tmp_path):
    model = layer_norm_model(tmp_path, 14)
    result = gonnx.convert(model, keep_io_types=True, target="any")
    assert not result.plan.rewrites
    assert len([c for c in result.plan.casts if c.tensor != "x"]) <= 2
    assert error(model, result.to_proto()) < 5e-3


@pytest.mark.slow
def test_a_half_precision_export_fuses_its_norms_with_their_casts(tmp_path):
    """LLaMA exported in float16: each RMSNorm casts x to float32, normalises and casts the
    result back before its float16 weight; the fused op reads and writes float16 itself."""
    import warnings

    import torch

    from tests.hf_models import hf_model

    path = tmp_path / "llama16.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        model = hf_model("llama").half()
        torch.onnx.export(
            model, (torch.randint(1, 96, (1, 8)),), dynamo=True, opset_version=18
        ).save(str(path))
    original = onnx.load(str(path))
    norms = sum(n.op_type == "Sqrt" for n in original.graph.node)
    result = gonnx.convert(original)
    out = result.to_proto()
    # the first norm reads the embedding, not a residual Add: at opset 18 it is the Skip op
    # reading the embedding as input and skip (module docstring of graphamp.onnx.dialect.fusion)
    assert len(result.plan.rewrites) == norms > 1
    op_of = {n.name: n.op_type for n in original.graph.node}
    for rewrite in result.plan.rewrites:  # the Cast to float32 and the Cast back go with it
        assert [op_of[n] for n in rewrite.replaces].count("Cast") == 2, rewrite.replaces
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("SkipSimplifiedLayerNormalization") == norms
    assert "SimplifiedLayerNormalization" not in ops and ops.count("Sqrt") == 0
    assert ops.count("Cast") < [n.op_type for n in original.graph.node].count("Cast") - norms
    report = verify.verify(original, out, verify.random_inputs(original, seed=1), rtol=1e-2)
    assert report.outputs[0].max_rel_error < 1e-2


def residual_model(opset: int = 18) -> onnx.ModelProto:
    """h = MatMul(x, W1) + MatMul(x, W0) (a residual Add), n = RMSNorm(h), y = MatMul(h + n,
    W2): the Add's sum is read by the norm and by the next residual Add."""
    model = rms_model(opset)
    graph = model.graph
    rng = np.random.default_rng(2)
    graph.initializer.append(
        numpy_helper.from_array(
            (rng.standard_normal((WIDTH, WIDTH)) * 0.3).astype(np.float32), "W0"
        )
    )
    up = next(n for n in graph.node if n.name == "up")
    up.output[0] = "h_up"
    index = list(graph.node).index(up)
    graph.node.insert(index + 1, helper.make_node("MatMul", ["x", "W0"], ["h_side"], name="side"))
    graph.node.insert(
        index + 2, helper.make_node("Add", ["h_up", "h_side"], ["h"], name="residual")
    )
    down = next(n for n in graph.node if n.name == "down")
    down.input[0] = "z"
    graph.node.insert(
        list(graph.node).index(down), helper.make_node("Add", ["h", "n"], ["z"], name="next")
    )
    return model


def test_a_residual_add_joins_the_norm_in_onnxruntimes_skip_op():
    model = residual_model()
    result = gonnx.convert(model, keep_io_types=True, target="cuda")
    out = result.to_proto()
    [rewrite] = result.plan.rewrites
    assert (rewrite.op, rewrite.domain) == ("SkipSimplifiedLayerNormalization", "com.microsoft")
    assert rewrite.inputs == ["h_up", "h_side", "norm.weight"]
    assert rewrite.outputs == ["n", "", "", "h"]  # the sum, which the next Add reads
    assert rewrite.replaces[0] == "residual" and rewrite.attributes == {
        "epsilon": pytest.approx(1e-6)
    }
    ops = [n.op_type for n in out.graph.node]
    assert "SkipSimplifiedLayerNormalization" in ops and ops.count("Add") == 1
    assert {(o.domain, o.version) for o in out.opset_import} >= {("com.microsoft", 1)}
    assert sorted(c.input[0] for c in casts_in(out)) == ["x", "y__float16"]
    assert error(model, out) < 5e-3  # the +-2000 channels still right
    again = gonnx.convert(out, keep_io_types=True, target="cuda").to_proto()
    assert again.SerializeToString() == out.SerializeToString()
    # nothing of onnxruntime's own for another runtime
    plain = gonnx.convert(model, keep_io_types=True, target="any")
    assert all(r.domain == "" for r in plain.plan.rewrites)


def test_a_sum_read_before_the_norms_last_op_keeps_its_add():
    """The Skip op is written where the norm's last op was: a reader of the residual sum
    placed before that (T5's own Cast of the sum, kept for another reader) would read the sum
    before it is made, so the Add keeps its op and the norm alone is fused (the Skip op
    reading the sum as input and skip, epsilon x4); the model stays valid."""
    model = residual_model()
    graph = model.graph
    index = [n.name for n in graph.node].index("residual")
    graph.node.insert(index + 1, helper.make_node("Neg", ["h"], ["early"], name="early"))
    graph.output.append(helper.make_tensor_value_info("early", F32, [4, WIDTH]))
    result = gonnx.convert(model, keep_io_types=True, target="cuda")
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    [rewrite] = result.plan.rewrites
    assert rewrite.inputs == ["h", "h", "norm.weight"] and "residual" not in rewrite.replaces
    assert rewrite.attributes == {"epsilon": pytest.approx(4e-6)}
    assert "residual" in [n.name for n in out.graph.node]  # the Add keeps its op
    assert error(model, out) < 5e-3


def if_model(opset: int) -> onnx.ModelProto:
    """rms_model's graph as the then-branch of an If (reading x and the weights from the main
    graph, as Optimum's merged decoder does), the else-branch a MatMul."""
    base = rms_model(opset)
    out = [helper.make_tensor_value_info("y", F32, [4, 8])]
    # the mean's axes a Constant of the branch (ONNX shape inference does not see the values
    # of the main graph's initializers inside a body, and the pattern needs the mean's shape)
    axes = helper.make_node(
        "Constant", [], ["axes"], name="axes", value=numpy_helper.from_array(np.array([-1]))
    )
    then = helper.make_graph([axes, *base.graph.node], "then", [], out)
    initializers = [i for i in base.graph.initializer if i.name != "axes"]
    other = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W2"], ["y_else"], name="plain")],
        "else",
        [],
        [helper.make_tensor_value_info("y_else", F32, [4, 8])],
    )
    branch = helper.make_node(
        "If", ["cond"], ["out"], name="if", then_branch=then, else_branch=other
    )
    graph = helper.make_graph(
        [branch],
        "if_rms",
        [
            helper.make_tensor_value_info("x", F32, [4, WIDTH]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("out", F32, [4, 8])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = base.ir_version
    return model


@pytest.mark.parametrize("target", ["any", "cuda"])
def test_a_norm_inside_an_if_branch_is_fused_there(target):
    model = if_model(23)
    result = gonnx.convert(model, keep_io_types=True, target=target)
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    [rewrite] = result.plan.rewrites
    assert rewrite.op == "RMSNormalization" and rewrite.node.startswith("if/then_branch/")
    assert result.plan.nodes[rewrite.node].precision == "float16"
    [branch] = [n for n in out.graph.node if n.op_type == "If"]
    then = next(a.g for a in branch.attribute if a.name == "then_branch")
    ops = [n.op_type for n in then.node]
    assert "RMSNormalization" in ops and not {"Pow", "ReduceMean", "Sqrt"} & set(ops)
    assert not any(n.op_type == "Cast" for n in then.node)  # it reads and writes float16
    rng = np.random.default_rng(1)
    for cond in (True, False):
        inputs = {"x": (0.5 + rng.random((4, WIDTH))).astype(np.float32), "cond": np.array(cond)}
        report = verify.verify(model, out, inputs, rtol=1e-2)
        assert report.outputs[0].nan_inf == 0 and report.outputs[0].max_rel_error < 5e-3
    again = gonnx.convert(out, keep_io_types=True, target=target).to_proto()
    assert again.SerializeToString() == out.SerializeToString()


def test_a_norm_inside_a_loop_body_is_fused_there():
    """An RMSNorm on the loop-carried state, its weight read from the main graph: fused in the
    body (no Cast per iteration), valid, within tolerance, a fixed point."""
    rng = np.random.default_rng(0)
    weights = {
        "W": (rng.standard_normal((WIDTH, WIDTH)) * 0.3).astype(np.float32),
        "g": (1 + rng.standard_normal(WIDTH) * 0.1).astype(np.float32),
        "M": np.array(3, np.int64),
    }
    constants = {"axes": np.array([-1]), "two": np.float32(2.0), "eps": np.float32(1e-6)}
    nodes = [
        helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(v)))
        for k, v in constants.items()
    ]
    nodes += [
        helper.make_node("Pow", ["h", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["v"]),
        helper.make_node("Sqrt", ["v"], ["r"]),
        helper.make_node("Reciprocal", ["r"], ["inv"]),
        helper.make_node("Mul", ["h", "inv"], ["normed"]),
        helper.make_node("Mul", ["normed", "g"], ["n"]),
        helper.make_node("MatMul", ["n", "W"], ["h_next"]),
        helper.make_node("Identity", ["c"], ["c_out"]),
    ]
    state = [4, WIDTH]
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h", F32, state),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_next", F32, state),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["y"], name="loop", body=body)],
        "loop_rms",
        [helper.make_tensor_value_info("x", F32, state)],
        [helper.make_tensor_value_info("y", F32, state)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    result = gonnx.convert(model, keep_io_types=True, target="any")
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    assert [r.node for r in result.plan.rewrites] == ["loop/body/Mul__n__rms_norm"]
    [loop] = [n for n in out.graph.node if n.op_type == "Loop"]
    ops = [n.op_type for n in loop.attribute[0].g.node]
    assert ops == ["RMSNormalization", "MatMul", "Identity"]  # no Cast per iteration
    report = verify.verify(model, out, feeds(), rtol=1e-2)
    assert report.outputs[0].nan_inf == 0 and report.outputs[0].max_rel_error < 5e-3
    again = gonnx.convert(out, keep_io_types=True, target="any").to_proto()
    assert again.SerializeToString() == out.SerializeToString()


def test_a_legacy_export_with_identity_casts_is_fused_at_once_and_converts_to_itself():
    """torch.onnx's TorchScript exporter writes LLaMA's RMSNorm with two Casts from float32
    to float32 (``hidden.to(float32)``, ``.to(input_dtype)``). The second was no match until a
    first conversion had made it narrow, so a second conversion fused the norm (Qwen3,
    Mixtral, Mamba): the first conversion now fuses it, and the second changes no byte."""
    model = rms_model(18, own_cast=True, cast_back=True)
    first = gonnx.convert(model, target="cuda")
    [rewrite] = first.plan.rewrites
    assert {"to_float", "back"} <= set(rewrite.replaces)
    out = first.to_proto()
    assert "Cast" not in [n.op_type for n in out.graph.node if n.name in rewrite.replaces]
    assert error(model, out) < 5e-3
    again = gonnx.convert(out, target="cuda").to_proto()
    assert again.SerializeToString() == out.SerializeToString()


def test_nothing_converted_is_not_said_of_a_model_whose_norms_fuse():
    """A model already low whose norms fuse is converted (its graph changes); one with nothing
    but Casts changed says so beside 'the output is the input's graph'."""
    from dataclasses import replace

    from graphamp.cli.summary import nothing_converted

    plan = gonnx.convert(rms_model(18), keep_io_types=True, target="cuda").plan
    assert plan.rewrites and plan.casts
    plan.nodes = {k: replace(d, rule="already_low") for k, d in plan.nodes.items()}
    plan.weights = []  # (as in a model stored low)
    assert nothing_converted(plan) is None
    plan.rewrites = []
    note = nothing_converted(plan)
    assert note is not None and "the output is the input's graph but for" in note
