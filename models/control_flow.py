"""Small ONNX models with control flow, built in code with random weights, each beside the same
computation unrolled into a flat graph (what graphamp converts as if the body were inline).

* ``if_softmax``: an If whose branches each do MatMul + Softmax (with different weights);
* ``loop_rnn``: a Loop carrying a hidden state through MatMul + Add + Tanh for 8 iterations,
  every state also a scan output;
* ``scan_rnn``: a Scan over 8 inputs, its state through MatMul + MatMul + Add + Tanh;
* ``if_in_loop``: a Loop of 8 iterations whose body holds an If (even iterations Tanh, odd
  ones Relu, each after a MatMul).

Each builder returns a :class:`Case`: the model, its unrolled twin (same inputs and outputs)
and feeds. Nothing here needs torch.

    >>> from graphamp.models.control_flow import CASES
    >>> case = CASES["loop_rnn"]()
    >>> sorted(case.feeds)
    ['h0']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
STEPS = 8
WIDTH = 32
OPSET = 22


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    unrolled: onnx.ModelProto | list[onnx.ModelProto]  # an If: one flat graph per branch
    feeds: list[dict[str, np.ndarray]]  # an If: one set per branch, in branch order


def _weight(name: str, seed: int, shape: tuple[int, ...] = (WIDTH, WIDTH)) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(shape[0])
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    name: str,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def _info(name: str, shape: list[int | str] | None, elem: int = F32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


LOOP_INPUTS = [_info("i", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL)]


def _constant(name: str, value: int) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [], [value])
    )


def _true(name: str) -> onnx.NodeProto:
    # (onnx.reference runs no iteration of a Loop whose condition input is left out)
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name, TensorProto.BOOL, [], [True])
    )


def if_softmax() -> Case:
    weights = [_weight("w_then", 1), _weight("w_else", 2)]

    def branch(tag: str, weight: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("MatMul", ["x", weight], [f"{tag}_scores"], name=f"{tag}_matmul"),
            helper.make_node("Softmax", [f"{tag}_scores"], [f"{tag}_y"], name=f"{tag}_softmax"),
        ]

    bodies = {
        tag: helper.make_graph(branch(tag, weight), tag, [], [_info(f"{tag}_y", [4, WIDTH])])
        for tag, weight in (("then", "w_then"), ("else", "w_else"))
    }
    x, y = _info("x", [4, WIDTH]), _info("y", [4, WIDTH])
    node = helper.make_node(
        "If", ["cond"], ["y"], name="if", then_branch=bodies["then"], else_branch=bodies["else"]
    )
    model = _model([node], [x, _info("cond", [], TensorProto.BOOL)], [y], weights, "if_softmax")
    flat = []
    for tag, weight in (("then", "w_then"), ("else", "w_else")):
        nodes = branch(tag, weight)
        nodes[-1].output[0] = "y"
        flat.append(_model(nodes, [x], [y], [w for w in weights if w.name == weight], tag))
    rng = np.random.default_rng(0)
    value = rng.standard_normal((4, WIDTH)).astype(np.float32) * 4
    feeds = [{"x": value, "cond": np.array(cond)} for cond in (True, False)]
    return Case("if_softmax", model, flat, feeds)


def _rnn_step(h: str, out: str, tag: str) -> list[onnx.NodeProto]:
    return [
        helper.make_node("MatMul", [h, "w"], [f"{tag}_mm"], name=f"{tag}_matmul"),
        helper.make_node("Add", [f"{tag}_mm", "b"], [f"{tag}_pre"], name=f"{tag}_add"),
        helper.make_node("Tanh", [f"{tag}_pre"], [out], name=f"{tag}_tanh"),
    ]


def loop_rnn() -> Case:
    weights = [_weight("w", 3), _weight("b", 4, (1, WIDTH))]
    body = helper.make_graph(
        [
            *_rnn_step("h_in", "h_out", "step"),
            helper.make_node("Identity", ["h_out"], ["h_scan"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [*LOOP_INPUTS, _info("h_in", [1, WIDTH])],
        [
            _info("cond_out", [], TensorProto.BOOL),
            _info("h_out", [1, WIDTH]),
            _info("h_scan", [1, WIDTH]),
        ],
    )
    outputs = [_info("h", [1, WIDTH]), _info("hs", [STEPS, 1, WIDTH])]
    nodes = [
        _constant("steps", STEPS),
        _true("go"),
        helper.make_node("Loop", ["steps", "go", "h0"], ["h", "hs"], name="loop", body=body),
    ]
    model = _model(nodes, [_info("h0", [1, WIDTH])], outputs, weights, "loop_rnn")
    flat, previous = [], "h0"
    for step in range(STEPS):
        out = "h" if step == STEPS - 1 else f"h{step + 1}"
        flat += _rnn_step(previous, out, f"step{step}")
        previous = out
    states = ["h" if s == STEPS - 1 else f"h{s + 1}" for s in range(STEPS)]
    flat.append(helper.make_node("Concat", states, ["hs_flat"], axis=0))
    flat.append(
        helper.make_node(
            "Constant",
            [],
            ["hs_shape"],
            value=numpy_helper.from_array(np.array([STEPS, 1, WIDTH], np.int64), "hs_shape"),
        )
    )
    flat.append(helper.make_node("Reshape", ["hs_flat", "hs_shape"], ["hs"]))
    unrolled = _model(flat, [_info("h0", [1, WIDTH])], outputs, weights, "loop_rnn_unrolled")
    h0 = np.random.default_rng(5).standard_normal((1, WIDTH)).astype(np.float32)
    return Case("loop_rnn", model, unrolled, [{"h0": h0}])


def scan_rnn() -> Case:
    weights = [_weight("wx", 6), _weight("wh", 7)]

    def step(x: str, h: str, out: str, tag: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("MatMul", [x, "wx"], [f"{tag}_xw"], name=f"{tag}_input"),
            helper.make_node("MatMul", [h, "wh"], [f"{tag}_hw"], name=f"{tag}_recurrent"),
            helper.make_node("Add", [f"{tag}_xw", f"{tag}_hw"], [f"{tag}_pre"], name=f"{tag}_add"),
            helper.make_node("Tanh", [f"{tag}_pre"], [out], name=f"{tag}_tanh"),
        ]

    body = helper.make_graph(
        [*step("x_t", "h_in", "h_out", "step"), helper.make_node("Identity", ["h_out"], ["y_t"])],
        "body",
        [_info("h_in", [1, WIDTH]), _info("x_t", [1, WIDTH])],
        [_info("h_out", [1, WIDTH]), _info("y_t", [1, WIDTH])],
    )
    inputs = [_info("h0", [1, WIDTH]), _info("xs", [STEPS, 1, WIDTH])]
    outputs = [_info("h", [1, WIDTH]), _info("ys", [STEPS, 1, WIDTH])]
    node = helper.make_node(
        "Scan", ["h0", "xs"], ["h", "ys"], name="scan", body=body, num_scan_inputs=1
    )
    model = _model([node], inputs, outputs, weights, "scan_rnn")
    flat, previous, states = [], "h0", []
    for index in range(STEPS):
        flat.append(_constant(f"index{index}", index))
        flat.append(helper.make_node("Gather", ["xs", f"index{index}"], [f"x{index}"], axis=0))
        out = "h" if index == STEPS - 1 else f"h{index + 1}"
        flat += step(f"x{index}", previous, out, f"step{index}")
        flat.append(helper.make_node("Unsqueeze", [out, "axis0"], [f"y{index}"]))
        states.append(f"y{index}")
        previous = out
    flat.insert(0, helper.make_node("Constant", [], ["axis0"], value_ints=[0]))
    flat.append(helper.make_node("Concat", states, ["ys"], axis=0))
    unrolled = _model(flat, inputs, outputs, weights, "scan_rnn_unrolled")
    rng = np.random.default_rng(8)
    feeds = {
        "h0": rng.standard_normal((1, WIDTH)).astype(np.float32),
        "xs": rng.standard_normal((STEPS, 1, WIDTH)).astype(np.float32),
    }
    return Case("scan_rnn", model, unrolled, [feeds])


def if_in_loop() -> Case:
    weights = [_weight("w_even", 9), _weight("w_odd", 10)]

    def branch(h: str, out: str, tag: str, op: str, weight: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("MatMul", [h, weight], [f"{tag}_mm"], name=f"{tag}_matmul"),
            helper.make_node(op, [f"{tag}_mm"], [out], name=f"{tag}_{op.lower()}"),
        ]

    then_body = helper.make_graph(
        branch("h_in", "even_h", "even", "Tanh", "w_even"), "then", [], [_info("even_h", None)]
    )
    else_body = helper.make_graph(
        branch("h_in", "odd_h", "odd", "Relu", "w_odd"), "else", [], [_info("odd_h", None)]
    )
    body = helper.make_graph(
        [
            _constant("two", 2),
            _constant("zero", 0),
            helper.make_node("Mod", ["i", "two"], ["parity"]),
            helper.make_node("Equal", ["parity", "zero"], ["even"]),
            helper.make_node(
                "If",
                ["even"],
                ["h_out"],
                name="alternate",
                then_branch=then_body,
                else_branch=else_body,
            ),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [*LOOP_INPUTS, _info("h_in", [1, WIDTH])],
        [_info("cond_out", [], TensorProto.BOOL), _info("h_out", [1, WIDTH])],
    )
    nodes = [
        _constant("steps", STEPS),
        _true("go"),
        helper.make_node("Loop", ["steps", "go", "h0"], ["h"], name="loop", body=body),
    ]
    io = ([_info("h0", [1, WIDTH])], [_info("h", [1, WIDTH])])
    model = _model(nodes, *io, weights, "if_in_loop")
    flat, previous = [], "h0"
    for index in range(STEPS):
        out = "h" if index == STEPS - 1 else f"h{index + 1}"
        even = index % 2 == 0
        op, weight = ("Tanh", "w_even") if even else ("Relu", "w_odd")
        flat += branch(previous, out, f"step{index}", op, weight)
        previous = out
    unrolled = _model(flat, *io, weights, "if_in_loop_unrolled")
    h0 = np.random.default_rng(11).standard_normal((1, WIDTH)).astype(np.float32)
    return Case("if_in_loop", model, unrolled, [{"h0": h0}])


CASES: dict[str, Callable[[], Case]] = {
    "if_softmax": if_softmax,
    "loop_rnn": loop_rnn,
    "scan_rnn": scan_rnn,
    "if_in_loop": if_in_loop,
}
