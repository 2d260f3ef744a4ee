"""A third dialect, written in the tests in under 150 lines, gets every command: convert with
verification, plan, explain, diff and check, through the same code paths as ONNX and .pt2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphamp.cli import main
from graphamp.dialects import registry
from tests.dialects.toy_dialect import ToyDialect, toy_model


@pytest.fixture()
def toy(tmp_path):
    registry.register(ToyDialect)
    path = tmp_path / "model.toy"
    path.write_text(json.dumps(toy_model()))
    yield path
    registry.unregister("toy")


def test_the_toy_dialect_is_small():
    assert len(Path(__file__).with_name("toy_dialect.py").read_text().splitlines()) < 150


def test_convert_verifies_and_writes_the_mixed_precision_graph(toy, tmp_path, capsys):
    out, plan = tmp_path / "out.toy", tmp_path / "plan.json"
    assert main(["convert", str(toy), "-o", str(out), "--plan", str(plan), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "verification on numpy" in printed and "ok" in printed
    converted = json.loads(out.read_text())
    assert converted["weights"]["w"]["dtype"] == "float16"
    casts = [n for n in converted["nodes"] if n["op"] == "Cast"]
    # one Cast before or after the Relu moves the same bytes: a tie, which goes low (the Relu
    # reads and writes half the bytes)
    assert [(c["inputs"], c["to"]) for c in casts] == [(["r"], "float32")]
    assert converted["retyped"] == {"x": "float16", "h": "float16", "r": "float16", "w": "float16"}
    decisions = json.loads(plan.read_text())["nodes"]
    assert {n: d["precision"] for n, d in decisions.items()} == {
        "mm": "float16",
        "relu": "float16",
        "exp": "float32",
    }
    again = tmp_path / "again.toy"
    assert main(["convert", str(out), "-o", str(again)]) == 0
    assert json.loads(again.read_text())["nodes"] == converted["nodes"], "a fixed point"


def test_plan_explain_diff_and_check(toy, tmp_path, capsys):
    assert main(["plan", str(toy), "--format", "json"]) == 0
    assert '"matrix_ops_low": 1' in capsys.readouterr().out
    assert main(["explain", str(toy), "relu"]) == 0
    explained = capsys.readouterr().out
    assert "a tie goes low" in explained and "<- mm (MatMul): float16" in explained
    assert main(["explain", str(toy), "r__float32"]) == 0
    assert "comes from relu (Relu): float16" in capsys.readouterr().out
    assert main(["diff", str(toy), str(toy), "--deny", "Relu", "--exit-code"]) == 0
    baseline = tmp_path / "baseline.json"
    assert main(["check", str(toy), "--baseline", str(baseline), "--update"]) == 0
    assert main(["check", str(toy), "--baseline", str(baseline)]) == 0
    assert main(["check", str(toy), "--baseline", str(baseline), "--deny", "MatMul"]) == 1
