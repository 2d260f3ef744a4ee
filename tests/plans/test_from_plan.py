"""``convert --from-plan``: what CI reviewed is what ships, and a drifted model is refused."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graphamp.cli import main
from tests.helpers import assert_user_error, chain


@pytest.fixture()
def reviewed(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul", "Exp"]), str(model))
    plan = tmp_path / "reviewed.json"
    assert main(["plan", str(model), "--deny", "Relu", "--format", "json", "-o", str(plan)]) == 0
    return model, plan


def test_the_reviewed_plan_is_applied_exactly(reviewed, tmp_path):
    model, plan = reviewed
    decided = tmp_path / "decided.onnx"
    from_plan, replanned = tmp_path / "from_plan.onnx", tmp_path / "replanned.json"
    assert main(["convert", str(model), "-o", str(decided), "--deny", "Relu"]) == 0
    args = ["convert", str(model), "-o", str(from_plan), "--from-plan", str(plan)]
    assert main([*args, "--plan", str(replanned)]) == 0
    # the reviewed decisions (Relu denied), not the defaults: byte for byte the same model
    assert from_plan.read_bytes() == decided.read_bytes()
    assert json.loads(replanned.read_text())["nodes"] == json.loads(plan.read_text())["nodes"]


def test_a_model_that_no_longer_matches_is_refused_naming_the_difference(cli, reviewed, tmp_path):
    model, plan = reviewed
    out = tmp_path / "out.onnx"
    proto = onnx.load(str(model))
    proto.graph.node[1].op_type = "Sigmoid"
    changed = tmp_path / "changed.onnx"
    onnx.save(proto, str(changed))
    result = cli("convert", str(changed), "-o", str(out), "--from-plan", str(plan))
    assert_user_error(result, "node 'relu1' is Sigmoid in the model but Relu in the plan")
    assert not out.exists()

    proto = onnx.load(str(model))
    weight = proto.graph.initializer[0]
    values = numpy_helper.to_array(weight).copy()
    values[0, 0] = 1e6  # beyond float16: the reviewed float16 MatMul would clamp it
    weight.CopyFrom(numpy_helper.from_array(values.astype(np.float32), weight.name))
    onnx.save(proto, str(changed))
    result = cli("convert", str(changed), "-o", str(out), "--from-plan", str(plan))
    assert_user_error(result, "weight 'w0' now holds |x| up to 1e+06")
    assert not out.exists()


def test_policy_flags_beside_a_reviewed_plan_are_refused(cli, reviewed, tmp_path):
    model, plan = reviewed
    out = tmp_path / "out.onnx"
    result = cli("convert", str(model), "-o", str(out), "--from-plan", str(plan), "--deny", "X")
    assert_user_error(result, "drop --deny")


def test_a_hand_edited_plan_that_does_not_hold_together_is_refused(cli, reviewed, tmp_path):
    model, plan = reviewed
    out = tmp_path / "out.onnx"
    original = json.loads(plan.read_text())
    for node, precision, message in (
        ("relu1", "float16", "'relu1' is planned float16 under rule deny"),
        ("matmul2", "float32", "no longer matches the reviewed plan"),
    ):
        data = json.loads(json.dumps(original))
        data["nodes"][node]["precision"] = precision
        plan.write_text(json.dumps(data))
        result = cli("convert", str(model), "-o", str(out), "--from-plan", str(plan))
        assert_user_error(result, message)
        assert not out.exists()


def test_passes_and_plans_load_without_onnx_or_torch():
    import subprocess
    import sys

    code = (
        "import sys, graphamp.passes, graphamp.plans.plan, graphamp.engine; "
        "print(sorted(m for m in ('onnx', 'onnx_ir', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
