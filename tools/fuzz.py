"""Fuzz the engine with seeded random graphs and random policies.

Each graph is a random dataflow over about 60 float ONNX ops (every value has shape (2, 8), so
any op can read any earlier value), converted under a random policy (ops moved between lists,
deny_names and deny_tensors rules, keep_io_types, float16 or bfloat16). On every graph:

* the output passes the full checker and strict type inference, and onnxruntime loads it (a
  bfloat16 model the CPU provider has no kernel for is run by onnx.reference instead);
* its outputs are finite wherever float32's are, and within tolerance of float32 under the
  faithful evaluator (every low value rounded as the low type rounds it): the error relative
  to max(|y|, 1), so an output that cancels to about zero is held to an absolute bound. Graphs
  with a discontinuous op (Round, Floor, Ceil, Sign, Hardmax) are held to the structural
  properties only: a low-precision input one rounding step across a boundary flips them;
* converting is deterministic (the same bytes twice) and a fixed point (converting the output
  again changes no byte);
* one Cast per (tensor, dtype), no Cast to the type a value already has, no Cast of a Cast.

    python tools/fuzz.py --n 10000          # the benchmark: violations and time
    python tools/fuzz.py --n 200 --seed 7   # what the test suite runs
    python tools/fuzz.py --cli --n 2000     # damaged files through the command line

``--cli`` mutates valid model files (truncation, flipped bytes, bytes deleted or repeated) and
runs ``graphamp convert`` on each: the command must exit 0 or 2, never 3 (an internal error)
and never with a traceback, and must write no output when it fails.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.errors import GraphampError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checks of tests/helpers.py

SHAPE = (2, 8)
OPSET = 22
UNARY = [
    "Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Softplus", "Elu", "Selu", "LeakyRelu",
    "HardSigmoid", "Erf", "Sin", "Cos", "Floor", "Ceil", "Round", "Softsign", "Mish",
    "HardSwish", "Identity", "ThresholdedRelu", "Celu", "Sign", "Gelu", "Sqrt", "Log",
    "Reciprocal", "Softmax", "LogSoftmax", "Hardmax", "CumSum", "Clip", "LayerNormalization",
    "Transpose2", "Dropout",
]  # fmt: skip
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow", "Where", "PRelu"]
MATRIX = ["MatMul", "Gemm", "ConcatMatMul"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp",
          "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceLogSum"]  # fmt: skip
OPS = UNARY + BINARY + MATRIX + REDUCE
TOLERANCE = {"float16": 5e-2, "bfloat16": 2e-1}
DISCONTINUOUS = {"Round", "Floor", "Ceil", "Sign", "Hardmax"}


@dataclass
class Case:
    model: onnx.ModelProto
    policy: dict[str, object]


def random_case(seed: int) -> Case:
    rng = np.random.default_rng(seed)
    values = ["x0", "x1"]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def weight(shape: tuple[int, ...], scale: float = 0.3) -> str:
        name = f"w{len(inits)}"
        array = (rng.standard_normal(shape) * scale).astype(np.float32)
        array[array == 0] = 0.1
        inits.append(numpy_helper.from_array(array, name))
        return name

    def const(value: object, dtype: type = np.int64) -> str:
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    for index in range(int(rng.integers(3, 14))):
        op = str(rng.choice(OPS))
        a, b = (str(rng.choice(values)) for _ in range(2))
        out, name = f"v{index}", f"n{index}_{op.lower()}"
        nodes.extend(_node(op, a, b, out, name, weight, const))
        values.append(out)
    outputs = sorted(set(rng.choice(values[2:], size=min(2, len(values) - 2), replace=False)))
    graph = helper.make_graph(
        nodes,
        f"fuzz{seed}",
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, SHAPE) for n in ("x0", "x1")],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return Case(model, random_policy(rng, nodes, values, outputs))


def _node(op, a, b, out, name, weight, const) -> list[onnx.NodeProto]:  # type: ignore[no-untyped-def]
    make = helper.make_node

    def positive(source: str) -> list[onnx.NodeProto]:  # |source| + 1: no zero, no negative
        one = const(1.0, np.float32)
        return [make("Abs", [source], [f"{out}_abs"], name=f"{name}_abs"),
                make("Add", [f"{out}_abs", one], [f"{out}_pos"], name=f"{name}_pos")]  # fmt: skip

    if op in ("Sqrt", "Log", "Reciprocal"):  # defined on positive values
        return [*positive(a), make(op, [f"{out}_pos"], [out], name=name)]
    if op == "Div":
        return [*positive(b), make(op, [a, f"{out}_pos"], [out], name=name)]
    if op == "Pow":
        return [make("Abs", [a], [f"{out}_abs"], name=f"{name}_abs"),
                make(op, [f"{out}_abs", const(2.0, np.float32)], [out], name=name)]  # fmt: skip
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        return [make(op, [a], [out], name=name, axis=-1)]
    if op == "CumSum":
        return [make(op, [a, const(1)], [out], name=name)]
    if op == "Clip":
        lo, hi = const(-1.0, np.float32), const(1.0, np.float32)
        return [make(op, [a, lo, hi], [out], name=name)]
    if op == "LayerNormalization":
        return [make(op, [a, weight((8,), 1.0), weight((8,))], [out], name=name, axis=-1)]
    if op == "Transpose2":  # a transpose and back: data movement between other ops
        return [make("Transpose", [a], [f"{out}_t"], name=f"{name}_t", perm=[1, 0]),
                make("Transpose", [f"{out}_t"], [out], name=name, perm=[1, 0])]  # fmt: skip
    if op == "Dropout":
        return [make(op, [a], [out], name=name)]
    if op == "Where":
        return [make("Greater", [a, b], [f"{out}_gt"], name=f"{name}_gt"),
                make(op, [f"{out}_gt", a, b], [out], name=name)]  # fmt: skip
    if op == "PRelu":
        return [make(op, [a, weight((8,))], [out], name=name)]
    if op in BINARY:
        return [make(op, [a, b], [out], name=name)]
    if op == "MatMul":
        return [make(op, [a, weight((8, 8))], [out], name=name)]
    if op == "Gemm":
        return [make(op, [a, weight((8, 8)), weight((8,))], [out], name=name, transB=1)]
    if op == "ConcatMatMul":
        return [make("Concat", [a, b], [f"{out}_cat"], name=f"{name}_cat", axis=1),
                make("MatMul", [f"{out}_cat", weight((16, 8))], [out], name=name)]  # fmt: skip
    if op in REDUCE:  # reduced to (2, 1), broadcast back by an Add
        reduce_input = a
        nodes = []
        if op in ("ReduceLogSum", "ReduceProd"):
            nodes.append(make("Sigmoid", [a], [f"{out}_pos"], name=f"{name}_pos"))
            reduce_input = f"{out}_pos"
        nodes += [make(op, [reduce_input, const([1])], [f"{out}_r"], name=f"{name}_r", keepdims=1),
                  make("Add", [a, f"{out}_r"], [out], name=name)]  # fmt: skip
        return nodes
    return [make(op, [a], [out], name=name)]


def random_policy(rng, nodes, values, outputs) -> dict[str, object]:  # type: ignore[no-untyped-def]
    policy: dict[str, object] = {"dtype": str(rng.choice(["float16", "bfloat16"]))}
    ops = sorted({n.op_type for n in nodes})
    for list_name in ("allow", "infer", "clear", "deny"):
        if ops and rng.random() < 0.2:
            policy[list_name] = [str(rng.choice(ops))]
    moved = [op for key in ("allow", "infer", "clear", "deny") for op in policy.get(key, [])]
    for key in ("allow", "infer", "clear", "deny"):  # an op in two lists is an error
        if key in policy:
            policy[key] = [op for op in policy[key] if moved.count(op) == 1]  # type: ignore[union-attr]
    if rng.random() < 0.2:
        policy["deny_names"] = [str(rng.choice([n.name for n in nodes]))]
    if rng.random() < 0.2:
        policy["deny_tensors"] = [str(rng.choice(values))]
    keep = rng.random()
    if keep < 0.25:
        policy["keep_io_types"] = True
    elif keep < 0.4:
        policy["keep_io_types"] = [str(rng.choice(["x0", "x1", *outputs]))]
    return policy


def check(case: Case) -> list[str]:
    """The properties of the module docstring; the violated ones, in words."""
    from graphamp.onnx.runtime import run
    from tests.helpers import assert_no_redundant_casts, assert_valid

    problems = []
    policy = case.policy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            first = gonnx.convert(case.model, **policy).to_proto()  # type: ignore[arg-type]
        except GraphampError as exc:
            return [f"refused: {exc}"]
        second = gonnx.convert(case.model, **policy).to_proto()  # type: ignore[arg-type]
        if first.SerializeToString() != second.SerializeToString():
            problems.append("not deterministic")
        again = gonnx.convert(first, **policy).to_proto()  # type: ignore[arg-type]
    if again.SerializeToString() != first.SerializeToString():
        problems.append("not a fixed point")
    for name, test in (("invalid", assert_valid), ("redundant cast", assert_no_redundant_casts)):
        try:
            test(first)
        except Exception as exc:  # the checker's and the assertions' errors alike
            problems.append(f"{name}: {str(exc)[:200]}")
    if problems or {n.op_type for n in case.model.graph.node} & DISCONTINUOUS:
        return problems
    rng = np.random.default_rng(0)
    feeds = {n: (rng.random(SHAPE) + 0.5).astype(np.float32) for n in ("x0", "x1")}
    want, _ = run(case.model, feeds)
    got, _ = run(first, feeds)
    for name, expected in want.items():
        expected64, actual = expected.astype(np.float64), got[name].astype(np.float64)
        finite = np.isfinite(expected64)
        if (~np.isfinite(actual) & finite).any():
            problems.append(f"{name}: non-finite where float32 is finite")
            continue
        if not finite.any():
            continue
        scale = max(np.abs(expected64[finite]).max(), 1.0)
        error = np.abs(actual[finite] - expected64[finite]).max() / scale
        if error > TOLERANCE[str(policy["dtype"])]:
            problems.append(f"{name}: error {error:.3g} over {TOLERANCE[str(policy['dtype'])]}")
    return problems


def mutated(seed: int) -> bytes:
    """A valid model's bytes, damaged at random."""
    rng = np.random.default_rng(seed)
    data = bytearray(random_case(seed).model.SerializeToString())
    kind = int(rng.integers(4))
    at = int(rng.integers(len(data)))
    if kind == 0:
        return bytes(data[:at])  # truncated
    if kind == 1:
        for _ in range(int(rng.integers(1, 8))):
            data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        return bytes(data)
    if kind == 2:
        return bytes(data[:at] + data[at + int(rng.integers(1, 16)) :])  # bytes deleted
    return bytes(data[:at] + data[at : at + 16] + data[at:])  # bytes repeated


