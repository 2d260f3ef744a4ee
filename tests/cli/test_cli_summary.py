"""What convert says to its caller: the graph inputs and outputs whose type changed
(and --keep-io-types), the weight bytes kept float32 and why, and "nothing converted" meaning
the input's own bytes; converting a graphamp output again changes no byte."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphamp.cli import main
from tests.helpers import chain, conv_net, embedding_model, keras_style, model


def convert(capsys, tmp_path, proto, *flags: str) -> str:  # type: ignore[no-untyped-def]
    source = tmp_path / "m.onnx"
    onnx.save(proto, str(source))
    assert main(["convert", str(source), "-o", str(tmp_path / "out.onnx"), *flags]) == 0
    return " ".join(capsys.readouterr().out.split())  # the table's line breaks undone


def test_inputs_and_outputs_whose_type_changed_are_named(capsys, tmp_path):
    printed = convert(capsys, tmp_path, chain(["MatMul", "Relu", "MatMul"]))
    assert "graph inputs/outputs whose type changed: x float32 -> float16, y float32" in printed
    assert "--keep-io-types" in printed
    assert "whose type changed" not in convert(
        capsys, tmp_path, chain(["MatMul", "Relu", "MatMul"]), "--keep-io-types"
    )
    # only the input: the output stays float32 behind a deny-list op
    printed = convert(capsys, tmp_path, chain(["MatMul", "Exp"]))
    assert "type changed: x float32 -> float16: feed" in printed


def test_weight_bytes_kept_float32_are_counted_with_the_reason(capsys, tmp_path):
    printed = convert(capsys, tmp_path, embedding_model(), "--spread", "tensorflow")
    assert "weights kept float32 │ 1 (64.0 KiB)" in printed
    assert "read by a float32 node (rule clear) │ 1 (64.0 KiB)" in printed
    assert "largest: 'table' (embed, read by a float32 node" in printed
    # every weight converted: no such row
    assert "kept float32" not in convert(capsys, tmp_path, chain(["MatMul", "Relu", "MatMul"]))


def test_nothing_converted_writes_the_inputs_own_bytes(capsys, tmp_path):
    """A float16 model whose own value_info leaves dims out: rewriting it would add inferred
    ones; nothing converted means the input file."""
    proto = model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        initializers=[numpy_helper.from_array(np.ones((4, 4), np.float16), "w")],
        input_types={"x": TensorProto.FLOAT16},
        output_types={"y": TensorProto.FLOAT16},
    )
    proto.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 4
    proto.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 4
    proto.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.FLOAT16, None))
    source = tmp_path / "m.onnx"
    onnx.save(proto, str(source))
    assert main(["convert", str(source), "-o", str(tmp_path / "out.onnx")]) == 0
    assert "nothing converted" in capsys.readouterr().err
    assert (tmp_path / "out.onnx").read_bytes() == source.read_bytes()


@pytest.mark.parametrize(
    ("build", "flags"),
    [
        (lambda: chain(["MatMul", "Relu", "MatMul", "Exp"]), ()),
        (lambda: chain(["MatMul", "Softmax", "MatMul"]), ("--keep-io-types",)),
        (keras_style, ("--keep-io-types",)),
        (conv_net, ()),
        (conv_net, ("--dtype", "bfloat16", "--keep-io-types")),
        (embedding_model, ()),
    ],
)
def test_converting_a_graphamp_output_again_changes_no_byte(tmp_path, build, flags):
    source, once, twice = (tmp_path / name for name in ("m.onnx", "once.onnx", "twice.onnx"))
    onnx.save(build(), str(source))
    assert main(["convert", str(source), "-o", str(once), *flags]) == 0
    assert main(["convert", str(once), "-o", str(twice), *flags]) == 0
    assert twice.read_bytes() == once.read_bytes()


def test_nothing_converted_names_the_rules_that_kept_the_ops_float32(capsys, tmp_path):
    """'no node runs in float16 under this policy' blamed the policy where the model was the
    cause (Conv below opset 22 admits no bfloat16, deny-list ops): the deciding rules first,
    the infer and clear ops that followed them after."""
    proto = chain(["Exp", "Relu", "Log"])  # deny, clear, deny
    source = tmp_path / "m.onnx"
    onnx.save(proto, str(source))
    assert main(["convert", str(source), "-o", str(tmp_path / "out.onnx")]) == 0
    assert (
        "nothing converted: no node runs in float16; its float32 ops by rule: deny 2, "
        "deny_spread 1 (the plan gives each reason)"
    ) in " ".join(capsys.readouterr().err.split())


def test_matrix_ops_already_in_another_low_type_are_counted_as_low(capsys, tmp_path):
    """A float16 model converted with --dtype bfloat16 printed 'in low precision 0 of 2'
    while both products run float16."""
    source, once = tmp_path / "m.onnx", tmp_path / "once.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(source))
    assert main(["convert", str(source), "-o", str(once)]) == 0
    capsys.readouterr()
    assert main(["convert", str(once), "-o", str(tmp_path / "b.onnx"), "--dtype", "bfloat16"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "MatMul/Gemm" in line)
    assert "0 of 2, 2 already float16" in row
