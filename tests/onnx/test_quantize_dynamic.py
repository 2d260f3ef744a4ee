"""Models onnxruntime's ``quantize_dynamic`` writes (MatMulInteger / ConvInteger between
DynamicQuantizeLinear nodes, an int32 accumulator cast to float and scaled; DynamicQuantizeLSTM;
at opset 10 the zero point computed in float and floored), converted to float16: the
accumulator's Cast keeps writing float32 and its readers read float32 (rule integer_range),
float arithmetic used as an integer stays float32 (rule integer_valued), and the task-level
outputs (argmax) equal the float32 quantized model's under the faithful evaluator (graphamp's
emulation on onnxruntime, which runs the contrib ops; onnx.reference, which computes float16
in float16, where it has every op), with no inf or NaN."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import graphamp.onnx as gonnx
from graphamp.numerics.verify import random_inputs
from graphamp.onnx.numerics.runtime import run
from tests.helpers import assert_valid

ZOO = ("simplenet", "mnist", "resnet", "bert", "gpt")


def _quantize(source: Path, target: Path, **options: object) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8, **options)
    return onnx.load(str(target))


def _export(module: object, inputs: tuple[object, ...], path: Path, opset: int) -> Path:
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, str(path), dynamo=False, opset_version=opset)
    return path


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """quantized(name) -> the model quantize_dynamic writes of zoo model ``name`` (or of
    ``lstm``: an LSTM with a Linear head, only the LSTM quantized; ``simplenet-opset10``:
    the zoo's MLP exported at opset 10, where the quantizer computes zero points in float)."""
    folder = tmp_path_factory.mktemp("dynamic")
    built: dict[str, onnx.ModelProto] = {}

    def get(name: str) -> onnx.ModelProto:
        if name in built:
            return built[name]
        import torch

        from graphamp.models import build, export_onnx

        target = folder / f"{name}.dynamic.onnx"
        if name == "lstm":
            torch.manual_seed(0)
            module = _LstmTagger().eval()
            source = _export(module, (torch.randn(2, 7, 16),), folder / "lstm.onnx", 17)
            built[name] = _quantize(source, target, op_types_to_quantize=["LSTM"])
        elif name == "simplenet-opset10":
            module, inputs = build("simplenet")
            source = _export(module, inputs, folder / f"{name}.onnx", 10)
            built[name] = _quantize(source, target)
        else:
            built[name] = _quantize(export_onnx(name, folder / f"{name}.onnx"), target)
        return built[name]

    return get


class _LstmTagger:
    """An LSTM over 16-wide steps and a 5-class Linear head per step (built lazily: torch)."""

    def __new__(cls):  # type: ignore[no-untyped-def]
        import torch

        class Tagger(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = torch.nn.LSTM(16, 32, batch_first=True)
                self.head = torch.nn.Linear(32, 5)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.head(self.lstm(x)[0])

        return Tagger()


def _faithful(original: onnx.ModelProto, converted: onnx.ModelProto, seed: int = 1):
    """(the float32 quantized model's outputs, the converted model's under the emulation)."""
    feeds = random_inputs(original, seed=seed)
    expected, _ = run(original, feeds)
    actual, evaluator = run(converted, feeds)
    return expected, actual, evaluator


def _reference(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``proto``'s outputs under onnx.reference (each op in its own types), fed ``feeds`` in
    the types its inputs declare."""
    types = {
        i.name: helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in proto.graph.input
    }
    return ReferenceEvaluator(proto).run(None, {k: v.astype(types[k]) for k, v in feeds.items()})


def _converted(original: onnx.ModelProto, **policy: object):  # type: ignore[no-untyped-def]
    """(the converted model, checked valid, and its plan's decisions)."""
    result = gonnx.convert(original, **policy)
    converted = result.to_proto()
    assert_valid(converted)
    return converted, result.plan.nodes


def _accumulator_casts(proto: onnx.ModelProto) -> list[str]:
    producer = {out: node for node in proto.graph.node for out in node.output}
    return [
        node.name
        for node in proto.graph.node
        if node.op_type == "Cast"
        and node.input[0] in producer
        and producer[node.input[0]].op_type in ("MatMulInteger", "ConvInteger")
    ]


@pytest.mark.parametrize("name", ZOO)
def test_a_dynamically_quantized_zoo_model_keeps_its_answers(quantized, name):
    original = quantized(name)
    result = gonnx.convert(original)
    converted = result.to_proto()
    assert_valid(converted)
    nodes = result.plan.nodes
    casts = _accumulator_casts(original)
    assert casts
    for cast in casts:  # the int32 accumulator stays float32, and so does what reads it
        assert nodes[cast].rule == "integer_range", cast
        assert cast not in result.plan.casts_retargeted
    readers = [
        n for n, d in nodes.items() if d.rule == "integer_range" and d.precision == "float32"
    ]
    assert len(readers) >= len(casts)
    assert all(nodes[r].op == "Mul" for r in readers)  # the scale, then an ordinary value
    expected, actual, _ = _faithful(original, converted)
    for output, value in actual.items():
        value = value.astype(np.float64)
        assert np.isfinite(value).all(), output
        if output in ("hidden_states", "pooled"):  # no classes: every value close
            np.testing.assert_allclose(value, expected[output], atol=0.05, rtol=0.05)
        else:  # each answer float32 gives by more than the error could move: the same
            top2 = np.sort(expected[output], axis=-1)[..., -2:]
            clear = top2[..., 1] - top2[..., 0] > 2 * np.abs(value - expected[output]).max()
            assert clear.mean() > 0.5, output  # (random weights: a few near ties)
            np.testing.assert_array_equal(
                value.argmax(-1)[clear], expected[output].argmax(-1)[clear]
            )


def test_transformers_quantized_dynamically_still_compute_low(quantized):
    """The attention's activation products (no weights: left float by quantize_dynamic) and
    the float ops after each scaled accumulator still run float16: only what must, stays."""
    result = gonnx.convert(quantized("gpt"))
    low = [d for d in result.plan.nodes.values() if d.precision == "float16"]
    assert [d for d in low if d.op == "MatMul"]
    _, _, evaluator = _faithful(quantized("gpt"), result.to_proto())
    assert "float16 rounding emulated" in evaluator


def test_the_float_head_after_a_quantized_lstm_runs_low_and_agrees(quantized):
    original = quantized("lstm")
    assert "DynamicQuantizeLSTM" in {n.op_type for n in original.graph.node}
    converted, decisions = _converted(original)
    assert any(d.op == "MatMul" and d.precision == "float16" for d in decisions.values())
    lstm = next(d for d in decisions.values() if d.op.endswith("DynamicQuantizeLSTM"))
    assert lstm.precision == "float32"
    for seed in (1, 2, 3):
        expected, actual, evaluator = _faithful(original, converted, seed)
        assert "float16 rounding emulated" in evaluator  # DynamicQuantizeLSTM: onnxruntime's
        (output,) = actual
        assert np.isfinite(actual[output]).all()
        np.testing.assert_array_equal(actual[output].argmax(-1), expected[output].argmax(-1))


def test_the_zero_points_quantize_dynamic_floors_at_opset_10_stay_float32(quantized):
    """At opset 10 the quantizer computes each zero point as Floor((0 - min) / scale) cast to
    uint8 (no DynamicQuantizeLinear): that arithmetic is held float32 (rule integer_valued),
    and onnx.reference, computing the converted model in its own types, agrees."""
    original = quantized("simplenet-opset10")
    assert "Floor" in {n.op_type for n in original.graph.node}
    converted, nodes = _converted(original)
    producer = {out: node for node in original.graph.node for out in node.output}
    for floor in (n for n in original.graph.node if n.op_type == "Floor"):
        divide = producer[floor.input[0]]
        assert nodes[divide.name].rule == "integer_valued", divide.name
        assert f"Floor {floor.name!r}" in nodes[divide.name].reason
    feeds = random_inputs(original, seed=1)
    (expected,) = _reference(original, feeds)
    (actual,) = _reference(converted, feeds)
    np.testing.assert_array_equal(actual.argmax(-1), expected.argmax(-1))
    assert np.isfinite(actual).all()


def _requantising_model() -> onnx.ModelProto:
    """A float layer whose bias is also requantised for an integer one, as a quantised OCR
    model does it: Floor(bias / (input_scale x weight_scale)) cast to int32 and added to an
    int32 accumulator. The cost spread would store the shared bias once, in float16, and
    compute the quotient (up to 13,000 here) in float16, which holds every 8th integer there."""
    rng = np.random.default_rng(0)
    bias = (rng.standard_normal(64) * 2.0).astype(np.float32)
    weights = (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="float_layer"),
        helper.make_node("Add", ["h", "bias"], ["y"], name="float_bias"),
        helper.make_node("Mul", ["input_scale", "weight_scale"], ["scales"], name="scales"),
        helper.make_node("Div", ["bias", "scales"], ["quotient"], name="requantise"),
        helper.make_node("Floor", ["quotient"], ["floored"], name="floor"),
        helper.make_node("Cast", ["floored"], ["bias_int"], name="to_int", to=TensorProto.INT32),
        helper.make_node("Add", ["acc", "bias_int"], ["acc_biased"], name="int_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "requantise",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("acc", TensorProto.INT32, [1, 64]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64]),
            helper.make_tensor_value_info("acc_biased", TensorProto.INT32, [1, 64]),
        ],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(bias, "bias"),
            numpy_helper.from_array(np.array(0.0173, np.float32), "input_scale"),
            numpy_helper.from_array(np.array(0.0087, np.float32), "weight_scale"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    return proto


@pytest.mark.parametrize("spread", ["cost", "tensorflow"])
def test_requantisation_arithmetic_stays_exact(spread):
    original = _requantising_model()
    converted, nodes = _converted(original, spread=spread)
    assert nodes["float_layer"].precision == "float16"
    for name in ("scales", "requantise"):
        assert nodes[name].rule == "integer_valued" and nodes[name].precision == "float32"
    feeds = random_inputs(original, seed=1)
    expected, actual = _reference(original, feeds), _reference(converted, feeds)
    assert np.abs(expected[1]).max() > 2048  # integers float16 cannot all hold
    np.testing.assert_array_equal(actual[1], expected[1])
