"""isolated: an allow-list norm whose low region holds nothing else that gains from the low
type goes back to float32 with that region."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import graphamp.onnx as gonnx
from tests.helpers import convert, model, run, weight


def _norm_between(before: str, after: str, transposes: bool = False) -> onnx.ModelProto:
    """x -> before -> [Transpose] -> LayerNormalization -> [Transpose] -> after -> y."""
    nodes, value = [], "x"
    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, 4, dtype=np.float32), "gamma")]

    def add(op: str, inputs: list[str], name: str, **attributes: object) -> None:
        nonlocal value
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attributes))
        value = name

    if before == "MatMul":
        inits.append(weight("w"))
        add("MatMul", [value, "w"], "before")
    else:
        add(before, [value], "before")
    if transposes:
        add("Transpose", [value], "t_in", perm=[1, 0])
    add("LayerNormalization", [value, "gamma"], "norm", axis=-1)
    if transposes:
        add("Transpose", [value], "t_out", perm=[1, 0])
    nodes.append(helper.make_node(after, [value], ["y"], name="after"))
    return model(nodes, initializers=inits)


def test_a_norm_between_float32_ops_stays_float32_with_no_cast():
    """Low, the norm would need a Cast on each side and round what no neighbour rounds."""
    proto = _norm_between("Cos", "Sin")  # unlisted ops (float32) on both sides
    converted, plan = convert(proto, keep_io_types=True)
    norm = plan.nodes["norm"]
    assert (norm.precision, norm.rule) == ("float32", "isolated")
    assert "nothing around it runs low" in norm.reason
    assert plan.summary()["casts_inserted"] == 0
    x = {"x": np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)}
    assert np.array_equal(run(converted, x)[0], run(proto, x)[0])


def test_its_low_region_goes_back_to_float32_with_it():
    """The cost model lowers a Transpose on each side, moving the Casts outward: the island is
    the three ops, and all three go back, each with its own rule."""
    proto = _norm_between("Cos", "Sin", transposes=True)
    plan = gonnx.convert(proto, keep_io_types=True).plan
    assert plan.nodes["norm"].rule == "isolated"
    for name in ("t_in", "t_out"):
        decision = plan.nodes[name]
        assert (decision.precision, decision.rule) == ("float32", "clear"), name
        assert "between isolated norms ('norm')" in decision.reason
    assert plan.summary()["casts_inserted"] == 0


def test_a_norm_beside_a_low_matrix_product_stays_low():
    plan = gonnx.convert(_norm_between("MatMul", "Sin"), keep_io_types=True).plan
    assert (plan.nodes["before"].precision, plan.nodes["norm"].precision) == (
        "float16",
        "float16",
    )
    assert plan.nodes["norm"].rule == "allow"


def test_allow_names_and_graph_io_keep_a_norm_low():
    """An --allow-name match is the user's word; a norm reading a graph input may have the
    input retyped instead of cast."""
    named = gonnx.convert(_norm_between("Cos", "Sin"), allow_names=["norm"]).plan
    assert named.nodes["norm"].precision == "float16"
    proto = _norm_between("Cos", "Sin")
    proto.graph.node[1].input[0] = "x"  # the norm reads the graph input
    assert gonnx.convert(proto).plan.nodes["norm"].precision == "float16"


def test_a_norm_the_user_moved_into_allow_stays_low():
    """allow=["LayerNormalization"] (or an op moved from deny) is the user's word, as an
    allow_names match is."""
    plan = gonnx.convert(_norm_between("Cos", "Sin"), allow=["LayerNormalization"]).plan
    assert (plan.nodes["norm"].precision, plan.nodes["norm"].rule) == ("float16", "allow")


def test_a_graph_output_kept_float32_is_no_reason_to_stay_low():
    """A graph output keep_io_types keeps float32 is cast like any float32 neighbour: only
    one it leaves free may be retyped instead."""
    proto = _norm_between("Cos", "Sin", transposes=True)
    proto.graph.node.pop()  # the Sin: the last Transpose writes the graph output
    proto.graph.node[-1].output[0] = "y"
    kept = gonnx.convert(proto, keep_io_types=True).plan
    assert kept.nodes["norm"].rule == "isolated" and kept.summary()["casts_inserted"] == 0
    free = gonnx.convert(proto).plan
    assert free.nodes["norm"].precision == "float16"
