"""Seeded random ONNX graphs and policies for the fuzz harness (tools/fuzz/fuzz.py).

Every value has shape (2, 8), so any op can read any earlier value; an op that needs another
shape reshapes in and out (Conv, LSTM, GRU, Resize). About 75 op patterns: unary and binary
float ops, matrix products, reductions, normalisations, data movement (Transpose, Split,
Slice, Gather, Squeeze), integer side paths (Shape -> Reshape), constants, recurrent ops, and
the model's own Casts (a float16 or bfloat16 round trip, a float16 island, a float64 island, a
Cast to the type a value has, a trip through int32). The opset is drawn from 13 to 22, so
bfloat16 meets ops whose schema does not admit it yet (Conv, LSTM before 22), and each op is
written in its form at that opset (Reduce axes as attribute or input, Split sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

SHAPE = (2, 8)
T = onnx.TensorProto
OPSETS = (13, 14, 15, 17, 18, 19, 20, 21, 22, 22, 22)  # 22 (bfloat16 everywhere) most often
IR_VERSION = {13: 7, 14: 7, 15: 8, 17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10}
UNARY = [
    "Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Softplus", "Elu", "Selu", "LeakyRelu",
    "HardSigmoid", "Erf", "Sin", "Cos", "Floor", "Ceil", "Round", "Softsign", "Mish",
    "HardSwish", "Identity", "ThresholdedRelu", "Celu", "Sign", "Gelu", "Sqrt", "Log",
    "Reciprocal", "Softmax", "LogSoftmax", "Hardmax", "CumSum", "Clip", "LayerNormalization",
    "Transpose2", "Dropout",
]  # fmt: skip
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow", "Where", "PRelu"]
MATRIX = ["MatMul", "Gemm", "ConcatMatMul", "Einsum", "Conv1x1"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp",
          "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceLogSum"]  # fmt: skip
SHAPES = ["SplitConcat", "SliceConcat", "GatherPermute", "UnsqueezeSqueeze", "ShapeReshape",
          "TopK", "Resize", "BatchNormalization", "ConstantAdd", "Sum3"]  # fmt: skip
RECURRENT = ["LSTM", "GRU", "RNN"]
CASTS = ["CastTrip16", "CastTripBF16", "CastIsland16", "CastIsland64", "CastSame", "CastInt"]
OPS = UNARY + BINARY + MATRIX + REDUCE + SHAPES + RECURRENT + CASTS
# The first opset at which the pattern can be written as it is here.
SINCE = {"Mish": 18, "Gelu": 20, "HardSwish": 14, "LayerNormalization": 17}
# Ops whose output jumps where a low-precision input crosses a rounding boundary, and a trip
# through int32: graphs with them are held to the structural properties only.
DISCONTINUOUS = {"Round", "Floor", "Ceil", "Sign", "Hardmax", "CastInt", "TopK"}


@dataclass
class Case:
    model: onnx.ModelProto
    policy: dict[str, object]


class _Builder:
    """Nodes and initializers of one graph, names numbered as they are made."""

    def __init__(self, rng: np.random.Generator, opset: int) -> None:
        self.rng, self.opset = rng, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, shape: tuple[int, ...], scale: float = 0.3) -> str:
        name = f"w{len(self.inits)}"
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        array[array == 0] = 0.1
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def const(self, value: object, dtype: type = np.int64) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def add(
        self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs: object
    ) -> None:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))


def random_case(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    opset = int(rng.choice(OPSETS))
    build = _Builder(rng, opset)
    values = ["x0", "x1"]
    ops = [op for op in OPS if SINCE.get(op, 13) <= opset]
    # discontinuous ops a quarter as often: most graphs are then held to accuracy too
    weights = np.array([0.25 if op in DISCONTINUOUS else 1.0 for op in ops])
    for index in range(int(rng.integers(3, 14))):
        op = str(rng.choice(ops, p=weights / weights.sum()))
        a, b = (str(rng.choice(values)) for _ in range(2))
        out, name = f"v{index}", f"n{index}_{op.lower()}"
        _emit(build, op, a, b, out, name)
        values.append(out)
    outputs = sorted(set(rng.choice(values[2:], size=min(2, len(values) - 2), replace=False)))
    graph = helper.make_graph(
        build.nodes,
        f"fuzz{seed}",
        [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in ("x0", "x1")],
        [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in outputs],
        build.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION[opset]
    return Case(model, random_policy(rng, build.nodes, values, outputs))


def _emit(build: _Builder, op: str, a: str, b: str, out: str, name: str) -> None:
    for table in (_ELEMENTWISE, _STRUCTURAL, _CAST_PATTERNS):
        if op in table:
            table[op](build, a, b, out, name)
            return
    if op in REDUCE:
        _reduce(build, op, a, out, name)
    elif op in RECURRENT:
        _recurrent(build, op, a, out, name)
    elif op in BINARY:
        build.add(op, [a, b], [out], name)
    else:
        build.add(op, [a], [out], name)


def _positive(build: _Builder, source: str, out: str, name: str) -> str:
    """|source| + 1: no zero, no negative."""
    build.add("Abs", [source], [f"{out}_abs"], f"{name}_abs")
    build.add("Add", [f"{out}_abs", build.const(1.0, np.float32)], [f"{out}_pos"], f"{name}_pos")
    return f"{out}_pos"


Pattern = Callable[[_Builder, str, str, str, str], None]
_ELEMENTWISE: dict[str, Pattern] = {
    "Sqrt": lambda s, a, b, o, n: s.add("Sqrt", [_positive(s, a, o, n)], [o], n),
    "Log": lambda s, a, b, o, n: s.add("Log", [_positive(s, a, o, n)], [o], n),
    "Reciprocal": lambda s, a, b, o, n: s.add("Reciprocal", [_positive(s, a, o, n)], [o], n),
    "Div": lambda s, a, b, o, n: s.add("Div", [a, _positive(s, b, o, n)], [o], n),
    "Softmax": lambda s, a, b, o, n: s.add("Softmax", [a], [o], n, axis=-1),
    "LogSoftmax": lambda s, a, b, o, n: s.add("LogSoftmax", [a], [o], n, axis=-1),
    "Hardmax": lambda s, a, b, o, n: s.add("Hardmax", [a], [o], n, axis=-1),
    "CumSum": lambda s, a, b, o, n: s.add("CumSum", [a, s.const(1)], [o], n),
    "Clip": lambda s, a, b, o, n: s.add(
        "Clip", [a, s.const(-1.0, np.float32), s.const(1.0, np.float32)], [o], n
    ),
    "LayerNormalization": lambda s, a, b, o, n: s.add(
        "LayerNormalization", [a, s.weight((8,), 1.0), s.weight((8,))], [o], n, axis=-1
    ),
    "PRelu": lambda s, a, b, o, n: s.add("PRelu", [a, s.weight((8,))], [o], n),
    "Sum3": lambda s, a, b, o, n: s.add("Sum", [a, b, a], [o], n),
    "ConstantAdd": lambda s, a, b, o, n: (
        s.add(
            "Constant",
            [],
            [f"{o}_k"],
            f"{n}_k",
            value=numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "k"),
        ),
        s.add("Add", [a, f"{o}_k"], [o], n),
    ),
}


def _pow(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Abs", [a], [f"{o}_abs"], f"{n}_abs")
    s.add("Pow", [f"{o}_abs", s.const(2.0, np.float32)], [o], n)


def _where(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Greater", [a, b], [f"{o}_gt"], f"{n}_gt")
    s.add("Where", [f"{o}_gt", a, b], [o], n)


_ELEMENTWISE.update({"Pow": _pow, "Where": _where})


def _matmul(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("MatMul", [a, s.weight((8, 8))], [o], n)


def _gemm(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Gemm", [a, s.weight((8, 8)), s.weight((8,))], [o], n, transB=1)


def _concat_matmul(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Concat", [a, b], [f"{o}_cat"], f"{n}_cat", axis=1)
    s.add("MatMul", [f"{o}_cat", s.weight((16, 8))], [o], n)


def _einsum(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Einsum", [a, s.weight((8, 8))], [o], n, equation="ij,jk->ik")


def _conv(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    """(2, 8) as a batch of 2 images of 8 channels, 1x1: a 1x1 convolution, and back."""
    s.add("Reshape", [a, s.const([2, 8, 1, 1])], [f"{o}_4d"], f"{n}_in")
    s.add("Conv", [f"{o}_4d", s.weight((8, 8, 1, 1)), s.weight((8,))], [f"{o}_c"], n)
    s.add("Reshape", [f"{o}_c", s.const(list(SHAPE))], [o], f"{n}_out")


def _transpose2(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Transpose", [a], [f"{o}_t"], f"{n}_t", perm=[1, 0])
    s.add("Transpose", [f"{o}_t"], [o], n, perm=[1, 0])


def _split_concat(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Split", [a, s.const([3, 5])], [f"{o}_s0", f"{o}_s1"], f"{n}_split", axis=1)
    s.add("Concat", [f"{o}_s1", f"{o}_s0"], [o], n, axis=1)


def _slice_concat(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Slice", [a, s.const([0]), s.const([4]), s.const([1])], [f"{o}_l"], f"{n}_l")
    s.add("Slice", [b, s.const([4]), s.const([8]), s.const([1])], [f"{o}_r"], f"{n}_r")
    s.add("Concat", [f"{o}_l", f"{o}_r"], [o], n, axis=1)


def _gather(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Gather", [a, s.const([7, 0, 6, 1, 5, 2, 4, 3])], [o], n, axis=1)


def _unsqueeze_squeeze(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Unsqueeze", [a, s.const([0])], [f"{o}_u"], f"{n}_u")
    s.add("Squeeze", [f"{o}_u", s.const([0])], [o], n)


def _shape_reshape(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("Shape", [b], [f"{o}_shape"], f"{n}_shape")
    s.add("Reshape", [a, f"{o}_shape"], [o], n)


def _topk(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    s.add("TopK", [a, s.const([8])], [o, f"{o}_idx"], n, axis=1)


def _resize(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    scales = s.const([1.0, 1.0], np.float32)
    s.add("Resize", [a, "", scales], [o], n, mode="linear")


def _batch_norm(s: _Builder, a: str, b: str, o: str, n: str) -> None:
    var = s.const(np.abs(s.rng.standard_normal(8)) + 0.5, np.float32)
    s.add("BatchNormalization", [a, s.weight((8,), 1.0), s.weight((8,)), s.weight((8,)), var],
          [o], n)  # fmt: skip


_STRUCTURAL: dict[str, Pattern] = {
    "MatMul": _matmul, "Gemm": _gemm, "ConcatMatMul": _concat_matmul, "Einsum": _einsum,
    "Conv1x1": _conv, "Transpose2": _transpose2, "SplitConcat": _split_concat,
    "SliceConcat": _slice_concat, "GatherPermute": _gather,
    "UnsqueezeSqueeze": _unsqueeze_squeeze, "ShapeReshape": _shape_reshape, "TopK": _topk,
    "Resize": _resize, "BatchNormalization": _batch_norm,
}  # fmt: skip


def _reduce(s: _Builder, op: str, a: str, o: str, n: str) -> None:
    """Reduced to (2, 1), broadcast back by an Add; axes an input from opset 18 (13 for
    ReduceSum), an attribute before."""
    source = a
    if op in ("ReduceLogSum", "ReduceProd"):
        s.add("Sigmoid", [a], [f"{o}_pos"], f"{n}_pos")
        source = f"{o}_pos"
    if s.opset >= 18 or op == "ReduceSum":
        s.add(op, [source, s.const([1])], [f"{o}_r"], f"{n}_r", keepdims=1)
    else:
        s.add(op, [source], [f"{o}_r"], f"{n}_r", keepdims=1, axes=[1])
    s.add("Add", [a, f"{o}_r"], [o], n)


def _recurrent(s: _Builder, op: str, a: str, o: str, n: str) -> None:
    """(2, 8) as 2 steps of a batch of 1, hidden size 8: Y (2, 1, 1, 8) reshaped back."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    s.add("Reshape", [a, s.const([2, 1, 8])], [f"{o}_seq"], f"{n}_in")
    weights = [
        s.weight((1, gates * 8, 8)),
        s.weight((1, gates * 8, 8)),
        s.weight((1, 2 * gates * 8)),
    ]
    s.add(op, [f"{o}_seq", *weights], [f"{o}_y"], n, hidden_size=8)
    s.add("Reshape", [f"{o}_y", s.const(list(SHAPE))], [o], f"{n}_out")


