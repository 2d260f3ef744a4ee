"""A model the runtime would refuse is never written: exit 3, one line, nothing in place; a
provider without a kernel for the low type is a warning, not a refusal."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import graphamp.onnx.dialect.writer as writer
from graphamp.cli import main
from graphamp.numerics.verify import random_inputs
from graphamp.onnx.dialect import schemas
from graphamp.onnx.numerics import runtime
from graphamp.onnx.numerics.session import Session
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


def _quantised_between_matmuls(opset: int) -> onnx.ModelProto:
    """MatMul -> QuantizeLinear -> DequantizeLinear -> MatMul, int8, at ``opset``."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) * 0.2, name)
        for name in ("w1", "w2")
    ]
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "scale")
    zero = helper.make_tensor("zero", TensorProto.INT8, [], [0])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("QuantizeLinear", ["a", "scale", "zero"], ["aq"], name="q"),
        helper.make_node("DequantizeLinear", ["aq", "scale", "zero"], ["adq"], name="dq"),
        helper.make_node("MatMul", ["adq", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        [*weights, scale, zero],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_verify_runs_the_model_as_written_not_only_its_emulation(tmp_path, monkeypatch, capsys):
    """--verify on a CPU compares the converted model's float32 emulation; a kernel that
    refuses the written types at run time (after the model loaded) must still fail it. The
    fixture is a real past bug: opset-23 QuantizeLinear fed float16 beside a float32 scale."""
    source, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_quantised_between_matmuls(23), str(source))
    assert main(["convert", str(source), "-o", str(out), "--verify"]) == 0
    monkeypatch.setattr(schemas, "runtime_bound", lambda found, *rest: found)  # the old reading
    schemas.schema.cache_clear()
    capsys.readouterr()
    assert main(["convert", str(source), "-o", str(out), "--verify"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fails to run it" in err[0] and "QuantizeLinear" in err[0], err


def test_a_model_an_onnxruntime_optimisation_fails_on_is_run_unoptimised(monkeypatch):
    """onnxruntime 1.31's default session refuses the BERT its own transformer optimizer
    writes ("Attempt to replace the existing tensor", in a graph optimisation) and loads it
    unoptimised: --verify, --calibrate and --fp8 then run it op by op, not exit 2. Here any
    optimised session fails, as that one does."""
    real = ort.InferenceSession

    def optimiser_fails(model, options=None, **kwargs):  # type: ignore[no-untyped-def]
        if options.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
            raise RuntimeError("Exception during initialization: Attempt to replace the tensor")
        return real(model, options, **kwargs)

    model = chain(["MatMul", "Relu", "MatMul"])
    feeds = random_inputs(model, seed=0)
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    monkeypatch.setattr(ort, "InferenceSession", optimiser_fails)
    outputs, _ = runtime.run(model, feeds)
    assert np.allclose(next(iter(outputs.values())), expected, rtol=1e-5, atol=1e-6)
    session = Session(model)  # calibration's and the tools' sessions
    assert np.allclose(next(iter(session.run(feeds).values())), expected, rtol=1e-5, atol=1e-6)
