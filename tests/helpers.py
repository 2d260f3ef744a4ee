"""What several test modules share: tiny hand-built ONNX models, graphamp's command line run as
a process of its own (the ``cli`` fixture in ``tests/conftest.py`` runs it in-process), the
docs' code blocks, and scripts run under torchrun."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.plans.plan import Plan

F32 = TensorProto.FLOAT
ROOT = Path(__file__).resolve().parent.parent  # the repository
ZOO_NAMES = ("simplenet", "mnist", "resnet", "bert", "gpt")


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


def keras_style() -> onnx.ModelProto:
    """Every node named after the value it makes; the graph output ``y``'s producer is node
    ``y``, so --keep-io-types' Cast back (output ``y``) needs another node name."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="h"),
        helper.make_node("Relu", ["h"], ["r"], name="r"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="y"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, [4, 4])],
        [helper.make_tensor_value_info("y", F32, [4, 4])],
        [weight("w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    return proto


def conv_net(opset: int = 17, ir_version: int = 8) -> onnx.ModelProto:
    """Conv -> Relu -> MatMul -> Add -> Exp -> Softmax: ops every opset from 7 has (the
    same weights every time)."""
    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array((rng.standard_normal((3, 2, 3, 3)) * 0.3).astype("f4"), "cw"),
        numpy_helper.from_array((rng.standard_normal((3, 3)) * 0.3).astype("f4"), "mw"),
        numpy_helper.from_array((rng.standard_normal((3,)) * 0.3).astype("f4"), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "mw"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Exp", ["a"], ["e"], name="exp"),
        helper.make_node("Softmax", ["e"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", F32, [1, 3, 3, 3])],
        weights,
        value_info=[helper.make_tensor_value_info("c", F32, [1, 3, 3, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def embedding_model() -> onnx.ModelProto:
    """ids -> Gather(table) -> LogSoftmax -> MatMul: the table feeds only a Gather, whose value
    a deny-list op reads: under --spread tensorflow the 64 KiB table stays float32 (the case of
    BERT's embeddings; the cost spread stores it float16 and casts the gathered rows)."""
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32), "table"
    )
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
            helper.make_node("LogSoftmax", ["e"], ["l"], name="logsoftmax"),
            helper.make_node("MatMul", ["l", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [table, weight("w", (64, 4))],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def layer_norm_model(gain: float):
    """x -> MatMul -> LayerNormalization(gain) -> MatMul -> y."""
    hidden = 4
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/encoder/mm1"),
        helper.make_node(
            "LayerNormalization",
            ["h", "gamma", "beta"],
            ["n"],
            name="/encoder/norm/LayerNormalization",
            axis=-1,
        ),
        helper.make_node("MatMul", ["n", "w2"], ["y"], name="/encoder/mm2"),
    ]
    inits = [
        weight("w1"),
        weight("w2", seed=1),
        numpy_helper.from_array(np.full(hidden, gain, np.float32), "gamma"),
        numpy_helper.from_array(np.full(hidden, 0.1, np.float32), "beta"),
    ]
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
    from graphamp.onnx.numerics.runtime import run as run_model

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


def fenced_blocks(document: str) -> list[tuple[str, str, str]]:
    """The fenced code blocks of ``document`` (a path under the repository root), in order:
    (language, who runs it: '' for this module, else the info string's second word, text)."""
    blocks, current, info = [], None, ("", "")
    for line in (ROOT / document).read_text().splitlines():
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            words = stripped[3:].split()
            info = (words[0] if words else "", words[1] if len(words) > 1 else "")
            current = []
        elif current is not None and stripped == "```":
            blocks.append((*info, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, f"{document}: a code block is not closed"
    return blocks


def doc_blocks(document: str, language: str, runner: str = "") -> list[str]:
    """The blocks of ``document`` in ``language`` that ``runner`` runs ('' for this module)."""
    blocks = fenced_blocks(document)
    return [text for lang, who, text in blocks if (lang, who) == (language, runner)]


def torchrun(
    script: Path, nproc: int = 2, timeout: int = 600
) -> tuple[int, list[tuple[str, str]], str]:
    """Run ``script`` under torchrun on ``nproc`` processes: (exit status, each rank's
    (stdout, stderr) from torchrun's per-rank logs, torchrun's own stderr)."""
    logs = script.parent / "logs"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--redirects", "3"]
    done = subprocess.run(
        [*command, "--nproc-per-node", str(nproc), "--log-dir", str(logs), script.name],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    ranks = []
    for rank in range(nproc):
        found = sorted(logs.glob(f"*/attempt_*/{rank}"))
        folder = found[-1] if found else None
        ranks.append(
            tuple(
                (folder / f"{stream}.log").read_text() if folder else "(no log)"
                for stream in ("stdout", "stderr")
            )
        )
    return done.returncode, ranks, done.stderr  # type: ignore[return-value]


def each_rank(ranks: list[tuple[str, str]], launcher: str = "") -> str:
    """Every rank's stdout and stderr, for a failure message."""
    parts = [
        f"--- rank {rank} stdout ---\n{out}\n--- rank {rank} stderr ---\n{err}"
        for rank, (out, err) in enumerate(ranks)
    ]
    if launcher:
        parts.append(f"--- launcher stderr (end) ---\n{launcher[-2000:]}")
    return "\n".join(parts)


def load_tool(path: str) -> ModuleType:
    """The benchmark script at ``path`` (under the repository) as a module, with
    ``tools/bench`` and ``tools/gpu`` on ``sys.path`` for the modules it imports beside it."""
    sys.path[:0] = [str(ROOT / "tools" / "bench"), str(ROOT / "tools" / "gpu")]
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
