"""The command line: conversion, plan, verification, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import onnx
import pytest

from graphamp.cli import main
from tests.helpers import assert_user_error, chain, cli_process


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
