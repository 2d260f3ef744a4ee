"""The casts pass: one Cast per (tensor, dtype), folded weights, clean-up of existing Casts."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import (
    assert_no_redundant_casts,
    assert_valid,
    casts_in,
    chain,
    convert,
    model,
    precisions,
    run,
    weight,
)


def feeds(seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((4, 4)).astype(np.float32)}


def test_one_cast_per_tensor_shared_by_all_consumers():
    # x (float32 input kept) feeds three MatMuls: one Cast, not three.
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)]
    proto = model(
        nodes, outputs=("y0", "y1", "y2"), initializers=[weight(f"w{i}", seed=i) for i in range(3)]
    )
    out, plan = convert(proto, keep_io_types=["x"])
    input_casts = [c for c in casts_in(out) if c.input[0] == "x"]
    assert len(input_casts) == 1
    assert sorted(plan.casts[0].consumers) == ["mm0", "mm1", "mm2"]
    assert_valid(out)


def test_boundary_cast_inserted_once_between_low_and_float32():
    out, plan = convert(chain(["MatMul", "Exp", "Log"]))
    assert [c.dst for c in plan.casts] == ["float32"]
    assert len(casts_in(out)) == 1
    assert_valid(out)
    assert_no_redundant_casts(out)
    assert np.isfinite(run(out, feeds())[0]).all()


def test_weights_are_converted_in_place_not_cast():
    out, plan = convert(chain(["MatMul", "Relu", "MatMul"]))
    assert not casts_in(out)  # x is retyped (keep_io_types off), weights stored as float16
    types = {i.name: i.data_type for i in out.graph.initializer}
    assert types == {"w0": TensorProto.FLOAT16, "w2": TensorProto.FLOAT16}
    assert all(w.in_place for w in plan.weights)
    assert plan.summary()["weight_bytes_saved"] == 2 * 16 * 2


def test_weight_used_in_both_precisions_is_stored_once_per_precision():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "w"], ["a"], name="add"),  # kept float32 by a name rule
        helper.make_node("Exp", ["a"], ["y"], name="exp"),
    ]
    out, plan = convert(model(nodes, initializers=[weight("w")]), deny_names=["add"])
    assert precisions(plan)["mm"] == "float16" and precisions(plan)["add"] == "float32"
    by_name = {i.name: i.data_type for i in out.graph.initializer}
    assert by_name == {"w": TensorProto.FLOAT, "w__float16": TensorProto.FLOAT16}
    mm = next(n for n in out.graph.node if n.name == "mm")
    assert list(mm.input) == ["x", "w__float16"]
    assert_valid(out)


def test_overflowing_weight_is_never_clamped():
    big = numpy_helper.from_array(np.full((4, 4), 1e5, np.float32), "w0")
    proto = chain(["MatMul", "Relu"])
    proto.graph.initializer[0].CopyFrom(big)
    out, plan = convert(proto)
    assert plan.nodes["matmul0"].precision == "float32"
    assert plan.nodes["matmul0"].rule == "weight_range"
    assert "100000" in plan.nodes["matmul0"].reason
    stored = {i.name: i.data_type for i in out.graph.initializer}
    assert stored["w0"] == TensorProto.FLOAT
    (kept,) = plan.kept_weights
    assert (kept.name, kept.src, kept.dst, kept.out_of_range) == ("w0", "float32", "float32", 16)
    assert kept.consumers == ["matmul0"]
    assert plan.summary()["weights_kept_out_of_range"] == 1
    # bfloat16 has float32's range: the same weight converts.
    _, plan16 = convert(proto, dtype="bfloat16")
    assert plan16.nodes["matmul0"].precision == "bfloat16"


def test_flushed_values_are_counted():
    values = np.full((4, 4), 0.5, np.float32)
    values[0, :3] = 1e-9  # below float16's smallest subnormal: becomes 0
    proto = chain(["MatMul", "Relu"])
    proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(values, "w0"))
    _, plan = convert(proto)
    assert plan.weights[0].flushed_to_zero == 3
    assert plan.summary()["values_flushed_to_zero"] == 3


def test_existing_cast_to_float32_is_retargeted():
    # TF ExistingCast: Cast(bool -> float) feeding a MatMul becomes Cast(bool -> half).
    nodes = [
        helper.make_node("Cast", ["mask"], ["maskf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["maskf", "w"], ["y"], name="mm"),
    ]
    proto = model(
        nodes, inputs=("mask",), initializers=[weight("w")], input_types={"mask": TensorProto.BOOL}
    )
    out, plan = convert(proto)
    assert plan.casts_retargeted == {"cast": "float16"}
    (cast,) = casts_in(out)
    assert cast.attribute[0].i == TensorProto.FLOAT16
    assert_valid(out)


def test_existing_cast_to_the_same_type_is_removed():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["c"], name="noop", to=TensorProto.FLOAT),
        helper.make_node("Exp", ["c"], ["y"], name="exp"),
    ]
    out, plan = convert(model(nodes))
    assert plan.casts_removed == ["noop"]
    assert not casts_in(out)
    assert_valid(out)


def test_no_cast_of_a_widening_cast():
    # x16 -> Cast(float32) -> MatMul(low): the MatMul reads x16, the widening Cast goes.
    nodes = [
        helper.make_node("Cast", ["x"], ["x32"], name="widen", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x32", "w"], ["y"], name="mm"),
    ]
    proto = model(nodes, initializers=[weight("w")], input_types={"x": TensorProto.FLOAT16})
    out, plan = convert(proto)
    # Retargeted to float16, the Cast would turn float16 into float16: it is removed.
    assert plan.casts_removed == ["widen"]
    assert not casts_in(out)
    mm = next(n for n in out.graph.node if n.name == "mm")
    assert mm.input[0] == "x"
    assert_valid(out)


def test_keep_io_types_casts_back_under_the_original_name():
    out, _ = convert(chain(["MatMul", "Relu", "MatMul"]), keep_io_types=True)
    assert [o.name for o in out.graph.output] == ["y"]
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert len(casts_in(out)) == 2  # x -> float16, y back to float32
    assert_valid(out)
    y = run(out, feeds())[0]
    assert y.dtype == np.float32


def test_keep_io_types_by_name():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        helper.make_node("MatMul", ["y", "w"], ["z"], name="mm2"),
    ]
    proto = model(nodes, outputs=("y", "z"), initializers=[weight("w")])
    out, _ = convert(proto, keep_io_types=["z"])
    types = {o.name: o.type.tensor_type.elem_type for o in out.graph.output}
    assert types == {"y": TensorProto.FLOAT16, "z": TensorProto.FLOAT}
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert_valid(out)


def test_resize_scales_stay_float32_while_resize_runs_low():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], name="resize", mode="nearest"),
        helper.make_node("Conv", ["r", "w"], ["y"], name="conv2"),
    ]
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32), "w"
    )
    out, plan = convert(model(nodes, initializers=[w, scales], shape=(1, 2, 4, 4)))
    assert precisions(plan)["resize"] == "float16"
    stored = {i.name: i.data_type for i in out.graph.initializer}
    assert stored["scales"] == TensorProto.FLOAT
    assert_valid(out)


def test_widening_cast_kept_for_float32_readers_while_low_readers_skip_it():
    nodes = [
        helper.make_node("Cast", ["x"], ["x32"], name="widen", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x32", "w"], ["m"], name="mm"),
        helper.make_node("Exp", ["x32"], ["e"], name="exp"),
    ]
    proto = model(
        nodes,
        outputs=("m", "e"),
        initializers=[weight("w")],
        input_types={"x": TensorProto.FLOAT16},
    )
    out, plan = convert(proto)
    assert not plan.casts  # the MatMul reads x itself: no Cast back to float16
    mm = next(n for n in out.graph.node if n.name == "mm")
    assert mm.input[0] == "x"
    assert [c.name for c in casts_in(out)] == ["widen"]
    assert_no_redundant_casts(out)
    assert_valid(out)


def test_ops_that_accept_any_type_get_no_cast():
    # Shape reads its input through a type variable bound nowhere else: float16 is as good as
    # float32 for it, so the low MatMul output needs no Cast back for Shape.
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Shape", ["m"], ["s"], name="shape"),
        helper.make_node("Reshape", ["m", "s"], ["y"], name="reshape"),
    ]
    out, plan = convert(model(nodes, initializers=[weight("w")]))
    assert not plan.casts
    assert not casts_in(out)
    assert_valid(out)


def test_shape_and_size_read_a_low_tensor_at_an_old_opset_with_no_cast():
    # Before opset 13 Shape's and Size's type variable admits float16 but not bfloat16; a
    # float16 tensor they read needs no Cast (the float32 Relu reader still gets one).
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Shape", ["m"], ["s"], name="shape"),
        helper.make_node("Size", ["m"], ["n"], name="size"),
        helper.make_node("Exp", ["m"], ["y"], name="exp"),
    ]
    proto = model(
        nodes,
        outputs=("y", "s", "n"),
        initializers=[weight("w")],
        opset=12,
        output_types={"s": TensorProto.INT64, "n": TensorProto.INT64},
    )
    proto.ir_version = 7
    out, plan = convert(proto)
    shape_readers = {
        n.op_type: n.input[0] for n in out.graph.node if n.op_type in ("Shape", "Size")
    }
    assert shape_readers == {"Shape": "m", "Size": "m"}
    assert [(c.tensor, c.consumers) for c in plan.casts] == [("m", ["exp"])]
    assert_valid(out)
    got = run(out, feeds())
    assert list(got[1]) == [4, 4] and int(got[2]) == 16
