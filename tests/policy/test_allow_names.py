"""--allow-name GLOB / allow_names, the counterpart of --deny-name (ModelOpt's
nodes_to_include): matching nodes run low wherever their schema, kernel and weights allow,
whatever the op lists say, with rule ``allow_name`` in the plan; a deny_names match wins."""

from __future__ import annotations

import json

import onnx
import pytest

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import GraphampError
from tests.helpers import chain


def decisions(plan) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    return {name: (str(d.precision), str(d.rule)) for name, d in plan.nodes.items()}


def test_a_deny_list_or_unlisted_op_runs_low_by_name():
    plan = gonnx.analyse(
        chain(["MatMul", "Exp", "MatMul", "Cos"]), allow_names=["exp*", "cos3"]
    ).plan
    assert decisions(plan) == {
        "matmul0": ("float16", "allow"),
        "exp1": ("float16", "allow_name"),
        "matmul2": ("float16", "allow"),
        "cos3": ("float16", "allow_name"),
    }
    assert plan.nodes["exp1"].reason == "allow_names rule 'exp*'"
    assert plan.policy["allow_names"] == ["exp*", "cos3"]


def test_schema_weights_and_deny_names_still_win():
    # Exp before opset 13 admits no bfloat16: its schema keeps it float32
    old = chain(["MatMul", "Exp"])
    old.opset_import[0].version = 12
    plan = gonnx.analyse(old, dtype="bfloat16", allow_names=["exp*"]).plan
    assert decisions(plan)["exp1"] == ("float32", "schema")
    # a weight beyond float16's range keeps its reader float32, allowed or not
    big = chain(["MatMul", "Mul"], weight_scale=1e6)
    assert decisions(gonnx.analyse(big, allow_names=["mul1"]).plan)["mul1"] == (
        "float32",
        "weight_range",
    )
    both = gonnx.analyse(chain(["MatMul", "Exp"]), allow_names=["exp*"], deny_names=["exp1"])
    assert decisions(both.plan)["exp1"] == ("float32", "deny_name")


def test_the_command_line_flag_plans_converts_and_applies_a_reviewed_plan(tmp_path, capsys):
    source, out, plan_path = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "p.json"
    onnx.save(chain(["MatMul", "Exp", "MatMul"]), str(source))
    argv = ["convert", str(source), "-o", str(out), "--plan", str(plan_path)]
    assert main([*argv, "--allow-name", "exp1"]) == 0
    nodes = json.loads(plan_path.read_text())["nodes"]
    assert nodes["exp1"]["rule"] == "allow_name" and nodes["exp1"]["precision"] == "float16"
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    again = tmp_path / "again.onnx"
    assert main(["convert", str(source), "-o", str(again), "--from-plan", str(plan_path)]) == 0
    assert again.read_bytes() == out.read_bytes()
    capsys.readouterr()
    assert main(["plan", str(source), "--allow-name", "nothing*", "--strict"]) == 2
    assert "allow_names rule (--allow-name) 'nothing*' matches no node" in capsys.readouterr().err


def test_allow_names_in_the_policy_file(tmp_path):
    config = tmp_path / "amp.toml"
    config.write_text('[graphamp]\nallow_names = ["exp*"]\n')
    from graphamp.policy.policy import Policy

    policy = Policy.from_toml(config)
    assert policy.allow_names == ("exp*",)
    plan = gonnx.analyse(chain(["MatMul", "Exp"]), policy=policy).plan
    assert decisions(plan)["exp1"] == ("float16", "allow_name")
    with pytest.raises(GraphampError, match="allow_name"):
        Policy.from_mapping({"allow_name": ["x"]}, where="test")
