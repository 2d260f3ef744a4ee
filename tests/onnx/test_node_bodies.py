"""ONNX's own node test cases with If, Loop and Scan bodies (if*, loop*, scan*, sequence_map*,
and the function-expanded cases that hold them: affine_grid, linear_attention, range),
converted to float16 and bfloat16: a model the checker (full) accepts and onnxruntime loads
wherever it loads the original, a fixed point, and outputs within tolerance of the float32
model's under ``onnx.reference`` (which computes in the stored types)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx.backend.test.case.node import collect_testcases
from onnx.reference import ReferenceEvaluator

import graphamp.onnx as gonnx
from graphamp.models.onnx_cases import feeds_for, loads
from tests.onnx.node_cases import TOLERANCE, relative_error

_GRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def body_cases() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return [
        case
        for case in cases
        if any(a.type in _GRAPHS for node in case.model.graph.node for a in node.attribute)
        and not case.name.startswith("test_flexattention")  # FlexAttention's graphs: kept
    ]


CASES = body_cases()


def test_the_cases_are_there():
    names = {case.name for case in CASES}
    for prefix in ("test_if", "test_loop", "test_scan", "test_sequence_map", "test_affine_grid"):
        assert any(name.startswith(prefix) for name in names), prefix
    assert len(CASES) >= 40


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_node_case_with_bodies_converts_inside_them(case, dtype):
    original = case.model
    result = gonnx.convert(original, dtype=dtype)
    converted = result.to_proto()
    onnx.checker.check_model(converted, full_check=True)
    again = gonnx.convert(converted, dtype=dtype).to_proto()
    assert again.SerializeToString() == converted.SerializeToString(), "not a fixed point"
    if loads(original):
        assert loads(converted)
    # every body is entered (none kept whole): its nodes are decided, named by their path
    owners = [n.op_type for n in original.graph.node if any(a.type in _GRAPHS for a in n.attribute)]
    entered = {
        name: decision.op
        for name, decision in result.plan.nodes.items()
        if decision.rule == "control_flow" and decision.op in ("If", "Loop", "Scan", "SequenceMap")
    }
    if set(owners) <= {"If", "Loop", "Scan", "SequenceMap"}:  # (the case's names hold no "/")
        assert sorted(op for name, op in entered.items() if "/" not in name) == sorted(owners)
        for owner in entered:
            assert any(name.startswith(f"{owner}/") for name in result.plan.nodes)
    inputs = case.data_sets[0][0]
    try:
        want = ReferenceEvaluator(original).run(None, feeds_for(original, inputs))
    except Exception:  # the evaluator cannot run the original (Scan 8): converted only
        return
    got = ReferenceEvaluator(converted).run(None, feeds_for(converted, inputs))
    for a, b in zip(got, want, strict=True):
        if isinstance(b, np.ndarray) and b.dtype.kind == "f":
            assert relative_error(a, b) <= TOLERANCE[dtype]
        elif isinstance(b, list):
            for x, y in zip(a, b, strict=True):
                assert relative_error(x, y) <= TOLERANCE[dtype]
