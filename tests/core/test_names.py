"""One name generator for everything graphamp adds (graphamp/core/names.py): every node
and value name it adds is new in the whole model, subgraphs and functions included, on
models whose names were chosen by other converters (Keras names each node after its output),
and the output passes the full checker and loads in onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphamp import engine
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.policy.policy import Policy
from tests.helpers import keras_style, weight

F32 = TensorProto.FLOAT


def named_like_graphamp() -> onnx.ModelProto:
    """Nodes and values already named as graphamp names its casts (``x__float16``)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["x__float16"], name="y__float16"),
        helper.make_node("Relu", ["x__float16"], ["y"], name="x__float16"),
    ]
    return _model(nodes)


def with_subgraph_and_function() -> onnx.ModelProto:
    """An If whose branches, and a local function whose body, hold the names graphamp would
    give the main graph's Casts: they are names of the model too."""
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["x__float16"], name="y")],
        "then",
        [],
        [helper.make_tensor_value_info("x__float16", F32, [4, 4])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["h__float16"], name="x__float16")],
        "else",
        [],
        [helper.make_tensor_value_info("h__float16", F32, [4, 4])],
    )
    function = helper.make_function(
        "local",
        "Twice",
        ["a"],
        ["y__float16_1"],
        [helper.make_node("Add", ["a", "a"], ["y__float16_1"], name="y_1")],
        [helper.make_opsetid("", 17)],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="h"),
        helper.make_node("ReduceMax", ["h"], ["m"], name="m", keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["c"], name="c"),
        helper.make_node(
            "If", ["c"], ["b"], name="b", then_branch=then_branch, else_branch=else_branch
        ),
        helper.make_node("Twice", ["b"], ["t"], name="t", domain="local"),
        helper.make_node("Add", ["h", "t"], ["s"], name="s"),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="y"),
    ]
    model = _model(nodes, extra=[onnx.numpy_helper.from_array(np.float32(0), "zero")])
    model.functions.append(function)
    model.opset_import.append(helper.make_opsetid("local", 1))
    return model


def _model(nodes, extra=()) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, [4, 4])],
        [helper.make_tensor_value_info("y", F32, [4, 4])],
        [weight("w"), *extra],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def all_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(node names, value names) of every graph of ``model``, subgraphs and functions too."""
    nodes, values = [], []

    def walk(graph_nodes, inputs=()):  # type: ignore[no-untyped-def]
        values.extend(inputs)
        for node in graph_nodes:
            nodes.append(node.name)
            values.extend(o for o in node.output if o)
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.type == 5 else list(attribute.graphs):
                    walk(sub.node, [i.name for i in sub.input])

    graph = model.graph
    walk(graph.node, [i.name for i in graph.input] + [t.name for t in graph.initializer])
    return nodes, values


@pytest.mark.parametrize("build", [keras_style, named_like_graphamp, with_subgraph_and_function])
@pytest.mark.parametrize("keep_io_types", [True, False])
def test_every_added_name_is_new_in_the_whole_model(build, keep_io_types):
    source = build()
    policy = Policy.create("float16", keep_io_types=keep_io_types)
    proto = engine.convert(source, policy, dialect=OnnxDialect()).model
    onnx.checker.check_model(proto, full_check=True)
    # a name graphamp adds is new: a name given twice is one the model gave twice itself
    # (node names of different scopes may repeat in ONNX; value names may not)
    for added, given in zip(all_names(proto), all_names(source), strict=True):
        given_count = Counter(given)
        assert [n for n, c in Counter(added).items() if c > max(1, given_count[n])] == []
    originals = {f.name for f in source.functions}
    for function in proto.functions:  # the function, or its copy converted for a call site
        copy_of = function.name.rsplit("__", 1)[0]
        assert function in source.functions or copy_of in originals, function.name
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    low = session.get_inputs()[0].type == "tensor(float16)"
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float16 if low else np.float32)
    assert np.isfinite(session.run(None, {"x": x})[0]).all()
