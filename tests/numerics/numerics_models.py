"""Small ONNX models with planted float16 faults, and data for them (never zeros)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT


def _weight(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    values = (rng.standard_normal(shape) * scale).astype(np.float32)
    values[values == 0] = scale
    return values


def _model(nodes, weights: dict[str, np.ndarray], width: int, outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "planted",
        [helper.make_tensor_value_info("x", F32, [4, width])],
        [helper.make_tensor_value_info(name, F32, None) for name in outputs],
        [numpy_helper.from_array(values, name) for name, values in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    return model


def batches(count: int = 3, width: int = 16, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": _weight(rng, (4, width), 1.0)} for _ in range(count)]


def overflowing_hidden_layer() -> onnx.ModelProto:
    """x -> hidden (MatMul, |h| ~ 2e5: inf in float16) -> relu -> down (back to ~50) -> y, plus
    a healthy branch x -> side -> y."""
    rng = np.random.default_rng(0)
    weights = {
        "W1": _weight(rng, (16, 16), 2e4),
        "W2": _weight(rng, (16, 8), 1e-4),
        "W3": _weight(rng, (16, 8), 0.3),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="hidden"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["a"], name="down"),
        helper.make_node("MatMul", ["x", "W3"], ["b"], name="side"),
        helper.make_node("Add", ["a", "b"], ["y"], name="sum"),
    ]
    return _model(nodes, weights, 16)


HEALTHY = ("healthy_mm", "healthy_relu", "healthy_out")


def cancellation_beside_a_healthy_branch() -> onnx.ModelProto:
    """Two values near 3000 (float16's spacing there: 2) that differ by ~0.1 are subtracted
    (``cancel``); a healthy branch (``HEALTHY``) is added to the result."""
    rng = np.random.default_rng(0)
    w1 = _weight(rng, (16, 16), 0.5)
    weights = {
        "W1": w1,
        "W2": (w1 + _weight(rng, (16, 16), 0.01)).astype(np.float32),
        "C": np.full((16,), 3000.0, np.float32),
        "W3": _weight(rng, (16, 8), 1.0),
        "W4": _weight(rng, (16, 16), 0.3),
        "W5": _weight(rng, (16, 8), 0.3),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["p"], name="p_mm"),
        helper.make_node("Add", ["p", "C"], ["u"], name="u_add"),
        helper.make_node("MatMul", ["x", "W2"], ["q"], name="q_mm"),
        helper.make_node("Add", ["q", "C"], ["v"], name="v_add"),
        helper.make_node("Sub", ["u", "v"], ["d"], name="cancel"),
        helper.make_node("MatMul", ["d", "W3"], ["a"], name="a_mm"),
        helper.make_node("MatMul", ["x", "W4"], ["h"], name="healthy_mm"),
        helper.make_node("Relu", ["h"], ["hr"], name="healthy_relu"),
        helper.make_node("MatMul", ["hr", "W5"], ["b"], name="healthy_out"),
        helper.make_node("Add", ["a", "b"], ["y"], name="sum"),
    ]
    return _model(nodes, weights, 16)


def softmax_over_large_logits(scale: float = 1.0, offset: float = 2000.0) -> onnx.ModelProto:
    """logits = x @ W + ``offset`` (|x @ W| ~ 4 * ``scale``) -> Softmax -> @ V. With the
    defaults the logits fit float16 but its spacing at 2000 (1.0) moves the probabilities; at
    ``scale`` 1e4 the logits overflow it."""
    rng = np.random.default_rng(0)
    weights = {
        "W": _weight(rng, (16, 16), scale),
        "C": np.full((16,), offset, np.float32),
        "V": _weight(rng, (16, 8), 0.5),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["z"], name="logits"),
        helper.make_node("Add", ["z", "C"], ["shifted"], name="shift"),
        helper.make_node("Softmax", ["shifted"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "V"], ["y"], name="mix"),
    ]
    return _model(nodes, weights, 16)


def ratio_of_tiny_values() -> onnx.ModelProto:
    """h = x @ W0; a = h * 1e-8 and b = (|h| + 1) * 1e-8 flush to zero in float16, and a / b
    (within (-1, 1) in float32) is 0 / 0 = NaN: no value overflows, yet the model breaks."""
    rng = np.random.default_rng(0)
    weights = {
        "tiny": np.full((16,), 1e-8, np.float32),
        "one": np.ones((16,), np.float32),
        "W0": _weight(rng, (16, 16), 0.5),
        "W": _weight(rng, (16, 8), 0.5),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h"], name="embed"),
        helper.make_node("Mul", ["h", "tiny"], ["a"], name="scale_a"),
        helper.make_node("Abs", ["h"], ["m"], name="magnitude"),
        helper.make_node("Add", ["m", "one"], ["m1"], name="plus_one"),
        helper.make_node("Mul", ["m1", "tiny"], ["b"], name="scale_b"),
        helper.make_node("Div", ["a", "b"], ["r"], name="ratio"),
        helper.make_node("MatMul", ["r", "W"], ["y"], name="project"),
    ]
    return _model(nodes, weights, 16)


VAD_WINDOW = 512  # samples per call at 16 kHz (32 ms)
VAD_STATE = 128


def voice_activity() -> onnx.ModelProto:
    """A voice-activity detector shaped like silero VAD: ``input`` [batch, 512] samples, ``sr``
    a scalar int64 sample rate and ``state`` [2, batch, 128] (the batch on axis 1) carried from
    call to call; ``output`` [batch, 1] and ``stateN``. The window is cut into frames of
    ``sr / 125`` samples (128 at 16 kHz) by a Reshape, so a sample rate that is not one the
    model knows (random ids from 1 to 15) makes the float32 model itself fail in onnxruntime."""
    rng = np.random.default_rng(0)
    frames = VAD_WINDOW // 128
    weights = {
        "per_frame": np.array(125, np.int64),
        "leading": np.array([-1, frames], np.int64),
        "state_index": np.array(0, np.int64),
        "carry_index": np.array(1, np.int64),
        "zero_axis": np.array([0], np.int64),
        "frame_axis": np.array([1], np.int64),
        "W_in": _weight(rng, (128, VAD_STATE), 0.2),
        "W_state": _weight(rng, (VAD_STATE, VAD_STATE), 0.2),
        "W_out": _weight(rng, (VAD_STATE, 1), 0.2),
    }
    nodes = [
        helper.make_node("Div", ["sr", "per_frame"], ["frame"], name="frame_size"),
        helper.make_node("Unsqueeze", ["frame", "zero_axis"], ["frame_1d"], name="frame_1d"),
        helper.make_node("Concat", ["leading", "frame_1d"], ["shape"], name="shape", axis=0),
        helper.make_node("Reshape", ["input", "shape"], ["framed"], name="frames"),
        helper.make_node("ReduceMean", ["framed", "frame_axis"], ["mean"], keepdims=0),
        helper.make_node("MatMul", ["mean", "W_in"], ["seen"], name="encode"),
        helper.make_node("Gather", ["state", "state_index"], ["h"], name="hidden", axis=0),
        helper.make_node("MatMul", ["h", "W_state"], ["recalled"], name="recall"),
        helper.make_node("Add", ["seen", "recalled"], ["mixed"], name="mix"),
        helper.make_node("Tanh", ["mixed"], ["h_next"], name="update"),
        helper.make_node("Gather", ["state", "carry_index"], ["c"], name="carried", axis=0),
        helper.make_node("Unsqueeze", ["h_next", "zero_axis"], ["h_row"], name="h_row"),
        helper.make_node("Unsqueeze", ["c", "zero_axis"], ["c_row"], name="c_row"),
        helper.make_node("Concat", ["h_row", "c_row"], ["stateN"], name="new_state", axis=0),
        helper.make_node("MatMul", ["h_next", "W_out"], ["logit"], name="score"),
        helper.make_node("Sigmoid", ["logit"], ["output"], name="probability"),
    ]
    graph = helper.make_graph(
        nodes,
        "voice_activity",
        [
            helper.make_tensor_value_info("input", F32, ["batch", VAD_WINDOW]),
            helper.make_tensor_value_info("state", F32, [2, "batch", VAD_STATE]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("output", F32, ["batch", 1]),
            helper.make_tensor_value_info("stateN", F32, [2, "batch", VAD_STATE]),
        ],
        [numpy_helper.from_array(values, name) for name, values in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    return model


def voice_activity_inputs(batch: int = 1, seed: int = 1) -> dict[str, np.ndarray]:
    """Real-looking inputs for :func:`voice_activity`: 16 kHz samples, a 0-d sample rate and
    a small state with the batch on axis 1."""
    rng = np.random.default_rng(seed)
    return {
        "input": _weight(rng, (batch, VAD_WINDOW), 0.3),
        "state": _weight(rng, (2, batch, VAD_STATE), 0.1),
        "sr": np.array(16000, np.int64),
    }
