"""OpGraphs built in code, for the unit tests of each pass (no dialect involved)."""

from __future__ import annotations

import numpy as np

from graphamp.core.dtypes import FLOAT_TYPES
from graphamp.core.graph import MatrixDims, NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.numerics.ranges import Ranges, TensorRange, log2_counts
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import MODEL
from graphamp.plans.plan import Plan
from graphamp.plans.records import CastRecord, NodeDecision
from graphamp.policy.policy import Policy
from graphamp.training.float8 import Float8


class GraphBuilder:
    """``b = GraphBuilder(); b.input("x"); b.op("mm", "MatMul", ["x", "w"]); b.output("mm")``.

    An op's outputs default to one tensor named after the node; every float input and output
    carries the computation type unless ``follow`` says otherwise.
    """

    def __init__(self) -> None:
        self.graph = OpGraph("test")

    def input(self, name: str, dtype: str = "float32", *, fixed: bool = False) -> str:
        self.graph.add_tensor(
            TensorInfo(name, dtype, shape=(4, 4), is_graph_input=True, type_fixed=fixed)
        )
        self.graph.graph_inputs.append(name)
        return name

    def weight(self, name: str, values: np.ndarray | float = 0.5) -> str:
        array = np.asarray(values, dtype=np.float32)
        if array.ndim == 0:
            array = np.full((4, 4), float(array), np.float32)
        self.graph.add_tensor(
            TensorInfo(name, "float32", shape=array.shape, load_value=lambda a=array: a)
        )
        return name

    def op(
        self,
        name: str,
        op: str,
        inputs: list[str],
        *,
        outputs: list[str] | None = None,
        dtype: str = "float32",
        kind: NodeKind = NodeKind.OP,
        follow: list[int] | None = None,
        allowed: frozenset[str] = FLOAT_TYPES,
        cast_to: str | None = None,
    ) -> str:
        outputs = outputs or [name]
        for output in outputs:
            self.graph.add_tensor(TensorInfo(output, cast_to or dtype, shape=(4, 4)))
        floats = [i for i, t in enumerate(inputs) if self.graph.tensors[t].dtype in FLOAT_TYPES]
        node = OpNode(
            name=name,
            op=op,
            inputs=list(inputs),
            outputs=outputs,
            kind=kind,
            follow_inputs=frozenset(floats if follow is None else follow),
            follow_outputs=frozenset(range(len(outputs))) if dtype in FLOAT_TYPES else frozenset(),
            allowed_types=allowed,
            compute_type=self.graph.tensors[inputs[0]].dtype if inputs else dtype,
            schema_source="test schema",
            cast_to=cast_to,
        )
        if kind is NodeKind.CAST:
            node.follow_inputs = node.follow_outputs = frozenset()
        self.graph.add_node(node)
        return outputs[0]

    def output(self, *names: str) -> OpGraph:
        for name in names:
            self.graph.tensors[name].is_graph_output = True
            self.graph.graph_outputs.append(name)
        return self.graph


def chain(*ops: str, weights: bool = True) -> OpGraph:
    """x -> op0 -> op1 -> ... ; MatMul/Add/Mul read a 4x4 weight ``w<i>``."""
    b = GraphBuilder()
    previous = b.input("x")
    for index, op in enumerate(ops):
        inputs = [previous]
        if weights and op in ("MatMul", "Add", "Mul"):
            inputs.append(b.weight(f"w{index}"))
        previous = b.op(f"{op.lower()}{index}", op, inputs)
    return b.output(previous)


# -- matrix graphs with real shapes, for the float8 tests ---------------------------------------

M = 32


