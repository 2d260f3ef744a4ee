"""``graphamp debug`` inside If/Loop/Scan bodies: body values compared node by node, named by
their OpGraph paths, on the hand-built control-flow models and a seeded Loop-body culprit."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from graphamp.models.control_flow import CASES
from graphamp.onnx.numerics.debugging import debug
from tests.helpers import convert

BIG = 4e4  # |MatMul| of the RNN step is above 2: times this, past float16's 65504


def _loop_with_an_overflow() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """loop_rnn whose step scales its MatMul up by BIG and back down (float32: exact enough;
    float16: inf inside the body, at ``loop/body/scale_up``)."""
    case = CASES["loop_rnn"]()
    proto = case.model
    body = proto.graph.node[-1].attribute[0].g
    matmul = next(n for n in body.node if n.name == "step_matmul")
    add = next(n for n in body.node if n.name == "step_add")
    at = list(body.node).index(matmul) + 1
    body.node.insert(at, helper.make_node("Mul", ["step_mm", "big"], ["up"], name="scale_up"))
    body.node.insert(at + 1, helper.make_node("Mul", ["up", "small"], ["down"], name="scale_down"))
    add.input[0] = "down"
    for name, value in (("big", BIG), ("small", 1 / BIG)):
        proto.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
    onnx.checker.check_model(proto, full_check=True)
    return proto, case.feeds[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_body_node_is_ranked_by_its_path(name):
    case = CASES[name]()
    out, plan = convert(case.model)
    report = debug(case.model, out, case.feeds, plan=plan)  # an If: both branches
    ranked = {node.name: node for node in report.nodes}
    body_nodes = [n for n in plan.nodes if "/" in n and plan.nodes[n].op not in ("boundary",)]
    inside = [n for n in ranked if "/" in n]
    assert inside, report.to_text()
    for node in inside:  # each is a plan node, with the plan's precision and rule
        assert node in plan.nodes and ranked[node].rule == str(plan.nodes[node].rule)
        assert math.isfinite(ranked[node].output_error)
    # every low MatMul in a body is measured, and rounding it costs some error
    low = [n for n in body_nodes if plan.nodes[n].op == "MatMul"]
    low = [n for n in low if plan.nodes[n].precision == "float16"]
    assert low and all(ranked[n].output_error > 0 for n in low)
    assert report.first_nonfinite is None


def test_the_culprit_inside_a_loop_body_is_found_and_denying_it_fixes_the_loop():
    proto, feeds = _loop_with_an_overflow()
    out, plan = convert(proto)
    assert plan.nodes["loop/body/scale_up"].precision == "float16"
    report = debug(proto, out, feeds, plan=plan)
    assert report.first_nonfinite == "loop/body/scale_up"
    assert report.nodes[0].name == "loop/body/scale_up" and math.isinf(report.nodes[0].error)
    # its reader only carries the inf on: it adds nothing
    assert next(n for n in report.nodes if n.name == "loop/body/scale_down").error == 0
    fixed, plan = convert(proto, deny_names=[report.first_nonfinite])
    again = debug(proto, fixed, feeds, plan=plan)
    assert again.first_nonfinite is None
    assert all(e < 5e-3 for e in again.outputs.values()), again.outputs


def test_the_cli_names_the_body_culprit_by_its_path(cli, tmp_path):
    proto, feeds = _loop_with_an_overflow()
    source, out, data = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "d.npz"
    onnx.save(proto, source)
    np.savez(data, **feeds)
    assert cli("convert", str(source), "-o", str(out)).returncode == 0
    result = cli("debug", str(source), str(out), "--inputs", str(data))
    assert result.returncode == 0, result.stderr
    assert "first non-finite: loop/body/scale_up (Mul" in result.stdout, result.stdout
    assert "  1. loop/body/scale_up" in result.stdout
