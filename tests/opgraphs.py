"""OpGraphs built in code, for the unit tests of each pass (no dialect involved)."""

from __future__ import annotations

import numpy as np

from graphamp.core.dtypes import FLOAT_TYPES
from graphamp.core.graph import NodeKind, OpGraph, OpNode, TensorInfo


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