def check_cli(seed: int, folder: Path) -> list[str]:
    """``graphamp convert`` on a damaged file: exit 0 or 2, no traceback, no partial output."""
    import contextlib
    import io

    from graphamp.cli import main as cli

    source, target = folder / f"m{seed}.onnx", folder / f"o{seed}.onnx"
    source.write_bytes(mutated(seed))
    err = io.StringIO()
    with (
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        status = cli(["convert", str(source), "-o", str(target)])
    problems = []
    if status not in (0, 2):
        problems.append(f"exit {status}: {err.getvalue().strip()[:300]}")
    if "Traceback" in err.getvalue():
        problems.append("a traceback")
    if status != 0 and target.exists():
        problems.append("an output after a failure")
    source.unlink()
    target.unlink(missing_ok=True)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="graphs to generate")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--cli", action="store_true", help="damaged files through the CLI")
    args = parser.parse_args(argv)
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="graphamp-fuzz-"))
    start, violations = time.perf_counter(), 0
    for seed in range(args.seed, args.seed + args.n):
        problems = check_cli(seed, folder) if args.cli else check(random_case(seed))
        if problems:
            violations += 1
            print(f"seed {seed}: {'; '.join(problems)}")
    seconds = time.perf_counter() - start
    per_graph = seconds / args.n * 1000
    print(
        f"{violations} violations in {args.n} graphs, {seconds:.1f} s ({per_graph:.0f} ms a graph)"
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
