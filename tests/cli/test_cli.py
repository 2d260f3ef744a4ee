"""The command line: conversion, plan, verification, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import onnx
import pytest

from graphamp.cli import main
from tests.helpers import assert_user_error, chain, cli_process, model


@pytest.fixture()
def small_model(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul", "Exp"]), str(path))
    return path


def test_convert_writes_model_and_plan(small_model, tmp_path, capsys):
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    assert main(["convert", str(small_model), "-o", str(out), "--plan", str(plan)]) == 0
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    data = json.loads(plan.read_text())
    assert data["nodes"]["matmul0"]["precision"] == "float16"
    assert data["nodes"]["exp3"]["rule"] == "deny"
    printed = capsys.readouterr().out
    assert "casts inserted" in printed and "nodes in float16" in printed


def test_verify_passes_and_fails_on_tolerance(small_model, tmp_path):
    out = tmp_path / "out.onnx"
    assert main(["convert", str(small_model), "-o", str(out), "--verify"]) == 0
    # float16 changes the result a little, so a zero tolerance must fail with exit 1.
    assert main(["convert", str(small_model), "-o", str(out), "--verify", "--rtol", "0"]) == 1


def test_verify_with_inputs_file(small_model, tmp_path):
    import numpy as np

    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.full((4, 4), 0.3, np.float32))
    out = tmp_path / "out.onnx"
    assert (
        main(["convert", str(small_model), "-o", str(out), "--verify", "--inputs", str(inputs)])
        == 0
    )


def test_verify_feeds_an_attention_mask_ones(tmp_path):
    """OPT derives its positions from the mask's cumulative sum: random ids in the mask run
    past the position table (the float32 model failed, exit 2, 'pass --inputs'); a mask input
    gets ones, every position attended."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    tables = {
        "positions": rng.standard_normal((10, 4)).astype(np.float32),
        "tokens": rng.standard_normal((16, 4)).astype(np.float32),
        "w": rng.standard_normal((4, 4)).astype(np.float32),
        "one": np.array(1, np.int64),
        "axis": np.array(1, np.int64),
    }
    nodes = [
        helper.make_node("CumSum", ["attention_mask", "axis"], ["count"]),
        helper.make_node("Sub", ["count", "one"], ["position"]),
        helper.make_node("Gather", ["positions", "position"], ["p"]),
        helper.make_node("Gather", ["tokens", "input_ids"], ["t"]),
        helper.make_node("Add", ["p", "t"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["y"]),
    ]
    ids = ("input_ids", "attention_mask")
    proto = model(
        nodes,
        inputs=ids,
        initializers=[numpy_helper.from_array(v, k) for k, v in tables.items()],
        opset=17,
        shape=(1, 8),
        input_types=dict.fromkeys(ids, TensorProto.INT64),
    )
    path, out = tmp_path / "opt.onnx", tmp_path / "out.onnx"
    onnx.save(proto, str(path))
    assert main(["convert", str(path), "-o", str(out), "--verify"]) == 0


def test_a_converted_model_that_fails_is_named_by_its_input(small_model, tmp_path, capsys,
                                                             monkeypatch):  # fmt: skip
    from graphamp.errors import InternalError
    from graphamp.numerics import verify

    def fails(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise InternalError("the converted model fails where the float32 model runs (node n)")

    monkeypatch.setattr(verify, "verify", fails)
    out = tmp_path / "out.onnx"
    assert main(["convert", str(small_model), "-o", str(out), "--verify"]) == 3
    err = capsys.readouterr().err
    assert f"{small_model}: the converted model fails where the float32 model runs" in err


def test_missing_file(tmp_path):
    out = tmp_path / "o.onnx"
    assert_user_error(
        cli_process("convert", str(tmp_path / "nope.onnx"), "-o", str(out)), "nope.onnx"
    )
    assert not out.exists()


def test_not_onnx_and_truncated(tmp_path, small_model):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model\x00\x01")
    out = tmp_path / "o.onnx"
    assert_user_error(cli_process("convert", str(junk), "-o", str(out)), "junk.onnx")
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(small_model.read_bytes()[:57])
    assert_user_error(cli_process("convert", str(truncated), "-o", str(out)), "cut.onnx")
    assert not out.exists()
    assert not list(tmp_path.glob(".o.onnx*")), "temporary files left behind"


def test_unknown_option_and_op_in_two_lists(cli, small_model, tmp_path):
    out = tmp_path / "o.onnx"
    assert_user_error(
        cli("convert", str(small_model), "-o", str(out), "--frobnicate"), "--frobnicate"
    )
    assert_user_error(
        cli("convert", str(small_model), "-o", str(out), "--allow", "Exp", "--deny", "Exp"),
        "'Exp'",
    )
    assert not out.exists()


def test_output_equal_to_input_is_refused(cli, small_model):
    before = small_model.read_bytes()
    assert_user_error(cli("convert", str(small_model), "-o", str(small_model)), "input")
    assert small_model.read_bytes() == before


def test_unknown_op_names_the_node(cli, tmp_path):
    from onnx import helper

    proto = chain(["MatMul"])
    proto.graph.node.append(helper.make_node("Frobnicate", ["y"], ["z"], name="weird"))
    proto.graph.output[0].name = "z"
    path, out = tmp_path / "u.onnx", tmp_path / "o.onnx"
    onnx.save(proto, str(path))
    assert_user_error(cli("convert", str(path), "-o", str(out)), "'weird'", "Frobnicate")
    assert not out.exists()


def test_integer_only_graph_is_refused(cli, tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Neg", ["i"], ["o"], name="neg")],
        "ints",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("o", TensorProto.INT64, [2])],
    )
    path, out = tmp_path / "ints.onnx", tmp_path / "o.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]), str(path))
    assert_user_error(cli("convert", str(path), "-o", str(out)), "floating-point")
    assert not out.exists()


def test_help_documents_every_flag(cli):
    result = cli("convert", "--help")
    assert result.returncode == 0
    for flag in (
        "--dtype",
        "--keep-io-types",
        "--allow",
        "--infer",
        "--clear",
        "--deny",
        "--deny-name",
        "--deny-tensor",
        "--config",
        "--plan",
        "--verify",
        "--inputs",
        "--rtol",
        "--atol",
    ):
        assert flag in result.stdout


@pytest.mark.slow
def test_demo_runs(cli, tmp_path):
    result = cli("demo", "--keep", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "probabilities" in result.stdout and "ok" in result.stdout
    assert (tmp_path / "mnist.float16.onnx").exists()
