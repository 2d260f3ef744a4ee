"""Models that keep their weights inside the .onnx file (graphamp/onnx/io/infile.py): read with the
weights left in the file, written as they are converted, in a fraction of the memory; the bytes
written are those of the model held in memory, for graphs nobody here wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import graphamp.onnx as gonnx
import graphamp.onnx.dialect.writer as writer
from graphamp.cli import main
from graphamp.errors import GraphampError
from graphamp.onnx.io import datafile, files, infile
from tests.hf_models import hf_model

ROOT = Path(__file__).resolve().parents[2]
NOTHING_MAPPED = 1 << 62  # infile.MAP_MIN_BYTES that leaves every weight in the proto


@pytest.fixture(scope="module")
def hf_exported(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Hugging Face GPT-2 and LLaMA (random weights from configs) exported by torch.onnx's
    dynamo exporter at opset 18, weights inside the file."""
    folder = tmp_path_factory.mktemp("hf-infile")
    paths = {}
    for name in ("gpt2", "llama"):
        ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(0))
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                hf_model(name, lm_head=True), (ids,), dynamo=True, opset_version=18, verbose=False
            )
        path = folder / f"{name}.onnx"
        program.save(str(path))
        paths[name] = path
    return paths


def _source(name: str, zoo_model, hf_exported) -> Path:  # type: ignore[no-untyped-def]
    return hf_exported[name] if name in hf_exported else zoo_model(name)


def _cli(source: Path, out: Path, *flags: str) -> tuple[bytes, dict]:
    plan = out.with_suffix(".plan.json")
    assert main(["convert", str(source), "-o", str(out), "--plan", str(plan), *flags]) == 0
    decided = json.loads(plan.read_text())
    return out.read_bytes(), decided


@pytest.mark.slow
@pytest.mark.parametrize("flags", [(), ("--keep-io-types",)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["bert", "gpt", "resnet", "gpt2", "llama"])
def test_written_as_converted_gives_the_bytes_of_the_model_held_in_memory(
    zoo_model, hf_exported, tmp_path, monkeypatch, capsys, name, dtype, flags
):
    """graphamp convert on a model whose weights are in the file: the output file and the plan
    are byte for byte those of the same command holding the whole model in memory (every
    weight parsed into the proto, as before the weights were left in the file)."""
    source = _source(name, zoo_model, hf_exported)
    mapped = infile.read(source)
    assert mapped is not None and len(mapped.tensors) >= 4  # most of its weights stay out
    left_out = [i for i in mapped.proto.graph.initializer if i.name in mapped.tensors]
    assert left_out and not any(init.raw_data for init in left_out)
    streamed = _cli(source, tmp_path / "streamed.onnx", "--dtype", dtype, *flags)
    monkeypatch.setattr(infile, "MAP_MIN_BYTES", NOTHING_MAPPED)
    assert infile.read(source).tensors == {}
    held = _cli(source, tmp_path / "held.onnx", "--dtype", dtype, *flags)
    assert streamed == held
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_the_api_gives_the_same_model_from_the_file_and_from_its_proto(
    zoo_model, hf_exported, tmp_path, name
):
    """graphamp.onnx.convert(path) holds the converted weights in the input file until asked:
    to_proto() then reads them in, and equals the conversion of the model loaded whole; saving
    either writes the same bytes."""
    source = _source(name, zoo_model, hf_exported)
    from_file = gonnx.convert(source)
    from_proto = gonnx.convert(onnx.load(str(source))).to_proto()
    assert isinstance(from_file._converted, infile.StreamedModel)
    files.save(from_file._converted, tmp_path / "streamed.onnx")
    assert from_file.to_proto().SerializeToString() == from_proto.SerializeToString()
    assert (tmp_path / "streamed.onnx").read_bytes() == from_proto.SerializeToString()
    assert from_file.to_proto() is from_file.to_proto()


def test_read_leaves_exactly_the_raw_data_in_the_file(zoo_model) -> None:  # type: ignore[no-untyped-def]
    """The proto read holds everything but the large raw_data fields, which the tensors point
    at: putting them back gives the model protobuf parses from the file."""
    source = zoo_model("bert")
    whole = onnx.load(str(source))
    mapped = infile.read(source)
    assert mapped is not None
    sizes = {i.name: len(i.raw_data) for i in whole.graph.initializer}
    assert set(mapped.tensors) == {n for n, size in sizes.items() if size > infile.MAP_MIN_BYTES}
    raw = {i.name: i.raw_data for i in whole.graph.initializer}
    for name, tensor in mapped.tensors.items():
        assert tensor.nbytes == len(raw[name])
        assert np.asarray(tensor.numpy()).tobytes() == raw[name]
        assert b"".join(bytes(c) for c in tensor.byte_chunks()) == raw[name]
    for init in mapped.proto.graph.initializer:
        if init.name in mapped.tensors:
            init.raw_data = raw[init.name]
    assert mapped.proto == whole


def _matmuls(folder: Path, weights: dict[str, np.ndarray], name: str = "m.onnx") -> Path:
    """x @ w0 @ w1 ... with in-file weights of 64x64 (16 KiB: left in the file)."""
    nodes, previous = [], "x"
    for index, weight in enumerate(weights):
        output = "y" if index == len(weights) - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [previous, weight], [output], name=f"mm{index}"))
        previous = output
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(values, n) for n, values in weights.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    proto.ir_version = 10
    path = folder / name
    onnx.save(proto, str(path))
    return path


