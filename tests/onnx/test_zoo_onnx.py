"""Every zoo model converts in both dtypes, is valid, runs, keeps its matrix work in low
precision under the default lists and stays within tolerance of float32."""

from __future__ import annotations

import onnx
import pytest

import graphamp.onnx as gonnx
from graphamp.numerics import verify
from tests.helpers import ZOO_NAMES, assert_no_redundant_casts, assert_valid

DTYPES = ("float16", "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_converts_validly_and_accurately(zoo_model, name, dtype):
    path = zoo_model(name)
    result = gonnx.convert(path, dtype=dtype)
    out = result.to_proto()
    assert_valid(out)
    assert_no_redundant_casts(out)

    matrix = {n: result.plan.nodes[n] for n in result.plan.matrix_nodes()}
    assert matrix, "the zoo model has matrix ops"
    assert all(d.precision == dtype for d in matrix.values()), {
        n: d.reason for n, d in matrix.items() if d.precision != dtype
    }

    original = onnx.load(str(path))
    feeds = verify.random_inputs(original, seed=3)
    report = verify.verify(original, out, feeds, rtol=verify.DEFAULT_RTOL[dtype])
    assert report.ok, [(o.name, o.max_rel_error, o.nan_inf) for o in report.outputs]
    for output in report.outputs:
        assert output.max_abs_error > 0, "the converted model computed in float32 throughout?"


@pytest.mark.parametrize("name", ["bert", "mnist"])
def test_conversion_is_deterministic(zoo_model, name):
    first = gonnx.convert(zoo_model(name)).to_proto().SerializeToString()
    second = gonnx.convert(zoo_model(name)).to_proto().SerializeToString()
    assert first == second
    plan_a = gonnx.convert(zoo_model(name)).plan.to_json()
    plan_b = gonnx.convert(zoo_model(name)).plan.to_json()
    assert plan_a == plan_b


@pytest.mark.parametrize("keep_io_types", [False, True])
@pytest.mark.parametrize("name", ["bert", "gpt", "mnist"])
def test_converting_a_converted_model_changes_nothing(zoo_model, name, keep_io_types):
    once = gonnx.convert(zoo_model(name), keep_io_types=keep_io_types).to_proto()
    twice = gonnx.convert(once, keep_io_types=keep_io_types)
    assert twice.to_proto().SerializeToString() == once.SerializeToString()
    summary = twice.plan.summary()
    assert summary["casts_inserted"] == 0 and summary["weights_converted"] == 0


def test_node_and_io_names_are_kept(zoo_model):
    original = onnx.load(str(zoo_model("bert")))
    out = gonnx.convert(original, keep_io_types=True).to_proto()
    assert [i.name for i in out.graph.input] == [i.name for i in original.graph.input]
    assert [o.name for o in out.graph.output] == [o.name for o in original.graph.output]
    names = {n.name for n in out.graph.node}
    assert {n.name for n in original.graph.node} <= names


def test_input_model_is_not_modified(zoo_model):
    original = onnx.load(str(zoo_model("mnist")))
    before = original.SerializeToString()
    gonnx.convert(original)
    assert original.SerializeToString() == before
