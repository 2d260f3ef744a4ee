"""Damaged and hostile model files: one line naming the problem, exit status 2, nothing
written, and nothing read outside the model's folder."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.helpers import assert_user_error, chain, model, weight

F32 = onnx.TensorProto.FLOAT


def save_bytes(path, data: bytes) -> str:  # type: ignore[no-untyped-def]
    path.write_bytes(data)
    return str(path)


def converted(cli, tmp_path, proto_or_path) -> tuple[object, object]:  # type: ignore[no-untyped-def]
    source = proto_or_path
    if isinstance(proto_or_path, onnx.ModelProto):
        source = tmp_path / "in.onnx"
        source.write_bytes(proto_or_path.SerializeToString())
    out = tmp_path / "out.onnx"
    return cli("convert", str(source), "-o", str(out)), out


def structural_cases() -> dict[str, tuple[onnx.ModelProto, str]]:
    dangling = chain(["MatMul", "Relu"])
    dangling.graph.node[1].input[0] = "nowhere"
    cycle = model(
        [
            helper.make_node("Relu", ["b"], ["a"], name="first"),
            helper.make_node("Relu", ["a"], ["b"], name="second"),
            helper.make_node("Relu", ["x"], ["y"], name="third"),
        ]
    )
    own = model([helper.make_node("Add", ["x", "y"], ["y"], name="loop")])
    no_opset = chain(["MatMul"])
    del no_opset.opset_import[:]
    ir_zero = chain(["MatMul"])
    ir_zero.ir_version = 0
    domain = chain(["MatMul", "Relu"])
    domain.graph.node[1].domain = "com.example"
    untyped = chain(["MatMul", "Softmax"])
    untyped.graph.node[1].attribute.add(name="axis")  # no type
    short = chain(["MatMul"])
    short.graph.initializer[0].raw_data = short.graph.initializer[0].raw_data[:10]
    strings = model(
        [helper.make_node("MatMul", ["s", "w"], ["y"], name="mm")],
        inputs=("s",),
        input_types={"s": onnx.TensorProto.STRING},
        initializers=[weight("w")],
    )
    unnamed = chain(["MatMul", "Relu"])
    unnamed.graph.node[1].input[0] = "nowhere"
    unnamed.graph.node[1].name = ""
    int_weight = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        initializers=[numpy_helper.from_array(np.arange(16, dtype=np.int32).reshape(4, 4), "w")],
    )
    return {
        "dangling input": (dangling, "node 'relu1' reads 'nowhere', which no node produces"),
        "unnamed node": (unnamed, "the unnamed Relu node writing 'y' reads 'nowhere'"),
        # (found where the graph is read, which holds no path: the file is named all the same)
        "int32 weight": (int_weight, "in.onnx: node 'mm' (MatMul): input 'w' is int32 but 'x'"),
        "two-node cycle": (cycle, "the graph has a cycle: first -> second -> first"),
        "reads its own output": (own, "node 'loop' reads its own output 'y'"),
        "no opset_import": (no_opset, "imports no opset"),
        "ir_version 0": (ir_zero, "ir_version 0 is not an ONNX IR version"),
        "domain not imported": (domain, "domain 'com.example', which the model does not import"),
        "attribute without a type": (untyped, "attribute 'axis' has no type"),
        "raw_data too short": (short, "raw_data holds 10 bytes; dims [4, 4] of FLOAT need 64"),
        "string into MatMul": (strings, "in.onnx: node 'mm' (MatMul): input 0 's' is string"),
    }


@pytest.mark.parametrize("case", sorted(structural_cases()))
def test_damaged_graphs_are_refused_in_one_line(cli, tmp_path, case):
    proto, message = structural_cases()[case]
    result, out = converted(cli, tmp_path, proto)
    assert_user_error(result, message)
    assert not out.exists()


def external_model(tmp_path, location: str):  # type: ignore[no-untyped-def]
    proto = chain(["MatMul", "Relu"])
    tensor = proto.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    tensor.external_data.add(key="offset", value="0")
    tensor.external_data.add(key="length", value="64")
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


def test_external_data_missing_outside_or_behind_a_symlink_is_refused(cli, tmp_path):
    result, out = converted(cli, tmp_path, external_model(tmp_path, "weights.bin"))
    assert_user_error(result, "external data file 'weights.bin' is missing")
    result, out = converted(cli, tmp_path, external_model(tmp_path, "../../etc/passwd"))
    assert_user_error(result, "'../../etc/passwd' points outside the model's folder")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.ones(16, np.float32).tobytes())
    os.symlink(secret, tmp_path / "model" / "link.bin")
    result, out = converted(cli, tmp_path, external_model(tmp_path, "link.bin"))
    assert_user_error(result, "'link.bin' points outside the model's folder")
    (tmp_path / "model" / "small.bin").write_bytes(b"\0" * 8)
    result, out = converted(cli, tmp_path, external_model(tmp_path, "small.bin"))
    assert_user_error(result, "'small.bin' is 8 bytes; the tensor needs bytes 0 to 64")
    assert not out.exists()


@pytest.mark.parametrize("field", ["producer", "tensor"])
def test_a_name_that_is_not_utf8_is_refused(cli, tmp_path, field):
    proto = chain(["MatMul", "Relu"])
    proto.producer_name = "PRODUCERX"
    proto.graph.node[0].output[0] = proto.graph.node[1].input[0] = "TENSORXXX"
    placeholder = {"producer": b"PRODUCERX", "tensor": b"TENSORXXX"}[field]
    data = proto.SerializeToString().replace(placeholder, b"\xff\xfe" + placeholder[2:])
    result, out = converted(cli, tmp_path, save_bytes(tmp_path / "bad.onnx", data))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "not valid UTF-8" in result.stderr
    assert not out.exists()


def test_valid_external_data_inside_the_folder_still_converts(cli, tmp_path):
    path = external_model(tmp_path, "weights.bin")
    values = numpy_helper.to_array(chain(["MatMul", "Relu"]).graph.initializer[0])
    (tmp_path / "model" / "weights.bin").write_bytes(values.astype(np.float32).tobytes())
    result, out = converted(cli, tmp_path, path)
    assert result.returncode == 0, result.stderr
    assert out.exists()