def _cast_trip(to: int) -> Pattern:
    def pattern(s: _Builder, a: str, b: str, o: str, n: str) -> None:
        s.add("Cast", [a], [f"{o}_low"], f"{n}_down", to=to)
        s.add("Cast", [f"{o}_low"], [o], n, to=T.FLOAT)

    return pattern


def _cast_island(to: int, op: str) -> Pattern:
    def pattern(s: _Builder, a: str, b: str, o: str, n: str) -> None:
        s.add("Cast", [a], [f"{o}_in"], f"{n}_down", to=to)
        s.add(op, [f"{o}_in"], [f"{o}_op"], f"{n}_op")
        s.add("Cast", [f"{o}_op"], [o], n, to=T.FLOAT)

    return pattern


_CAST_PATTERNS: dict[str, Pattern] = {
    "CastTrip16": _cast_trip(T.FLOAT16),
    "CastTripBF16": _cast_trip(T.BFLOAT16),
    "CastIsland16": _cast_island(T.FLOAT16, "Tanh"),
    "CastIsland64": _cast_island(T.DOUBLE, "Sigmoid"),
    "CastSame": lambda s, a, b, o, n: s.add("Cast", [a], [o], n, to=T.FLOAT),
    "CastInt": _cast_trip(T.INT32),
}