class Builder:
    """Matrix graphs with real shapes: ``b.matmul("mm", "x", "w")`` records the product's dims."""

    def __init__(self) -> None:
        self.graph = OpGraph("fp8")

    def input(self, name: str, shape: tuple[int, ...]) -> str:
        self.graph.add_tensor(TensorInfo(name, "float32", shape=shape, is_graph_input=True))
        self.graph.graph_inputs.append(name)
        return name

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        array = np.random.default_rng(len(name)).standard_normal(shape).astype(np.float32)
        self.graph.add_tensor(
            TensorInfo(name, "float32", shape=shape, load_value=lambda a=array: a)
        )
        return name

    def op(self, name: str, op: str, inputs: list[str], shape: tuple[int, ...]) -> str:
        self.graph.add_tensor(TensorInfo(name, "float32", shape=shape))
        floats = frozenset(i for i, t in enumerate(inputs) if self.graph.tensors[t].is_float)
        node = OpNode(
            name, op, list(inputs), [name], follow_inputs=floats,
            follow_outputs=frozenset({0}), allowed_types=frozenset({"float32", "float16"}),
            compute_type="float32", schema_source="test",
        )  # fmt: skip
        self.graph.add_node(node)
        return name

    def matmul(self, name: str, a: str, b: str, *, b_transposed: bool = False) -> str:
        a_shape, b_shape = self.graph.tensors[a].shape, self.graph.tensors[b].shape
        k, n = a_shape[-1], (b_shape[0] if b_transposed else b_shape[-1])
        out = self.op(name, "Gemm" if b_transposed else "MatMul", [a, b], (*a_shape[:-1], n))
        self.graph.nodes[name].matrix = MatrixDims(
            a_shape[0], k, n, n_axis=0 if b_transposed else len(b_shape) - 1
        )
        return out

    def output(self, name: str) -> OpGraph:
        self.graph.tensors[name].is_graph_output = True
        self.graph.graph_outputs.append(name)
        return self.graph


def mlp(k: int = 64, n: int = 128) -> OpGraph:
    """x[32, k] -> up (w_up [k, n]) -> Relu -> down (w_down [n, k]) -> head (w_head [k, 16])."""
    b = Builder()
    b.input("x", (M, k))
    b.matmul("up", "x", b.weight("w_up", (k, n)))
    b.op("relu", "Relu", ["up"], (M, n))
    b.matmul("down", "relu", b.weight("w_down", (n, k)))
    b.matmul("head", "down", b.weight("w_head", (k, 16)))
    return b.output("head")


def calibrated(graph: OpGraph, values: dict[str, np.ndarray] | None = None) -> Ranges:
    """Ranges of every activation of ``graph``: normal data, or ``values`` where given."""
    rng = np.random.default_rng(0)
    tensors = {}
    for name, info in graph.tensors.items():
        if info.is_constant:
            continue
        data = values.get(name) if values and name in values else rng.standard_normal(info.shape)
        tensors[name] = TensorRange(
            float(np.abs(data).max()), float(np.abs(data[data != 0]).min()), 0, log2_counts(data)
        )
    return Ranges(tensors, batches=4)


def run(graph: OpGraph, fp8: Float8 | None, ranges: Ranges | None = None, **policy) -> PassContext:
    context = PassContext(
        graph, Policy.create("float16", **policy), Options(ranges=ranges, fp8=fp8)
    )
    return PassManager(MODEL, check=True).run(context)


def toy_plan(names: list[str], constant: bool = True) -> tuple[Plan, OpGraph]:
    """A chain x -> names[0] -> names[1] -> ... -> y, alternately float16 and float32, a
    Constant feeding the first node and one cast on each float32 -> float16 boundary."""
    graph = OpGraph()
    graph.add_tensor(TensorInfo("x", "float32", is_graph_input=True))
    nodes: dict[str, NodeDecision] = {}
    casts = []
    previous = "x"
    if constant:
        graph.add_tensor(TensorInfo("c", "float32"))
        graph.add_node(OpNode("const", "Constant", [], ["c"], kind=NodeKind.CONSTANT))
        nodes["const"] = NodeDecision("Constant", "none", "no_float", "a stored value")
    for index, name in enumerate(names):
        out = f"t{index}"
        graph.add_tensor(TensorInfo(out, "float32", is_graph_output=index == len(names) - 1))
        inputs = [previous, "c"] if constant and index == 0 else [previous]
        graph.add_node(OpNode(name, "MatMul" if index % 2 == 0 else "Add", inputs, [out]))
        low = index % 2 == 0
        nodes[name] = NodeDecision(
            "MatMul" if low else "Add",
            "float16" if low else "float32",
            "allow" if low else "deny",
            "a reason",
        )
        if low:
            casts.append(CastRecord(previous, "float32", "float16", f"{previous}_h", [name]))
        previous = out
    plan = Plan("float16", {"dialect": "onnx"}, nodes=nodes, casts=casts, model="toy")
    return plan, graph
