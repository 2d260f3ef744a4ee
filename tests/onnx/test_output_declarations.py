"""Every graph output graphamp writes is one the full ONNX checker accepts. onnxconverter-common's
If test model (``tests/data/test_subgraph.onnx``, rebuilt here node for node) declares its
graph output with no type, and its branches return a value of rank 1 (then) and a scalar
(else): no declaration fits both, and the checker requires one, so the output is declared with
the larger rank and unknown sizes, with a warning naming it. Where the branches agree, type
inference settles the output and the converted model declares it fully; where nothing tells
an output's rank, the conversion is refused in one line naming it (exit 2, nothing written)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import GraphampError
from graphamp.onnx.numerics.runtime import run
from tests.helpers import assert_valid


def peers_if_model(*, else_rank: int = 0, typed: bool = False) -> onnx.ModelProto:
    """onnxconverter-common's If test model: a = x + y; if a > 0: unsqueeze(max(reducemax(a),
    0)) else a. ``else_rank=1`` unsqueezes in the else branch too (the branches agree);
    ``typed`` declares the output's element type (still no shape)."""

    def zero(name: str) -> onnx.NodeProto:
        return helper.make_node(
            "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [0])
        )

    then = helper.make_graph(
        [
            helper.make_node("ReduceMax", ["a"], ["b"], keepdims=0),
            zero("int64_0_0"),
            helper.make_node("CastLike", ["int64_0_0", "b"], ["int64_0_0_cast"]),
            helper.make_node("Max", ["b", "int64_0_0_cast"], ["c"]),
            zero("int64_0_1"),
            helper.make_node("Unsqueeze", ["c", "int64_0_1"], ["result"]),
        ],
        "thenGraph_4",
        [],
        [helper.make_value_info("result", onnx.TypeProto())],
    )
    otherwise = [helper.make_node("Identity", ["a"], ["result_2"])]
    if else_rank == 1:
        otherwise = [zero("axis"), helper.make_node("Unsqueeze", ["a", "axis"], ["result_2"])]
    other = helper.make_graph(
        otherwise, "elseGraph_4", [], [helper.make_value_info("result_2", onnx.TypeProto())]
    )
    nodes = [
        helper.make_node("Add", ["x", "y"], ["a"]),
        zero("int64_0"),
        helper.make_node("CastLike", ["int64_0", "a"], ["int64_0_cast"]),
        helper.make_node("Greater", ["a", "int64_0_cast"], ["cond"]),
        helper.make_node(
            "If", ["cond"], ["result_3"], name="n4", then_branch=then, else_branch=other
        ),
    ]
    output = (
        helper.make_tensor_value_info("result_3", TensorProto.FLOAT, None)
        if typed
        else helper.make_value_info("result_3", onnx.TypeProto())
    )
    graph = helper.make_graph(
        nodes,
        "model",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
        ],
        [output],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


@pytest.mark.parametrize("typed", [False, True])
def test_an_if_output_of_two_ranks_is_declared_so_the_checker_accepts_it(tmp_path, capsys, typed):
    """The branches return rank 1 (then) and a scalar (else): no declaration fits both. The
    output is declared as rank 1 of unknown size, with a warning that names it; the model is
    valid under the full checker and computes what the source computes on both branches."""
    source, out = tmp_path / "if.onnx", tmp_path / "if.fp16.onnx"
    original = peers_if_model(typed=typed)
    onnx.save(original, str(source))
    assert main(["convert", str(source), "-o", str(out), "--spread", "all"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "result_3" in line]
    assert len(warned) == 1
    assert "If returns rank 1 from then_branch and rank 0 from else_branch" in warned[0]
    assert "declared rank 1 of unknown sizes" in warned[0]
    converted = onnx.load(str(out))
    assert_valid(converted)
    (output,) = converted.graph.output
    assert output.type.tensor_type.elem_type == TensorProto.FLOAT16
    assert len(output.type.tensor_type.shape.dim) == 1
    for x, y in ((1.0, 2.0), (-3.0, 1.5)):  # each branch
        feeds = {"x": np.array(x, np.float32), "y": np.array(y, np.float32)}
        (want,) = run(original, feeds)[0].values()
        (got,) = run(converted, feeds)[0].values()
        np.testing.assert_array_equal(got, want)
    assert original == peers_if_model(typed=typed)  # the source is never changed
    # kept float32, the output is a Cast back of the If's: declared the same way
    kept = tmp_path / "if.kept.onnx"
    assert (
        main(["convert", str(source), "-o", str(kept), "--spread", "all", "--keep-io-types"]) == 0
    )
    assert_valid(onnx.load(str(kept)))


def test_an_output_whose_rank_nothing_tells_is_refused_naming_it(tmp_path, capsys):
    """An output of an op with no schema (a custom domain) declared with no type: inference
    cannot type it and no declaration can be made up, so the conversion is refused."""
    nodes = [
        helper.make_node("MatMul", ["x", "x"], ["h"], name="mm"),
        helper.make_node("Mystery", ["h"], ["y"], name="mystery", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_value_info("y", onnx.TypeProto())],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    source, out = tmp_path / "custom.onnx", tmp_path / "custom.fp16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(source))
    with pytest.raises(GraphampError, match="graph output 'y' declares no shape"):
        gonnx.convert(onnx.load(str(source)))
    assert main(["convert", str(source), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "graph output 'y' declares no shape and type inference cannot settle one" in line
    assert not out.exists() and not list(tmp_path.glob(".custom.fp16*"))


def test_an_output_inference_settles_is_declared_fully(tmp_path):
    source, out = tmp_path / "if.onnx", tmp_path / "if.fp16.onnx"
    onnx.save(peers_if_model(else_rank=1), str(source))
    assert main(["convert", str(source), "-o", str(out)]) == 0
    converted = onnx.load(str(out))
    assert_valid(converted)
    (output,) = converted.graph.output
    declared = output.type.tensor_type
    assert declared.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in declared.shape.dim] == [1]
    feeds = {"x": np.array(1.5, np.float32), "y": np.array(-4.0, np.float32)}  # the else branch
    (value,) = run(converted, feeds)[0].values()
    assert value.tolist() == [-2.5]
