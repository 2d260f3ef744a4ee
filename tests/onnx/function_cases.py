"""ONNX's node test cases of ops that ONNX defines by a function, rebuilt with that function as
a model-local function the node calls (domain ``graphamp.test``): function bodies nobody here
wrote, for the tests of :mod:`graphamp.onnx.dialect.functions`."""

from __future__ import annotations

import warnings

import onnx
from onnx import helper
from onnx.backend.test.case.node import collect_testcases

DOMAIN = "graphamp.test"


def _function(node: onnx.NodeProto, model: onnx.ModelProto) -> onnx.FunctionProto | None:
    """The function ONNX defines ``node``'s op by at the model's opset, if any."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
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


def as_local_function(case) -> onnx.ModelProto | None:  # type: ignore[no-untyped-def]
    """``case``'s model with its one node calling its op's function as a model-local one."""
    model = case.model
    if len(model.graph.node) != 1 or model.graph.node[0].domain not in ("", "ai.onnx"):
        return None
    node = model.graph.node[0]
    function = _function(node, model)
    if function is None or not function.node:
        return None
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    if len(node.output) > len(function.output):
        return None
    function.domain = DOMAIN
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
    call.domain = DOMAIN
    given = {a.name for a in call.attribute}
    for name, attribute in schema.attributes.items():  # the defaults the body refers to
        if name not in given and attribute.default_value.name:
            call.attribute.append(attribute.default_value)
    rebuilt = onnx.ModelProto()
    rebuilt.CopyFrom(model)
    del rebuilt.graph.node[:]
    rebuilt.graph.node.append(call)
    rebuilt.functions.append(function)
    rebuilt.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    rebuilt.ir_version = max(rebuilt.ir_version, 8)
    return rebuilt


def function_cases() -> list[tuple[str, onnx.ModelProto, object]]:
    """(name, model, the case) for every case whose op has a function body and float input."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    found = []
    for case in cases:
        if case.name.endswith("_expanded") or "_expanded_ver" in case.name:
            continue
        floats = any(
            i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for i in case.model.graph.input
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
