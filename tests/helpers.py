"""What several test modules share: tiny hand-built ONNX graphs, and graphamp's command line
run as a process of its own (the ``cli`` fixture in ``tests/conftest.py`` runs it in-process)."""

from __future__ import annotations

import subprocess
import sys
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.plans.plan import Plan

F32 = TensorProto.FLOAT


def weight(name: str, shape: tuple[int, ...] = (4, 4), scale: float = 0.5, seed: int = 0):
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(shape) * scale).astype(np.float32)
    values[values == 0] = 0.25
    return numpy_helper.from_array(values, name)


def model(
    nodes,
    inputs=("x",),
    outputs=("y",),
    initializers=(),
    opset=22,
    shape=(4, 4),
    input_types=None,
    output_types=None,
):
    """A model of ``nodes`` (onnx NodeProtos) with float32 inputs/outputs of ``shape``."""
    input_types = input_types or {}
    output_types = output_types or {}
    graph = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, input_types.get(n, F32), shape) for n in inputs],
        [helper.make_tensor_value_info(n, output_types.get(n, F32), None) for n in outputs],
        list(initializers),
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 10
    return proto


def chain(ops: list[str], weight_scale: float = 0.5):
    """x -> op0 -> op1 -> ... -> y; MatMul/Add read a 4x4 weight, other ops are unary."""
    nodes, inits, prev = [], [], "x"
    for index, op in enumerate(ops):
        out = "y" if index == len(ops) - 1 else f"t{index}"
        name = f"{op.lower()}{index}"
        if op in ("MatMul", "Add", "Mul", "Sub", "Div"):
            inits.append(weight(f"w{index}", scale=weight_scale, seed=index))
            nodes.append(helper.make_node(op, [prev, f"w{index}"], [out], name=name))
        else:
            nodes.append(helper.make_node(op, [prev], [out], name=name))
        prev = out
    return model(nodes, initializers=inits)


def convert(proto, **policy):
    """(converted ModelProto, Plan)."""
    result = gonnx.convert(proto, **policy)
    return result.to_proto(), result.plan


def precisions(plan: Plan) -> dict[str, str]:
    return {name: decision.precision for name, decision in plan.nodes.items()}


def casts_in(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in proto.graph.node if n.op_type == "Cast"]


def assert_valid(proto: onnx.ModelProto) -> None:
    """Checker (full) and strict type inference, the bar every output model must pass."""
    onnx.checker.check_model(proto, full_check=True)
    onnx.shape_inference.infer_shapes(proto, strict_mode=True, check_type=True)


def assert_no_redundant_casts(proto: onnx.ModelProto) -> None:
    """No Cast of a Cast's output, no Cast to the type its input already has."""
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    types.update({i.name: i.data_type for i in proto.graph.initializer})
    producers = {out: node for node in proto.graph.node for out in node.output}
    for node in casts_in(proto):
        source = node.input[0]
        assert producers.get(source) is None or producers[source].op_type != "Cast", node.name
        to = next(a.i for a in node.attribute if a.name == "to")
        assert types.get(source) != to, f"{node.name} casts to the type it already has"


def run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from graphamp.onnx.runtime import run as run_model

    outputs, _ = run_model(proto, feeds)
    return list(outputs.values())


class CliResult(NamedTuple):
    """What a run of the command line gave: as :class:`subprocess.CompletedProcess` has it."""

    returncode: int
    stdout: str
    stderr: str


def cli_process(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m graphamp.cli ARGS`` as a process of its own. Only for what the in-process
    ``cli`` fixture cannot show: the exit status through the entry point, logging configured
    once per process (``-v``), what reaches stderr at interpreter exit."""
    return subprocess.run(
        [sys.executable, "-m", "graphamp.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_user_error(
    result: CliResult | subprocess.CompletedProcess[str], *fragments: str
) -> None:
    """Exit status 2 and one line on stderr holding every fragment, no traceback."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
