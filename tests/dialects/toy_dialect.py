"""A toy third dialect: a small JSON graph format, to prove the Dialect interface.

A ``.toy`` file is ``{"inputs": {name: [dims]}, "weights": {name: {"dtype", "values"}},
"nodes": [{"name", "op", "inputs", "outputs", "to"?}], "outputs": [names]}``; every input is
float32 unless ``retyped``, a value takes its first input's type (a Cast's ``to``), and ops
run in numpy in the stored types. docs/ARCHITECTURE.md walks through this file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from graphamp.core.dtypes import FLOAT_TYPES, numpy_type
from graphamp.core.graph import NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.core.io import write_atomic
from graphamp.dialects import Dialect, ReadGraph
from graphamp.numerics.inputs import InputSpec
from graphamp.plans.edits import EditScript

OPS = {
    "MatMul": lambda a, b: a @ b,
    "Add": lambda a, b: a + b,
    "Relu": lambda a: np.maximum(a, 0),
    "Exp": np.exp,
    "Cast": None,
}


class ToyDialect(Dialect):
    name, lists, suffixes = "toy", "onnx", (".toy",)
    matrix_ops = frozenset({"MatMul"})

    def load(self, source: Any) -> dict:
        return json.loads(Path(source).read_text()) if isinstance(source, str | Path) else source

    def read(self, model: dict, policy: Any) -> ReadGraph:
        graph, model = OpGraph("toy"), json.loads(json.dumps(model))  # edits go to a copy
        for name, dims in model["inputs"].items():
            dtype = model.get("retyped", {}).get(name, "float32")
            graph.add_tensor(TensorInfo(name, dtype, tuple(dims), is_graph_input=True))
            graph.graph_inputs.append(name)
        for name, weight in model["weights"].items():
            array = np.array(weight["values"], numpy_type(weight["dtype"]))
            graph.add_tensor(
                TensorInfo(name, weight["dtype"], array.shape, load_value=lambda a=array: a)
            )
        for spec in model["nodes"]:
            dtype = spec.get("to") or graph.tensors[spec["inputs"][0]].dtype
            for output in spec["outputs"]:
                graph.add_tensor(TensorInfo(output, dtype))
            node = OpNode(spec["name"], spec["op"], list(spec["inputs"]), list(spec["outputs"]))
            if spec["op"] == "Cast":
                node.kind, node.cast_to = NodeKind.CAST, spec["to"]
            else:
                node.follow_inputs = frozenset(range(len(node.inputs)))
                node.follow_outputs = frozenset({0})
                node.compute_type, node.allowed_types = dtype, FLOAT_TYPES
            graph.add_node(node)
        for name in model["outputs"]:
            graph.tensors[name].is_graph_output = True
            graph.graph_outputs.append(name)
        return ReadGraph(graph, model)

    def apply(self, read: ReadGraph, script: EditScript) -> dict:
        model, by_name = read.model, {n["name"]: n for n in read.model["nodes"]}
        for record in script.weights:
            values = np.array(model["weights"][record.name]["values"]).astype(
                numpy_type(record.dst)
            )
            target = model["weights"].setdefault(record.stored_as, {})
            target.update(dtype=record.dst, values=values.astype(np.float64).tolist())
        for (node, slot), tensor in script.rewire.items():
            by_name[node]["inputs"][slot] = tensor
        for node, dtype in script.retarget_casts.items():
            by_name[node]["to"] = dtype
        nodes = [n for n in model["nodes"] if n["name"] not in script.remove_nodes]
        for record in script.casts:  # right after the producer: the order stays topological
            cast = {"name": record.output, "op": "Cast", "to": record.dst}
            cast.update(inputs=[record.tensor], outputs=[record.output])
            at = next((i + 1 for i, n in enumerate(nodes) if record.tensor in n["outputs"]), 0)
            nodes.insert(at, cast)
        for record in script.output_casts:  # the low value renamed, cast back under its name
            for node in nodes:
                node["outputs"] = [
                    record.tensor if o == record.output else o for o in node["outputs"]
                ]
            cast = {"name": record.tensor + "_cast", "op": "Cast", "to": record.dst}
            nodes.append(cast | {"inputs": [record.tensor], "outputs": [record.output]})
        model["nodes"], model["retyped"] = nodes, script.retype
        return model

    def save(self, model: dict, path: Path) -> None:
        write_atomic(Path(path), json.dumps(model, indent=1).encode())

    def input_specs(self, model: Any) -> list[InputSpec]:
        model = self.load(model)
        return [InputSpec(name, "float32", tuple(dims)) for name, dims in model["inputs"].items()]

    def run(self, model: Any, feeds: dict, *, provider: str = "cpu") -> tuple[dict, str]:
        model = self.load(model)
        retyped = model.get("retyped", {})
        values = {
            n: feeds[n].astype(numpy_type(retyped.get(n, "float32"))) for n in model["inputs"]
        }
        for name, weight in model["weights"].items():
            values[name] = np.array(weight["values"], numpy_type(weight["dtype"]))
        for node in model["nodes"]:
            args = [values[name] for name in node["inputs"]]
            if node["op"] == "Cast":
                result = args[0].astype(numpy_type(node["to"]))
            else:
                result = OPS[node["op"]](*args).astype(args[0].dtype)
            values[node["outputs"][0]] = result
        return {name: values[name].astype(np.float32) for name in model["outputs"]}, "numpy"


def toy_model() -> dict:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32).tolist()
    return {
        "inputs": {"x": [2, 4]},
        "weights": {"w": {"dtype": "float32", "values": weight}},
        "nodes": [
            {"name": "mm", "op": "MatMul", "inputs": ["x", "w"], "outputs": ["h"]},
            {"name": "relu", "op": "Relu", "inputs": ["h"], "outputs": ["r"]},
            {"name": "exp", "op": "Exp", "inputs": ["r"], "outputs": ["y"]},
        ],
        "outputs": ["y"],
    }
