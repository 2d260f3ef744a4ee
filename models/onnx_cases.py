"""ONNX's node test cases (``onnx.backend.test``) as the tests and the benchmarks feed them: each
case's inputs in the types its model declares, whether onnxruntime loads a model, and the cases
of ops that ONNX defines by a function rebuilt with that function as a model-local function the
node calls (domain ``graphamp.test``): function bodies nobody here wrote."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.case.test_case import TestCase

from graphamp.core import dtypes

FUNCTION_DOMAIN = "graphamp.test"


class _FunctionSchema(Protocol):
    """The accessors of a schema's function bodies, which onnx's stubs leave out."""

    function_opset_versions: list[int]
    context_dependent_function_opset_versions: list[int]

    def get_function_with_opset_version(self, version: int) -> bytes: ...

    def get_context_dependent_function_with_opset_version(
        self, version: int, node: bytes, input_types: list[bytes]
    ) -> bytes: ...


def feeds_for(proto: onnx.ModelProto, inputs: Sequence[object]) -> dict[str, object]:
    """The case's inputs in each input's declared type (sequences and optionals as given)."""
    feeds: dict[str, object] = {}
    for info, value in zip(proto.graph.input, inputs, strict=False):
        if info.type.HasField("tensor_type"):
            name = dtypes.from_onnx(info.type.tensor_type.elem_type)
            if isinstance(value, onnx.TensorProto):
                value = numpy_helper.to_array(value)
            array = np.asarray(value)
            if name in dtypes.FLOAT_TYPES and array.dtype.kind == "f":
                array = array.astype(dtypes.numpy_type(name))
            value = array
        feeds[info.name] = value
    return feeds


def loads(proto: onnx.ModelProto) -> bool:
    """Whether onnxruntime's CPU provider loads ``proto``, or rejects it only for want of a
    kernel in a low type (valid: it runs where such a kernel exists)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        return True
    except Exception:
        return False
    return True


def _function(node: onnx.NodeProto, model: onnx.ModelProto) -> onnx.FunctionProto | None:
    """The function ONNX defines ``node``'s op by at the model's opset, if any."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    try:
        schema = cast(_FunctionSchema, onnx.defs.get_schema(node.op_type, opset, ""))
    except onnx.defs.SchemaError:
        return None
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if versions:
        body = schema.get_function_with_opset_version(max(versions))
    else:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if not versions:
            return None
        types = {i.name: i.type for i in model.graph.input}
        body = schema.get_context_dependent_function_with_opset_version(
            max(versions),
            node.SerializeToString(),
            [types[name].SerializeToString() for name in node.input if name in types],
        )
    function = onnx.FunctionProto()
    function.ParseFromString(body)
    return function


def as_local_function(case: TestCase) -> onnx.ModelProto | None:
    """``case``'s model with its one node calling its op's function as a model-local one."""
    model = case.model
    if model is None or len(model.graph.node) != 1:
        return None
    if model.graph.node[0].domain not in ("", "ai.onnx"):
        return None
    node = model.graph.node[0]
    function = _function(node, model)
    if function is None or not function.node:
        return None
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    if len(node.output) > len(function.output):
        return None
    function.domain = FUNCTION_DOMAIN
    function.name = node.op_type
    # a body written for one node (a context-dependent one) may leave outputs unproduced
    produced = {out for inner in function.node for out in inner.output}
    while function.output and function.output[-1] not in produced:
        if len(node.output) >= len(function.output) and node.output[len(function.output) - 1]:
            return None  # the node reads an output the body does not make
        function.output.pop()
    if any(out not in produced and out not in function.input for out in function.output):
        return None
    # the function is read at the model's opset (as a model-local function must be)
    for entry in function.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    call = onnx.NodeProto()
    call.CopyFrom(node)
    call.domain = FUNCTION_DOMAIN
    given = {a.name for a in call.attribute}
    for name, attribute in schema.attributes.items():  # the defaults the body refers to
        if name not in given and attribute.default_value.name:
            call.attribute.append(attribute.default_value)
    rebuilt = onnx.ModelProto()
    rebuilt.CopyFrom(model)
    del rebuilt.graph.node[:]
    rebuilt.graph.node.append(call)
    rebuilt.functions.append(function)
    rebuilt.opset_import.append(helper.make_opsetid(FUNCTION_DOMAIN, 1))
    rebuilt.ir_version = max(rebuilt.ir_version, 8)
    return rebuilt


def function_cases() -> list[tuple[str, onnx.ModelProto, TestCase]]:
    """(name, model, the case) for every case whose op has a function body and float input."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    found: list[tuple[str, onnx.ModelProto, TestCase]] = []
    for case in cases:
        if case.name.endswith("_expanded") or "_expanded_ver" in case.name:
            continue
        floats = any(
            i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
            for i in (case.model.graph.input if case.model is not None else ())
        )
        if not floats:
            continue
        try:
            rebuilt = as_local_function(case)
        except Exception:  # a schema whose function cannot be built for these inputs
            rebuilt = None
        if rebuilt is not None:
            found.append((case.name, rebuilt, case))
    return found
