"""The project's side of the Optimum harness: exports and generation run in the Optimum
environment (tools/optimum_env.sh, tools/bench/optimum_models.py) through a subprocess; here, what
graphamp's environment does with the folders: a faithful copy of a converted folder for
generation on the CPU, and what a converted file holds (matrix ops' types, Casts) in every
graph, control-flow bodies included. Used by tests/onnx/test_optimum.py and
tools/bench/bench_control_flow.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tools" / "bench" / "optimum_models.py"
SEQ2SEQ_FILES = (
    "encoder_model.onnx",
    "decoder_model.onnx",
    "decoder_with_past_model.onnx",
    "decoder_model_merged.onnx",
)
LOW = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


class OptimumUnavailable(RuntimeError):
    """The Optimum environment could not be made here (no package index, say)."""


def optimum_python() -> Path:
    """The interpreter of the Optimum environment: ``$GRAPHAMP_OPTIMUM_PYTHON``, else the one
    tools/optimum_env.sh makes (at once when it exists: the script only checks it)."""
    given = os.environ.get("GRAPHAMP_OPTIMUM_PYTHON")
    if given:
        return Path(given)
    made = subprocess.run(
        ["bash", str(ROOT / "tools" / "optimum_env.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if made.returncode != 0:
        last = (made.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise OptimumUnavailable(f"tools/optimum_env.sh failed: {last}")
    return Path(made.stdout.strip().splitlines()[-1])


def _optimum(python: Path, *args: str, timeout: int = 900) -> str:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(python), str(MODELS), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"optimum_models.py {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


def export(python: Path, kind: str, folder: Path) -> Path:
    """``kind`` (t5, bart, llama) exported by Optimum with its cache into ``folder``."""
    _optimum(python, "export", kind, str(folder))
    return folder


def generate(python: Path, *folders: str | Path) -> list[dict]:
    """Greedy generation of 16 tokens for 4 prompts with Optimum's ORTModel classes
    (use_cache=True) on each folder (``path#unmerged``: a seq2seq folder's decoder_model and
    decoder_with_past_model, not its merged decoder), in one process: for each,
    ``{"tokens", "min_margin", "decoders"}``."""
    return json.loads(_optimum(python, "generate", *map(str, folders)))


def emulated_folder(folder: Path, target: Path) -> Path:
    """A copy of the converted ``folder`` whose models compute in float32 but round every
    float16/bfloat16 value as the converted model stores it (graphamp's faithful evaluator,
    :mod:`graphamp.onnx.numerics.emulate`): onnxruntime's CPU provider then rounds like float16,
    where on the converted files it would compute float16 ops in float32. Refused (ValueError) for a
    file whose emulation would leave a low-precision value anywhere, a body included: a copy
    that does not round everywhere would claim an accuracy nobody measured."""
    from graphamp.onnx.io.files import inferred_types
    from graphamp.onnx.numerics.emulate import emulated, has_low_values

    target.mkdir()
    for path in sorted(folder.iterdir()):
        if path.suffix != ".onnx":
            if path.is_file() and not path.name.endswith(".data"):
                shutil.copy2(path, target / path.name)
            continue
        proto = onnx.load(str(path))
        types = inferred_types(proto)
        faithful = emulated(proto, types) if has_low_values(proto, types) else proto
        left = low_values(faithful)
        if left:
            raise ValueError(f"{path.name}: the emulation leaves {left[0]} in low precision")
        onnx.save(faithful, str(target / path.name))
    return target


def graphs(proto: onnx.ModelProto) -> list[tuple[str, onnx.GraphProto]]:
    """Every graph of ``proto`` with its path: the main graph (""), each body of each
    control-flow node at any depth (``If_0/then_branch``), each local function's body."""
    found: list[tuple[str, onnx.GraphProto]] = []

    def visit(path: str, graph: onnx.GraphProto) -> None:
        found.append((path, graph))
        for node in graph.node:
            for attribute in node.attribute:
                inner = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else []
                inner += list(attribute.graphs)
                for body in inner:
                    visit(f"{path}{node.name or node.op_type}/{attribute.name}/", body)

    visit("", proto.graph)
    for function in proto.functions:
        body = onnx.helper.make_graph(list(function.node), function.name, [], [])
        visit(f"{function.domain}.{function.name}/", body)
    return found


def low_values(proto: onnx.ModelProto) -> list[str]:
    """What of ``proto`` computes on a float16/bfloat16 value, in any graph: a Cast to a low
    type whose output anything but a Cast back to float32 reads (that pair is the emulation's
    rounding), a low initializer or constant, a value typed low."""
    found = []
    for path, graph in graphs(proto):
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        for node in graph.node:
            for attribute in node.attribute:
                rounding = all(_is_cast_to_float(r) for r in readers.get(node.output[0], []))
                if node.op_type == "Cast" and attribute.name == "to" and attribute.i in LOW:
                    found += [] if rounding else [f"{path}{node.name} (a Cast to a low type)"]
                if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type in LOW:
                    found.append(f"{path}{node.name} (a low constant)")
        found += [f"{path}{i.name} (a low weight)" for i in graph.initializer if i.data_type in LOW]
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.tensor_type.elem_type in LOW:
                found.append(f"{path}{value.name} (a value typed low)")
    return found


def _is_cast_to_float(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and any(
        a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in node.attribute
    )


def matrix_ops(path: Path) -> list[tuple[str, str, int]]:
    """(graph path + node name, op, the element type it computes in) for every MatMul and
    Gemm of the model at ``path``, in every graph; the type is that of the node's first
    input, as ONNX type inference gives it (0 where it cannot say)."""
    proto = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    every = graphs(proto)
    types: dict[str, int] = {}  # names are unique across a model's scopes (ONNX's SSA rule)
    for _, graph in every:
        for value in [*graph.input, *graph.value_info, *graph.output]:
            types[value.name] = value.type.tensor_type.elem_type
        types.update((init.name, init.data_type) for init in graph.initializer)
        for node in graph.node:
            if node.op_type == "Constant":
                for attribute in node.attribute:
                    if attribute.name == "value":
                        types[node.output[0]] = attribute.t.data_type
    return [
        (graph_path + node.name, node.op_type, types.get(node.input[0], 0))
        for graph_path, graph in every
        for node in graph.node
        if node.op_type in ("MatMul", "Gemm")
    ]


def casts(path: Path) -> int:
    """The Cast nodes of the model at ``path``, in every graph."""
    proto = onnx.load(str(path), load_external_data=False)
    return sum(node.op_type == "Cast" for _, graph in graphs(proto) for node in graph.node)
