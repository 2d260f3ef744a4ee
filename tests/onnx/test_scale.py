"""Models whose weights stay on disk: bounded memory, the same bytes as in memory, nothing left
behind by a failure, a progress bar only on a terminal, commands that only scan."""

from __future__ import annotations

import errno
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.cli.conversion import terminate_as_interrupt
from graphamp.core import progress
from graphamp.onnx.io import datafile, stream

ROOT = Path(__file__).resolve().parents[2]


def _decoder_module():
    spec = importlib.util.spec_from_file_location(
        "decoder_onnx", ROOT / "tools/bench/decoder_onnx.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["decoder_onnx"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


DECODER = _decoder_module()
# About 340 MB of float32 weights, the largest tensor 33 MB.
MODERATE = DECODER.DecoderConfig(layers=6, hidden=1024, ffn=2816, heads=16, kv_heads=4, vocab=8000)


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return DECODER.write_decoder(
        tmp_path_factory.mktemp("tiny") / "tiny.onnx", DECODER.PRESETS["tiny"]
    )


def _files(folder: Path) -> set[str]:
    """Everything in ``folder``, hidden temporaries included."""
    return {path.name for path in folder.iterdir()}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_streamed_data_file_holds_the_bytes_of_the_in_memory_conversion(
    tiny_decoder: Path, tmp_path: Path, dtype: str
) -> None:
    in_memory = gonnx.convert(onnx.load(str(tiny_decoder)), dtype=dtype).to_proto()
    out = tmp_path / "out.onnx"
    gonnx.save(gonnx.convert(tiny_decoder, dtype=dtype), out)
    saved = onnx.load(str(out))  # reads the external data the streaming save wrote
    assert any(
        t.data_location == onnx.TensorProto.EXTERNAL
        for t in onnx.load(str(out), load_external_data=False).graph.initializer
    )
    streamed = {t.name: t for t in saved.graph.initializer}
    expected = {t.name: t for t in in_memory.graph.initializer}
    assert streamed.keys() == expected.keys()
    converted = 0
    for name, tensor in expected.items():
        assert streamed[name].data_type == tensor.data_type, name
        a = onnx.numpy_helper.to_array(streamed[name])
        b = onnx.numpy_helper.to_array(tensor)
        assert a.tobytes() == b.tobytes(), name
        converted += tensor.data_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    assert converted > 10  # the weights were converted, not copied


@pytest.mark.slow
def test_peak_memory_of_a_conversion_stays_far_below_its_weights(tmp_path: Path) -> None:
    """A child process converts a 340 MB model; its peak resident memory grows by a small
    fraction of that (the weights were read and written in pieces, never held)."""
    model = DECODER.write_decoder(tmp_path / "moderate.onnx", MODERATE)
    weights = (tmp_path / "moderate.onnx.data").stat().st_size
    script = textwrap.dedent(
        f"""
        import sys
        import graphamp.cli, graphamp.onnx, onnxruntime  # what the conversion of a model
        # with external data imports
        from graphamp.onnx.io import stream
        stream._fast_cast()

        def peak():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024

        before = peak()
        out = {str(tmp_path / "out.onnx")!r}
        # (the check that onnxruntime loads the output loads both models: it is done below
        # 512 MiB only, and is not what this measures)
        status = graphamp.cli.main(["convert", {str(model)!r}, "-o", out, "--no-runtime-check"])
        print("result", status, peak() - before)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    status, growth = map(int, done.stdout.splitlines()[-1].split()[1:])
    assert status == 0
    assert done.stderr == ""  # no progress bar: stderr is no terminal
    assert (tmp_path / "out.onnx.data").stat().st_size > weights // 3
    assert growth < weights // 4, f"peak memory grew by {growth >> 20} MiB for {weights >> 20} MiB"


def test_plan_explain_diff_check_read_weights_only_through_the_range_scan(
    tiny_decoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded beyond the range scan")

    scanned = []
    real_map = stream._map
    monkeypatch.setattr(stream, "_read_chunks", refuse)
    monkeypatch.setattr(stream, "_map", lambda *a: scanned.append(a[0]) or real_map(*a))
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_model", refuse)
    import onnx_ir as ir

    monkeypatch.setattr(ir.ExternalTensor, "numpy", refuse)
    monkeypatch.setattr(ir.ExternalTensor, "tobytes", refuse)
    plan = tmp_path / "plan.json"
    assert main(["plan", str(tiny_decoder), "--format", "json", "-o", str(plan)]) == 0
    assert main(["explain", str(tiny_decoder), "lm_head_mm"]) == 0
    assert main(["diff", str(tiny_decoder), str(plan)]) == 0
    assert main(["check", str(tiny_decoder), "--baseline", str(plan)]) == 0
    assert scanned  # the range checks did read the weights, through the scan


def test_a_full_disk_while_writing_is_one_line_and_leaves_nothing(
    tiny_decoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    calls = []

    def full(self, index, nbytes):
        calls.append(nbytes)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datafile, "BUFFER_BYTES", 1 << 20)  # several buffers for 4 MB of data
    monkeypatch.setattr(datafile.DataFileWriter, "_write_buffer", full)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    assert main(["convert", str(tiny_decoder), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no space left on device" in err[0] and str(out) in err[0]
    assert calls
    assert _files(out.parent) == set()


def test_a_disk_without_room_is_refused_before_writing(
    tiny_decoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import shutil

    from graphamp.onnx.io import files

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(files.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    assert main(["convert", str(tiny_decoder), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1000 B free" in err[0]
    assert _files(out.parent) == set()


def test_a_file_size_limit_is_a_real_write_error_reported_in_one_line(
    tiny_decoder: Path, tmp_path: Path
) -> None:
    """The kernel refuses writes past RLIMIT_FSIZE (EFBIG, with SIGXFSZ ignored): a write that
    truly fails, as on a full disk, without needing a full disk."""
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "graphamp.cli", "convert", str(tiny_decoder), "-o", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "nothing was written" in done.stderr
    assert _files(out.parent) == set()


def test_an_interrupt_while_writing_leaves_no_output_and_no_data_file(
    tiny_decoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = datafile.DataFileWriter._write_buffer

    def interrupted(self, index, nbytes):
        real(self, index, nbytes)  # some data is on disk when the interrupt comes
        raise KeyboardInterrupt  # the writer thread hands it to the main thread

    monkeypatch.setattr(datafile, "BUFFER_BYTES", 1 << 20)
    monkeypatch.setattr(datafile.DataFileWriter, "_write_buffer", interrupted)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    (out.parent / "model.onnx").write_bytes(b"an older output")
    assert main(["convert", str(tiny_decoder), "-o", str(out)]) == 130
    assert _files(out.parent) == {"model.onnx"}  # no data file, no temporaries
    assert out.read_bytes() == b"an older output"


def test_sigterm_during_a_conversion_unwinds_like_an_interrupt() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes
            pass
    assert signal.getsignal(signal.SIGTERM) is before


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_and_nothing_elsewhere() -> None:
    quiet = progress.for_terminal(io.StringIO())
    assert type(quiet) is progress.Progress
    terminal = _Terminal()
    bar = progress.for_terminal(terminal)
    with progress.reporting(bar):
        progress.current().begin("writing weights", 1 << 30, 3)
        for _ in range(3):
            progress.current().advance(1 << 28)
    drawn = terminal.getvalue()
    assert "writing weights" in drawn and "3/3" in drawn
    with progress.reporting(progress.for_terminal(terminal)):
        progress.current().begin("writing weights", 1 << 20, 1)  # too small to be drawn
    assert terminal.getvalue() == drawn


def test_the_fast_float16_rounding_is_numpys_to_the_bit() -> None:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32).copy()
    values[~np.isfinite(values)] = 1.5  # the fast path takes finite chunks
    limit = 65519.99  # just below float16's overflow threshold
    values = np.clip(values, -limit, limit)
    edges = np.array(
        [
            0.0,
            -0.0,
            65504.0,
            65519.0,
            -65519.0,
            6.1035156e-05,
            6.0976e-05,
            5.96e-08,
            2.98e-08,
            2.9802322e-08,
            1.0009765625,
            1.00048828125,
            1.00146484375,
            3e-45,
        ],
        np.float32,
    )
    values = np.concatenate([values, np.repeat(edges, 1 << 12)])
    fast = stream.convert_chunk(values, "float16", "w")
    assert stream._fast_cast() is not None
    assert np.array_equal(fast.view(np.uint16), values.astype(np.float16).view(np.uint16))


def test_chunks_with_nan_or_overflow_go_through_numpy_or_refuse() -> None:
    values = np.linspace(-2, 2, 1 << 17, dtype=np.float32)
    values[7] = np.float32("nan")
    values[9] = np.inf
    out = stream.convert_chunk(values, "float16", "w")
    assert np.array_equal(out.view(np.uint16), values.astype(np.float16).view(np.uint16))
    from graphamp.errors import InternalError

    with pytest.raises(InternalError, match="'w' would overflow float16"):
        stream.convert_chunk(np.full(1 << 17, 7e4, np.float32), "float16", "w")


@pytest.mark.parametrize("sizes", [[5000, 1 << 20, 3], [4096, 4096], [1]])
def test_data_file_writer_writes_every_byte_in_order(tmp_path: Path, sizes, monkeypatch) -> None:
    monkeypatch.setattr(datafile, "BUFFER_BYTES", 64 << 10)
    rng = np.random.default_rng(1)
    pieces = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]
    writer = datafile.DataFileWriter(tmp_path / "data")
    writer.write_all(pieces)
    writer.close()
    assert (tmp_path / "data").read_bytes() == b"".join(pieces)


def test_data_file_writer_without_direct_io(tmp_path: Path, monkeypatch) -> None:
    real_open = os.open

    def no_direct(path, flags, mode=0o777):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(datafile.os, "open", no_direct)
    writer = datafile.DataFileWriter(tmp_path / "data")
    assert not writer.direct
    writer.write(b"x" * 10_000)
    writer.close()
    assert (tmp_path / "data").read_bytes() == b"x" * 10_000


def test_cache_budget_drops_what_is_scanned_beyond_it(monkeypatch) -> None:
    dropped = []
    monkeypatch.setattr(stream, "drop_cached", lambda *a: dropped.append(a))
    budget = stream.CacheBudget(limit=100)
    for offset in (0, 60, 120, 180):
        budget.scanning("data", offset, 60)
    # the first weight fits; the second and third are dropped once the scan moved on
    assert dropped == [("data", 60, 60), ("data", 120, 60)]


def _saved_with_external_data(folder: Path, nodes: list, weights: dict[str, np.ndarray]) -> Path:
    """``folder``/external.onnx: ``nodes`` from x [2, 64] to y [2, 64], every weight in its
    data file."""
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 64])],
        [numpy_helper.from_array(values, name) for name, values in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = folder / "external.onnx"
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        location="external.onnx.data",
        size_threshold=0,
    )
    return path


def _external_model(folder: Path, huge: float | None = None) -> Path:
    """(x @ w + b) @ w with both weights in a data file: ``w`` holds values float16 flushes to
    zero, ``b`` one at float32's lowest (a mask's -inf) and, with ``huge``, one beyond
    float16."""
    from onnx import helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    w[0, :5] = 1e-9
    b = rng.standard_normal(64).astype(np.float32)
    b[3] = np.finfo(np.float32).min
    if huge is not None:
        w[1, 1] = huge
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["a"], name="add"),
        helper.make_node("MatMul", ["a", "w"], ["y"], name="mm2"),
    ]
    return _saved_with_external_data(folder, nodes, {"w": w, "b": b})


def test_convert_checks_weights_on_disk_as_it_writes_them_reading_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """graphamp convert reads a weight on disk once: its range is checked chunk by chunk as
    it is rounded and written (no separate scan through a memory map), and the output, the
    plan and its counts are those of the API's scan-first conversion, byte for byte."""
    source = _external_model(tmp_path)
    scan_first = gonnx.convert(source)
    expected = tmp_path / "expected"
    expected.mkdir()
    gonnx.save(scan_first, expected / "out.onnx")
    monkeypatch.setattr(stream, "_map", lambda *a: pytest.fail("a weight on disk was scanned"))
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    assert main(["convert", str(source), "-o", str(out), "--plan", str(plan)]) == 0
    assert out.read_bytes() == (expected / "out.onnx").read_bytes()
    assert (tmp_path / "out.onnx.data").read_bytes() == (expected / "out.onnx.data").read_bytes()
    records = {w["name"]: w for w in json.loads(plan.read_text())["weights"]}
    assert records["w"]["flushed_to_zero"] == 5 and records["b"]["at_limit"] == 1
    assert records == {w.name: w.to_dict() for w in scan_first.plan.weights}


def test_a_weight_found_too_large_while_writing_starts_the_conversion_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check while writing found a value float16 cannot hold: nothing of that attempt is
    left, and the conversion starts over checking first, so the weight and its reader stay
    float32, as the scan-first conversion decides."""
    source = _external_model(tmp_path, huge=1e6)
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    assert main(["convert", str(source), "-o", str(out), "--plan", str(plan)]) == 0
    assert "'w' holds values beyond float16: every weight was checked" in capsys.readouterr().err
    decided = json.loads(plan.read_text())
    assert decided["nodes"]["mm"]["rule"] == "weight_range"
    assert decided == gonnx.convert(source).plan.to_dict() | {"model": decided["model"]}
    assert _files(tmp_path) == {
        "external.onnx",
        "external.onnx.data",
        "out.onnx",
        "out.onnx.data",
        "plan.json",
    }


def test_the_engine_starts_over_when_a_weight_overflows_while_written(tmp_path: Path) -> None:
    """engine.convert_and_save, not its caller, owns the speculative check's retry: the first
    attempt assumes the weights on disk fit and the writer finds one that does not; the
    conversion it returns checked every weight first (and says which weight made it), with
    the scan-first plan; with a reviewed plan nothing is assumed, so no attempt is retried."""
    from graphamp import engine
    from graphamp.onnx.dialect.plugin import OnnxDialect
    from graphamp.policy.policy import Policy

    source = _external_model(tmp_path, huge=1e6)
    out = tmp_path / "out.onnx"
    policy = Policy.create("float16")
    result = engine.convert_and_save(source, out, policy, dialect=OnnxDialect())
    assert result.rechecked == "w"
    assert result.plan.nodes["mm"].rule == "weight_range"
    assert result.plan.to_dict() == gonnx.convert(source).plan.to_dict()
    again = engine.convert_and_save(
        source, tmp_path / "again.onnx", policy, dialect=OnnxDialect(), reviewed=result.plan
    )
    assert again.rechecked == ""
    assert (tmp_path / "again.onnx.data").read_bytes() == (tmp_path / "out.onnx.data").read_bytes()


def test_a_weight_no_writer_checks_is_measured_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A weight on disk whose readers all stay float32 is never converted, so the writer never
    checks it: measured before writing all the same, since had it overflowed its reader's rule
    and the plan's kept weights would differ. Here it does: the conversion starts over, and the
    plan is the scan-first one; a plan the CLI wrote is then applied with --from-plan."""
    from onnx import helper

    rng = np.random.default_rng(0)
    bias = rng.standard_normal(64).astype(np.float32)
    bias[0] = 1e6
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "b"], ["a"], name="add"),
        helper.make_node("Exp", ["a"], ["y"], name="exp"),
    ]
    weights = {"w": rng.standard_normal((64, 64)).astype(np.float32), "b": bias}
    source = _saved_with_external_data(tmp_path, nodes, weights)
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    assert main(["convert", str(source), "-o", str(out), "--plan", str(plan)]) == 0
    assert "'b' holds values beyond float16" in capsys.readouterr().err
    decided = json.loads(plan.read_text())
    assert decided["nodes"]["add"]["rule"] == "weight_range"
    assert decided == gonnx.convert(source).plan.to_dict() | {"model": decided["model"]}
    again = tmp_path / "again.onnx"
    assert main(["convert", str(source), "-o", str(again), "--from-plan", str(plan)]) == 0
    assert (tmp_path / "again.onnx.data").read_bytes() == (tmp_path / "out.onnx.data").read_bytes()
    graphs = [onnx.load(str(path), load_external_data=False).graph for path in (out, again)]
    assert graphs[0].node == graphs[1].node
