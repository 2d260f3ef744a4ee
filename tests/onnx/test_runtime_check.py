"""A model the runtime would refuse is never written: exit 3, one line, nothing in place; a
provider without a kernel for the low type is a warning, not a refusal."""

from __future__ import annotations

import onnx

import graphamp.onnx.dialect.writer as writer
from graphamp.cli import main
from tests.helpers import chain


def test_an_output_onnxruntime_refuses_is_exit_3_and_nothing_written(tmp_path, monkeypatch, capsys):
    source, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(source))
    apply = writer.apply

    def broken(read, script):  # type: ignore[no-untyped-def]
        model = apply(read, script)
        first = next(node for node in model.graph.node if node.op_type == "MatMul")
        for info in model.graph.value_info:
            if info.name == first.output[0]:  # declared double, computed float16
                info.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
        return model

    monkeypatch.setattr(writer, "apply", broken)
    assert main(["convert", str(source), "-o", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "onnxruntime refuses the converted model" in err[0], err
    assert not out.exists() and not list(tmp_path.glob(".out.onnx*"))
    assert main(["convert", str(source), "-o", str(out), "--no-runtime-check"]) == 0


def test_bfloat16_without_a_cpu_kernel_is_a_warning(tmp_path, capsys):
    source, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(source))
    assert main(["convert", str(source), "-o", str(out), "--dtype", "bfloat16"]) == 0
    assert "CPU provider has no kernel" in capsys.readouterr().err
    assert out.exists()
