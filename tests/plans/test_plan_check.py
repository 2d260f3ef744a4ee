"""Plan files with a field of the wrong type or value: one line naming the field (exit status
2), never an error deep in a diff, an explanation or the reviewed-plan check. A number among
``casts_removed`` once reached ``sorted()`` in the reviewed-plan check (an internal error,
found by the plan-file fuzzer in tools/fuzz/fuzz_cli.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import GraphampError
from graphamp.plans.plan import Plan
from graphamp.policy.config import parse
from tests.helpers import chain


def plan_data() -> dict:
    proto = chain(["MatMul", "Softmax", "MatMul"])
    return json.loads(gonnx.analyse(proto, keep_io_types=["x"]).plan.to_json())


def setter(*path: object, value: object) -> Callable[[dict], None]:
    def change(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


CASES = {
    "casts_removed holds a number": (
        setter("casts_removed", value=[1, "a"]),
        "casts_removed[0] must be a string, not 1",
    ),
    "flops is a string": (
        setter("nodes", "matmul0", "flops", value="many"),
        "nodes['matmul0'].flops must be a whole number >= 0, not 'many'",
    ),
    "an unknown precision": (
        setter("nodes", "matmul0", "precision", value="float8"),
        "nodes['matmul0'].precision must be a precision",
    ),
    "a node without a reason": (
        lambda d: d["nodes"]["softmax1"].pop("reason"),
        "nodes['softmax1'].reason must be present",
    ),
    "a field a node does not have": (
        setter("nodes", "matmul0", "colour", value="red"),
        "nodes['matmul0'].colour must be absent (no such field)",
    ),
    "a cast's consumers not a list": (
        setter("casts", 0, "consumers", value="matmul0"),
        "casts[0].consumers must be a list of strings",
    ),
    "a weight's in_place a number": (
        setter("weights", 0, "in_place", value=1),
        "weights[0].in_place must be true or false, not 1",
    ),
    "a negative element count": (
        setter("weights", 0, "elements", value=-4),
        "weights[0].elements must be a whole number >= 0, not -4",
    ),
    "keep_io_types a list of numbers": (
        setter("policy", "keep_io_types", value=[0]),
        "policy.keep_io_types[0] must be a string, not 0",
    ),
    "a policy list that is no list": (
        setter("policy", "lists", "deny", value="Exp"),
        "policy.lists.deny must be a list of strings",
    ),
    "a precision that is an object": (
        setter("nodes", "matmul0", "precision", value={"a": 1}),
        "nodes['matmul0'].precision must be a precision",
    ),
    "a dtype that is no low type": (
        setter("dtype", value="int8"),
        "dtype must be a low-precision type (bfloat16, float16), not 'int8'",
    ),
    "a via that names no node (fuzz seed 6134: explain followed it, exit 3)": (
        setter("nodes", "matmul0", "via", value="float8"),
        "nodes['matmul0'].via must be the name of a node of the plan, not 'float8'",
    ),
    "a rule a later graphamp may have added": (
        setter("nodes", "matmul0", "rule", value="tomorrows_rule"),
        "not 'tomorrows_rule' (a word this graphamp does not know",
    ),
    "casts_retargeted to a number": (
        setter("casts_retargeted", value={"c": 3}),
        "casts_retargeted['c'] must be a string, not 3",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_plan_names_the_field(case):
    change, message = CASES[case]
    data = plan_data()
    change(data)
    with pytest.raises(GraphampError) as info:
        Plan.from_dict(data, where="p.json")
    assert message in str(info.value)
    assert str(info.value).startswith("p.json: ")


def test_the_plan_written_by_graphamp_passes_and_round_trips():
    data = plan_data()
    assert Plan.from_dict(data).to_dict() == data


@pytest.mark.parametrize("command", ["explain", "diff", "convert"])
def test_every_command_refuses_a_malformed_plan_in_one_line(tmp_path, capsys, command):
    data = plan_data()
    data["casts_removed"] = [1, "a"]
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(data))
    model = tmp_path / "m.onnx"
    model.write_bytes(chain(["MatMul", "Softmax", "MatMul"]).SerializeToString())
    args = {
        "explain": ["explain", str(plan), "matmul0"],
        "diff": ["diff", str(plan), str(model)],
        "convert": [
            "convert",
            str(model),
            "-o",
            str(tmp_path / "o.onnx"),
            "--from-plan",
            str(plan),
        ],
    }[command]
    capsys.readouterr()
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "casts_removed[0] must be a string, not 1" in lines[0]
    assert not (tmp_path / "o.onnx").exists()


def test_explain_refuses_a_via_that_names_no_node_in_one_line(tmp_path, capsys):
    """Fuzz seed 6134: explain followed a node's ``via`` to a name no node has (exit 3, a
    KeyError). The plan is refused when read, naming the file and the field."""
    data = plan_data()
    data["nodes"]["matmul0"]["via"] = "float8"
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["explain", str(plan), "matmul0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"graphamp: error: {plan}: "), lines
    assert "nodes['matmul0'].via must be the name of a node of the plan" in lines[0]


def test_a_plan_or_policy_nested_past_pythons_stack_is_one_line(tmp_path):
    """[[[[...]]]] 100,000 deep as a plan, or as a policy's list: RecursionError, exit 3."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(GraphampError, match=r"deep\.json: not a JSON plan: nested too deeply"):
        Plan.load(deep)
    with pytest.raises(GraphampError, match=r"p\.toml: not a valid TOML file: nested too deeply"):
        parse("[graphamp]\ndeny = " + "[" * 5000 + "]" * 5000, "p.toml")