def random_policy(rng, nodes, values, outputs) -> dict[str, object]:  # type: ignore[no-untyped-def]
    policy: dict[str, object] = {"dtype": str(rng.choice(["float16", "bfloat16"]))}
    ops = sorted({n.op_type for n in nodes})
    for list_name in ("allow", "infer", "clear", "deny"):
        if ops and rng.random() < 0.2:
            policy[list_name] = [str(rng.choice(ops))]
    moved = [op for key in ("allow", "infer", "clear", "deny") for op in policy.get(key, [])]
    for key in ("allow", "infer", "clear", "deny"):  # an op in two lists is an error
        if key in policy:
            policy[key] = [op for op in policy[key] if moved.count(op) == 1]  # type: ignore[attr-defined]
    if rng.random() < 0.2:
        name = str(rng.choice([n.name for n in nodes]))
        policy["deny_names"] = [name if rng.random() < 0.5 else name.split("_")[0] + "_*"]
    if rng.random() < 0.2:
        policy["deny_tensors"] = [str(rng.choice(values))]
    keep = rng.random()
    if keep < 0.25:
        policy["keep_io_types"] = True
    elif keep < 0.4:
        policy["keep_io_types"] = [str(rng.choice(["x0", "x1", *outputs]))]
    if rng.random() < 0.3:  # drawn last: the draws above stay those of earlier seeds
        policy["target"] = str(rng.choice(["cpu", "any"]))
    return policy