def _weights(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.standard_normal((64, 64)).astype(np.float32) * 0.1 for i in range(count)}


def test_layouts_it_does_not_map_are_parsed_whole(tmp_path: Path) -> None:
    """A tensor with a field this onnx does not know, or a file giving the graph twice (which
    protobuf merges), is parsed whole, and converts as before; a truncated file is the same
    one-line error as before."""
    source = _matmuls(tmp_path, _weights(3))
    data = source.read_bytes()
    expected = gonnx.convert(onnx.load(str(source))).to_proto().SerializeToString()
    # an unknown field (number 30, a varint) at the end of the first initializer
    proto = onnx.load(str(source))
    first = proto.graph.initializer[0].SerializeToString() + bytes([0xF0, 0x01, 7])
    proto.graph.initializer[0].ParseFromString(first)
    unknown = tmp_path / "unknown.onnx"
    unknown.write_bytes(proto.SerializeToString())
    mapped = infile.read(unknown)
    assert mapped is not None and "w0" not in mapped.tensors and "w1" in mapped.tensors
    out = tmp_path / "out.onnx"
    assert main(["convert", str(unknown), "-o", str(out)]) == 0
    held = gonnx.convert(onnx.load(str(unknown))).to_proto().SerializeToString()
    assert out.read_bytes() == held
    # the graph given twice: protobuf merges the two (nodes of the second appended)
    twice = tmp_path / "twice.onnx"
    twice.write_bytes(data + onnx.ModelProto(graph=onnx.GraphProto(name="m")).SerializeToString())
    assert infile.read(twice) is None
    assert main(["convert", str(twice), "-o", str(out)]) == 0
    assert out.read_bytes() == expected
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    assert infile.read(truncated) is None
    damaged = r"truncated.onnx: not an ONNX model, or a truncated or damaged one \(DecodeError"
    with pytest.raises(GraphampError, match=damaged):
        files.read_file(truncated)


def test_a_weight_whose_length_disagrees_with_its_dims_is_refused_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proto = onnx.load(str(_matmuls(tmp_path, _weights(2))))
    proto.graph.initializer[1].dims[0] = 32
    bad = tmp_path / "bad.onnx"
    onnx.save(proto, str(bad))
    with pytest.raises(GraphampError, match=r"initializer 'w1': raw_data holds 16384 bytes"):
        files.read_file(bad)


