"""Plans as files: stable JSON, round trips, diffs that name exactly what changed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.errors import GraphampError
from graphamp.plans.plan import PLAN_FORMAT, PLAN_VERSION, Plan
from tests.helpers import chain, layer_norm_model, model, weight


def test_plan_json_is_stable_sorted_and_round_trips():
    plan = gonnx.convert(chain(["MatMul", "Relu", "Exp", "MatMul"])).plan
    text = plan.to_json()
    assert text == gonnx.convert(chain(["MatMul", "Relu", "Exp", "MatMul"])).plan.to_json()
    data = json.loads(text)
    # a plan without float8 is written at version 1, as before float8 (version 2 adds it)
    assert data["format"] == PLAN_FORMAT and data["version"] == 1 < PLAN_VERSION
    assert list(data["nodes"]) == sorted(data["nodes"])
    for name in data["nodes"]:  # one line per node: a one-node change is a one-line git diff
        assert (
            sum(1 for line in text.splitlines() if line.lstrip().startswith(json.dumps(name))) == 1
        )
    assert {"tensor", "from", "to", "output", "consumers"} <= set(data["casts"][0])
    assert Plan.from_dict(data).to_json() == text


def test_plan_summary_counts_flops_of_matrix_ops():
    plan = gonnx.convert(chain(["MatMul", "Exp", "MatMul"])).plan
    summary = plan.summary()
    assert summary["matrix_ops"] == 2 and summary["matrix_ops_low"] == 2
    assert summary["matrix_flops_low_share"] == 1.0
    assert plan.nodes["matmul0"].flops == 2 * 4 * 4 * 4


def test_diff_of_a_one_node_change_names_that_node():
    baseline = gonnx.convert(layer_norm_model(gain=1e5), allow=["LayerNormalization"]).plan
    edited = gonnx.convert(layer_norm_model(gain=1.0), allow=["LayerNormalization"]).plan
    difference = baseline.diff(edited)
    assert [name for name, _, _ in difference.nodes_changed] == ["/encoder/norm/LayerNormalization"]
    assert not difference.nodes_added and not difference.nodes_removed
    _, before, after = difference.nodes_changed[0]
    assert (before.precision, after.precision) == ("float32", "float16")
    assert before.rule == "weight_range"
    # The casts that went are the ones around that node, and nothing else.
    for cast in difference.casts_removed + difference.casts_added:
        assert cast.tensor in ("h", "n") or "/encoder/norm/LayerNormalization" in cast.consumers
    text = difference.to_text()
    assert (
        "-/encoder/norm/LayerNormalization" in text and "+/encoder/norm/LayerNormalization" in text
    )
    assert "/encoder/mm1  " not in text


def test_a_summary_entry_one_plan_lacks_reads_absent_in_the_text_diff():
    low = gonnx.convert(chain(["MatMul", "Relu", "MatMul"])).plan
    kept = gonnx.convert(chain(["MatMul", "Relu", "MatMul"]), deny=["MatMul", "Relu"]).plan
    difference = low.diff(kept)
    assert difference.summary["nodes.float16"] == (3, None)  # JSON keeps null
    assert " nodes.float16: 3 -> absent" in difference.to_text().splitlines()
    assert "None" not in difference.to_text()


def test_identical_plans_have_an_empty_diff():
    plan = gonnx.convert(layer_norm_model(1.0)).plan
    assert plan.diff(gonnx.convert(layer_norm_model(1.0)).plan).empty


def test_loading_bad_plan_files(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(GraphampError, match="not a JSON plan"):
        Plan.load(path)
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(GraphampError, match="not a graphamp plan"):
        Plan.load(path)
    path.write_text(json.dumps({"format": PLAN_FORMAT, "version": 99}))
    with pytest.raises(GraphampError, match="version 99"):
        Plan.load(path)


@pytest.mark.parametrize(
    ("op", "opset", "stash_type", "low"),
    [
        ("LayerNormalization", 17, None, True),
        ("LayerNormalization", 17, 1, True),
        ("LayerNormalization", 17, 0, False),
        ("RMSNormalization", 23, None, True),
        ("RMSNormalization", 23, 0, False),
    ],
)
def test_normalisations_run_low_where_their_statistics_stay_float32(op, opset, stash_type, low):
    """stash_type=1 (the default) accumulates mean and variance in float32 inside the kernel: the
    norm runs in float16 between the MatMuls with no Cast around it. stash_type=0 keeps the
    statistics in the input type: the norm stays float32 and says why."""
    attributes = {} if stash_type is None else {"stash_type": stash_type}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node(op, ["h", "gamma"], ["n"], name="norm", axis=-1, **attributes),
        helper.make_node("MatMul", ["n", "w2"], ["y"], name="mm2"),
    ]
    inits = [
        weight("w1"),
        weight("w2", seed=1),
        numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
    ]
    result = gonnx.convert(model(nodes, initializers=inits, opset=opset))
    decision = result.plan.nodes["norm"]
    casts = [n for n in result.to_proto().graph.node if n.op_type == "Cast"]
    if low:
        assert decision.precision == "float16" and decision.rule == "allow"
        assert casts == []  # the model's input and output change type too
    else:
        assert decision.precision == "float32" and decision.rule == "schema"
        assert "stash_type=0" in decision.reason
        assert sorted(c.input[0] for c in casts) == ["h", "n"]  # into it and out of it
