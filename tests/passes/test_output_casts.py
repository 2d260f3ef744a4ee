"""One Cast per (tensor, dtype), graph outputs included: a kept float16 output that a float32
op also reads is cast back once, and both read that Cast."""

from __future__ import annotations

from onnx import helper

from tests.helpers import (
    assert_no_redundant_casts,
    assert_valid,
    casts_in,
    convert,
    model,
    run,
    weight,
)


def test_a_kept_output_read_by_a_float32_op_is_cast_once():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Exp", ["h"], ["y"], name="exp"),  # float32 (deny), reads h
    ]
    proto = model(nodes, outputs=("h", "y"), initializers=[weight("w")])
    out, plan = convert(proto, keep_io_types=True)
    assert_valid(out)
    assert_no_redundant_casts(out)
    from_h = [n for n in casts_in(out) if n.input[0].startswith("h")]
    assert len(from_h) == 1, [(n.input, n.output) for n in casts_in(out)]
    (record,) = plan.output_casts
    assert record.output == "h" and record.consumers == ["exp"]
    assert not [c for c in plan.casts if c.tensor == "h"]
    exp = next(n for n in out.graph.node if n.name == "exp")
    assert exp.input[0] == "h", "the float32 reader reads the cast-back output"
    import numpy as np

    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    assert all(np.isfinite(value).all() for value in run(out, {"x": x}))
    again, _ = convert(out, keep_io_types=True)
    assert again.SerializeToString() == out.SerializeToString()