def test_an_input_changed_before_its_weights_are_written_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = _matmuls(tmp_path, _weights(2))
    result = gonnx.convert(source)
    _matmuls(tmp_path, _weights(2, seed=1))  # rewritten in place: same size, new contents
    status = source.stat()  # (a file system may keep the same mtime for a quick rewrite)
    os.utime(source, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
    out = tmp_path / "out.onnx"
    with pytest.raises(GraphampError, match=r"m\.onnx: the file changed while it was being"):
        files.save(result._converted, out)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_weight_found_too_large_while_writing_starts_over(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """graphamp convert leaves the range check of in-file weights to the writer (each is read
    once); a value float16 cannot hold found there starts the conversion over, checking first:
    the output and plan are the held model's."""
    weights = _weights(3)
    weights["w1"][3, 5] = 1e6
    source = _matmuls(tmp_path, weights)
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    assert main(["convert", str(source), "-o", str(out), "--plan", str(plan)]) == 0
    assert "'w1' holds values beyond float16" in capsys.readouterr().err
    held = gonnx.convert(onnx.load(str(source)))
    assert out.read_bytes() == held.to_proto().SerializeToString()
    decided = json.loads(plan.read_text())
    assert decided["nodes"]["mm1"]["rule"] == "weight_range"
    assert decided == held.plan.to_dict() | {"model": decided["model"]}


def test_the_runtime_check_refuses_a_broken_streamed_model(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The check loads the written file, weights and all (by reference into the file): a
    streamed model onnxruntime refuses is exit 3 and nothing is written."""
    source, out = _matmuls(tmp_path, _weights(3)), tmp_path / "out.onnx"
    apply = writer.apply

    def broken(read, script):  # type: ignore[no-untyped-def]
        model = apply(read, script)
        assert isinstance(model, infile.StreamedModel)
        for info in model.proto.graph.value_info:
            if info.name == "h0":  # declared double, computed float16
                info.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
        return model

    monkeypatch.setattr(writer, "apply", broken)
    assert main(["convert", str(source), "-o", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "onnxruntime refuses the converted model" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_an_output_over_the_one_file_limit_keeps_its_weights_outside(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Past protobuf's 2 GB (here: a limit lowered to 10 kB) the streamed model is written with
    external data, a tensor at a time, holding the same values."""
    source = _matmuls(tmp_path, _weights(3))
    monkeypatch.setattr(files, "EXTERNAL_DATA_THRESHOLD", 10_000)
    out = tmp_path / "out.onnx"
    assert main(["convert", str(source), "-o", str(out), "--keep-io-types"]) == 0
    assert (tmp_path / "out.onnx.data").stat().st_size >= 3 * 64 * 64 * 2
    written = onnx.load(str(out))  # with its external data
    keep = gonnx.convert(onnx.load(str(source)), keep_io_types=True).to_proto()
    for mine, theirs in zip(written.graph.initializer, keep.graph.initializer, strict=True):
        assert mine.name == theirs.name
        assert np.array_equal(numpy_helper.to_array(mine), numpy_helper.to_array(theirs))
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in keep.graph.node]


def _peak_growth(folder: Path, side: int) -> tuple[int, int]:
    """Convert, in a child process, a chain of 12 MatMuls whose in-file weights are side x
    side (the runtime check on); how much its peak resident memory grew, and the file's size."""
    rng = np.random.default_rng(0)
    weights = {f"w{i}": rng.standard_normal((side, side)).astype(np.float32) for i in range(12)}
    nodes, previous = [], "x"
    for index, name in enumerate(weights):
        output = "y" if index == len(weights) - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [previous, name], [output], name=f"mm{index}"))
        previous = output
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, side])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(values, name) for name, values in weights.items()],
    )
    source, out = folder / f"m{side}.onnx", folder / f"out{side}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]), str(source))
    script = textwrap.dedent(
        f"""
        import graphamp.cli, graphamp.onnx, graphamp.passes, onnxruntime  # what converting
        from graphamp.onnx.io import stream  # imports, and the rounding kernel, come first
        stream._fast_cast()

        def peak():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024

        before = peak()
        status = graphamp.cli.main(["convert", {str(source)!r}, "-o", {str(out)!r}])
        print("result", status, peak() - before)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    status, growth = map(int, done.stdout.splitlines()[-1].split()[1:])
    assert status == 0 and out.stat().st_size > source.stat().st_size // 3
    return growth, source.stat().st_size


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_weights(tmp_path: Path) -> None:
    """The same graph with weights 16 times larger (12 MiB, then 192 MiB, in the file) peaks
    at the same memory, the runtime check included: the input is never parsed whole, no
    converted weight is held, onnxruntime maps the weights it checks (holding either would add
    96 MiB or more; what does not grow is the graph, the libraries)."""
    small, small_size = _peak_growth(tmp_path, 512)
    large, large_size = _peak_growth(tmp_path, 2048)
    assert large_size > 15 * small_size
    # the writer's two buffers fill up only for the larger model (a bound, not a growth)
    assert large - small < 2 * datafile.BUFFER_BYTES + large_size // 16, (
        f"peak growth {small >> 20} MiB for {small_size >> 20} MiB of weights, "
        f"{large >> 20} MiB for {large_size >> 20} MiB"
    )
