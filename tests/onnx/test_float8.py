"""ONNX float8 (``graphamp convert --fp8 --calibrate``): the quantisers against ml_dtypes and
onnxruntime, the written model (checker, opset, float8 weights, scales per channel), the zoo's
BERT and GPT against float32 through the faithful evaluator, the command line's refusals, and
the note on onnxruntime's default session."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphamp
import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import GraphampError
from graphamp.models import export_onnx
from graphamp.onnx.dialect import float8
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.numerics import runtime
from graphamp.onnx.numerics.emulate import emulated
from graphamp.onnx.numerics.runtime import check_loads, run
from tests.helpers import chain, model

E4M3 = ml_dtypes.float8_e4m3fn
_FLOAT8 = TensorProto.FLOAT8E4M3FN


def every(dtype: type) -> np.ndarray:
    """Every finite value of a 16-bit float type."""
    values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)
    return values[np.isfinite(values.astype(np.float32))]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_the_quantiser_equals_ml_dtypes_after_clipping_on_every_value(dtype):
    values = every(dtype).astype(np.float32)
    expected = np.clip(values, -448, 448).astype(E4M3)
    found = float8.quantise(values, 1.0)
    assert found.dtype == E4M3 and np.array_equal(found.view(np.uint8), expected.view(np.uint8))
    # past +-448 it saturates (ml_dtypes alone would give NaN from 464 up)
    assert float(found[values == values.max()][0]) == 448.0
    # and at a scale, as QuantizeLinear does: values / scale, clipped, rounded
    scaled = float8.quantise(values, 0.25)
    assert np.array_equal(
        scaled.view(np.uint8), np.clip(values / 0.25, -448, 448).astype(E4M3).view(np.uint8)
    )


def test_onnxruntime_quantises_every_float16_value_as_the_faithful_evaluator():
    """QuantizeLinear -> DequantizeLinear with a float16 input and scale (what the written
    models hold): onnxruntime divides in float32, as the emulated model does, bit for bit.
    (onnx.reference divides float16 by float16 in float16 first: a second rounding that lands
    a few values one float8 step away; the evaluator follows the runtimes.)"""
    scale = numpy_helper.from_array(np.array(0.0123, np.float16), "s")
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    f16 = TensorProto.FLOAT16
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", f16, [None])],
        [helper.make_tensor_value_info("y", f16, [None])], [scale, zero],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    onnx.checker.check_model(proto, full_check=True)
    values = every(np.float16)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    direct = session.run(None, {"x": values})[0]
    faithful, _ = run(proto, {"x": values})
    step = np.float32(np.float16(0.0123))
    formula = (float8.quantise(values, step).astype(np.float32) * step).astype(np.float16)
    assert np.array_equal(direct.view(np.uint16), formula.view(np.uint16))
    assert np.array_equal(
        np.asarray(faithful["y"], np.float16).view(np.uint16), formula.view(np.uint16)
    )


def test_weights_per_channel_dequantise_to_stored_times_scale():
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((48, 32)) * np.logspace(-3, 2, 32)).astype(np.float32)
    weights[:, 5] = 0.0  # an all-zero channel keeps scale 1
    weights[:, 7] *= 1e-5  # max |w| / 448 is under float16's smallest positive value
    stored, scales = float8.quantise_per_channel(weights, 1, np.float16)
    assert stored.dtype == E4M3 and scales.dtype == np.float16 and scales.shape == (32,)
    assert scales[5] == 1.0 and np.all(stored[:, 5].astype(np.float32) == 0)
    restored = stored.astype(np.float32) * scales.astype(np.float32)
    assert np.abs(stored.astype(np.float32)).max() <= 448
    # scales round up: no channel's largest value passes 448 and clips
    exact = np.abs(weights).max(axis=0) / 448
    assert np.all(scales.astype(np.float32)[exact > 0] >= exact[exact > 0])
    # each channel's largest value lands at 448 (within the float16 scale's rounding)
    top = np.abs(stored.astype(np.float32)).max(axis=0)
    normal = np.isin(np.arange(32), [5, 7], invert=True)
    assert np.all((top[normal] >= 416) & (top[normal] <= 448))
    # the tiny channel takes float16's smallest scale (not 1, which flushed it all to zero)
    assert scales[7] == np.float16(2.0**-24) and 1 < top[7] < 448
    rel = np.abs(restored - weights) / np.abs(weights).max(axis=0)
    assert rel[:, np.arange(32) != 5].max() <= 2.0**-4  # half an E4M3 step at the channel max


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp8-zoo")
    found = {}
    for name in ("bert", "gpt"):
        path = export_onnx(name, folder / f"{name}.onnx", "small")
        data = []
        for seed in (0, 1):  # calibration, then held-out
            rng = np.random.default_rng(seed)
            batches = []
            for _ in range(4):
                feeds = {"input_ids": rng.integers(0, 128, (2, 16)).astype(np.int64)}
                if name == "bert":
                    feeds["token_type_ids"] = rng.integers(0, 2, (2, 16)).astype(np.int64)
                batches.append(feeds)
            data.append(batches)
        found[name] = (path, *data)
    return found


@pytest.mark.parametrize(("name", "bar"), [("bert", 2.5e-2), ("gpt", 1.5e-2)])
def test_zoo_models_in_float8_meet_the_error_bars(zoo, name, bar):
    path, calibration, held_out = zoo[name]
    ranges = gonnx.calibrate(str(path), calibration, histograms=True)
    result = gonnx.convert(str(path), fp8=graphamp.Float8.static(), ranges=ranges)
    proto = result.to_proto()
    onnx.checker.check_model(proto, full_check=True)
    assert next(o.version for o in proto.opset_import if o.domain == "") >= 21
    chosen = sorted(n for n, d in result.plan.fp8.items() if d.rule == "fp8")
    assert len(chosen) == 12  # 17 matrix ops less 4 attention products and the last one
    producers = {out: node for node in proto.graph.node for out in node.output}
    inits = {init.name: init for init in proto.graph.initializer}
    matmuls = {node.name: node for node in proto.graph.node}
    for node_name in chosen:
        a, b = (producers[v] for v in matmuls[node_name].input[:2])
        assert a.op_type == b.op_type == "DequantizeLinear"
        assert producers[a.input[0]].op_type == "QuantizeLinear"
        weight, scale = inits[b.input[0]], inits[b.input[1]]
        assert weight.data_type == TensorProto.FLOAT8E4M3FN
        assert scale.data_type == TensorProto.FLOAT16 and list(scale.dims) == [weight.dims[-1]]
    reference = onnx.load(str(path))
    worst = 0.0
    for feeds in held_out:
        expected, _ = run(reference, feeds)
        found, evaluator = run(proto, feeds)
        assert "float16 rounding emulated" in evaluator
        for out, value in expected.items():
            error = np.abs(np.asarray(found[out], np.float64) - value).max() / np.abs(value).max()
            worst = max(worst, float(error))
    assert 1e-3 < worst <= bar  # float8 error, not none, and within the bar


@pytest.mark.slow
def test_the_command_line_converts_verifies_and_explains(zoo, tmp_path, capsys):
    path, calibration, held_out = zoo["bert"]
    data, inputs = tmp_path / "cal.npz", tmp_path / "in.npz"
    np.savez(data, **{k: np.concatenate([b[k] for b in calibration]) for k in calibration[0]})
    np.savez(inputs, **held_out[0])
    out, plan = tmp_path / "bert.fp8.onnx", tmp_path / "bert.fp8.plan.json"
    args = ["convert", str(path), "-o", str(out), "--fp8", "--calibrate", str(data)]
    args += ["--plan", str(plan), "--verify", "--inputs", str(inputs), "--rtol", "0.05"]
    assert main(args) == 0
    shown = capsys.readouterr()
    assert "of them with float8 operands (plan: fp8)" in shown.out and "12 of 17" in shown.out
    assert "quantisers op by op" in shown.out and "warning" not in shown.err  # loads by default
    data_plan = json.loads(plan.read_text())
    assert data_plan["version"] == 2 and data_plan["summary"]["matrix_ops_fp8"] == 12
    assert main(["explain", str(plan), "/layers.0/mlp/mlp.0/MatMul"]) == 0
    explained = capsys.readouterr().out
    assert (
        "operand A '/layers.0/norm1/LayerNormalization_output_0': e4m3fn per tensor, " in explained
    )
    assert "operand B 'onnx::MatMul_239': e4m3fn per channel, weight: at conversion" in explained
    # check: the same model and data give the same plan; other data, other amax: still the same
    # --from-plan applies the reviewed float8 decisions and scales, with no data
    reviewed = tmp_path / "reviewed.onnx"
    assert main(["convert", str(path), "-o", str(reviewed), "--from-plan", str(plan)]) == 0
    assert reviewed.read_bytes() == out.read_bytes()
    edited = json.loads(plan.read_text())
    attention = "/layers.0/attention/MatMul"
    edited["fp8"][attention].update(precision="float8_e4m3fn", rule="fp8")
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    args = ["convert", str(path), "-o", str(tmp_path / "x.onnx"), "--from-plan"]
    assert main([*args, str(tmp_path / "edited.json")]) == 2
    assert f"puts '{attention}' in float8, but the model now keeps it" in capsys.readouterr().err
    check = ["check", str(path), "--baseline", str(plan), "--fp8", "--calibrate", str(data)]
    assert main(check) == 0
    other = tmp_path / "other.npz"
    np.savez(other, **{k: np.concatenate([b[k] for b in held_out]) for k in held_out[0]})
    assert main([*check[:-1], str(other)]) == 0
    assert "plan matches" in capsys.readouterr().out
    # a granularity or source that moved is a drift (exit 1)
    moved = json.loads(plan.read_text())
    moved["scales"][0]["granularity"] = "row"
    plan.write_text(json.dumps(moved))
    assert main(check) == 1
    assert "@@ scales: 1 changed @@" in capsys.readouterr().out
    # debug names float8 nodes with the plan
    assert main(["debug", str(path), str(out), "--inputs", str(inputs), "--plan", str(plan)]) == 0
    assert "float8_e4m3fn" in capsys.readouterr().out
    # converting the output again changes nothing (its quantisers and float8 weights stay)
    again = tmp_path / "again.onnx"
    assert main(["convert", str(out), "-o", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--fp8 needs --calibrate DATA"),
        (["--fp8-deny-names", "x"], None),
    ],
)
def test_float8_flag_errors_are_one_line_and_write_nothing(tmp_path, capsys, extra, message):
    path, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(chain(["MatMul", "Relu"]), str(path))
    args = ["convert", str(path), "-o", str(out), *(["--fp8"] if message else []), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (message or "--fp8-deny-names is only used with --fp8") in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_an_already_quantised_model_is_refused_with_fp8(zoo, tmp_path, capsys):
    path, calibration, _ = zoo["gpt"]
    ranges = gonnx.calibrate(str(path), calibration[:1])
    quantised = tmp_path / "q.onnx"
    gonnx.save(
        gonnx.convert(str(path), fp8=graphamp.Float8.static(), ranges=ranges).model, quantised
    )
    data = tmp_path / "cal.npz"
    np.savez(data, **calibration[0])
    out = tmp_path / "out.onnx"
    assert main(["convert", str(quantised), "-o", str(out), "--fp8", "--calibrate", str(data)]) == 2
    assert "already quantised (QuantizeLinear node" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(GraphampError, match="static scales from calibration"):
        gonnx.convert(str(path), fp8=graphamp.Float8.current(), ranges=ranges)
    with pytest.raises(GraphampError, match="needs ranges="):
        gonnx.convert(str(path), fp8=graphamp.Float8.static())


def test_an_older_opset_is_raised_to_21(tmp_path):
    """Low-type scales need opset 21: an opset-17 model is converted up by ONNX's converter."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["r"], ["y"], name="sum", keepdims=0)]  # fmt: skip
    proto = model(nodes, initializers=[w], shape=(8, 32), opset=17)
    feeds = [{"x": rng.standard_normal((8, 32)).astype(np.float32)} for _ in range(2)]
    ranges = gonnx.calibrate(proto, feeds, histograms=True)
    converted = gonnx.convert(proto, fp8=graphamp.Float8.static(keep_last=False), ranges=ranges)
    out = converted.to_proto()
    onnx.checker.check_model(out, full_check=True)
    assert next(o.version for o in out.opset_import if o.domain == "") == 21
    assert converted.plan.fp8["mm"].rule == "fp8"
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("DequantizeLinear") == 2 and "ReduceSum" in ops


def test_the_runtime_check_says_when_a_default_session_refuses_float8(tmp_path, monkeypatch):
    """A float8 QDQ MatMul with float32 activations and no bias Add after it: onnxruntime's
    default session fuses it into MatMulIntegerToFloat, which refuses float8; the check loads it
    with the QDQ fusion off and says in one line how to."""
    w8 = helper.make_tensor("w8", TensorProto.FLOAT8E4M3FN, [4, 4], [0.5] * 16)
    scales = [numpy_helper.from_array(np.array(0.1, np.float32), n) for n in ("sx", "sw")]
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w8", "sw"], ["wd"]),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    path = tmp_path / "q.onnx"
    onnx.save(model(nodes, initializers=[w8, *scales, zero]), str(path))
    original = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul"]), str(original))
    notes = check_loads(original, path)
    assert len(notes) == 1 and "default session refuses this float8 model" in notes[0]
    assert "session.disable_quant_qdq=1" in notes[0]
    # where QDQ fusion off is not enough (onnxruntime's MatMulAddFusion failing on a graph its
    # own optimizer fused, seen on BART), the line says what loads it instead
    real = runtime._load_error

    def also_without_qdq_fusion(path, *, optimised=False, qdq_fusion=True):
        error = real(path, optimised=optimised)
        return error if optimised else real(path, optimised=False, qdq_fusion=qdq_fusion)

    monkeypatch.setattr(runtime, "_load_error", also_without_qdq_fusion)
    (note,) = check_loads(original, path)
    assert "also with session.disable_quant_qdq=1" in note and "ORT_DISABLE_ALL" in note
    monkeypatch.undo()
    # and verification runs it (op by op, QDQ fusion off)
    outputs, _ = run(onnx.load(str(path)), {"x": np.ones((4, 4), np.float32)})
    assert np.allclose(outputs["y"], 4 * 0.5 * 0.1 * 0.1 * (1 / 0.1) * 0.1 * 10, rtol=0.1)


def test_the_faithful_evaluator_keeps_float8_weights_and_rounds_the_rest(zoo):
    path, calibration, _ = zoo["gpt"]
    ranges = gonnx.calibrate(str(path), calibration[:1])
    proto = gonnx.convert(str(path), fp8=graphamp.Float8.static(), ranges=ranges).to_proto()
    copy = emulated(proto, inferred_types(proto))
    kinds = {init.data_type for init in copy.graph.initializer}
    assert TensorProto.FLOAT8E4M3FN in kinds and TensorProto.FLOAT16 not in kinds


@pytest.mark.slow
def test_tune_finds_the_float8_nodes_to_keep_for_a_tolerance(zoo, tmp_path, capsys):
    path, calibration, held_out = zoo["bert"]
    data, inputs = tmp_path / "cal.npz", tmp_path / "in.npz"
    np.savez(data, **{k: np.concatenate([b[k] for b in calibration]) for k in calibration[0]})
    np.savez(inputs, **held_out[0])
    out, plan = tmp_path / "tuned.onnx", tmp_path / "tuned.json"
    args = ["tune", str(path), "-o", str(out), "--inputs", str(inputs), "--fp8"]
    args += ["--calibrate", str(data), "--plan", str(plan)]
    assert main([*args, "--rtol", "0.05"]) == 0  # float8 everywhere meets it
    assert "kept float16: 0 of 12 float8 nodes" in capsys.readouterr().out
    assert main([*args, "--rtol", "0.015"]) == 0
    shown = capsys.readouterr().out
    kept = json.loads(plan.read_text())["fp8"]
    denied = sorted(n for n, d in kept.items() if d["rule"] == "fp8_tuned")
    assert denied and len(denied) < 12 and "--fp8-deny-names" in shown
    reference = onnx.load(str(path))
    expected, _ = run(reference, held_out[0])
    found, _ = run(onnx.load(str(out)), held_out[0])
    for name, value in expected.items():  # the written model meets the tolerance
        assert np.abs(found[name] - value).max() <= 0.015 * np.abs(value).max()
    out.unlink()
    assert main([*args, "--rtol", "0.0001"]) == 1  # float16 alone misses it
    assert "without --fp8 first; nothing written" in " ".join(capsys.readouterr().out.split())
    assert not out.exists()


def _matmul_stack(count: int, size: int, axis_last: bool = True) -> onnx.ModelProto:
    """x -> (MatMul with a size x size weight, or Gemm with transB, -> Relu) x count -> sum:
    weights of size**2 float32 each, large enough to stay in the file when read."""
    rng = np.random.default_rng(0)
    nodes, inits, value = [], [], "x"
    for index in range(count):
        w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        w[:, 3] *= 1e-6  # a small channel (of either layout's output axis) among the others
        inits.append(numpy_helper.from_array(w, f"w{index}"))
        if axis_last or index % 2:
            nodes.append(helper.make_node("MatMul", [value, f"w{index}"], [f"m{index}"]))
        else:
            nodes.append(helper.make_node("Gemm", [value, f"w{index}"], [f"m{index}"], transB=1))
        nodes[-1].name = f"mm{index}"
        nodes.append(helper.make_node("Relu", [f"m{index}"], [f"r{index}"], name=f"relu{index}"))
        value = f"r{index}"
    nodes.append(helper.make_node("ReduceSum", [value], ["y"], name="sum", keepdims=0))
    return model(nodes, initializers=inits, shape=(8, size), opset=17)


def _stored_values(proto: onnx.ModelProto) -> dict[str, tuple[int, bytes]]:
    return {
        i.name: (i.data_type, numpy_helper.to_array(i).tobytes()) for i in proto.graph.initializer
    }


def _ranges(proto: onnx.ModelProto) -> graphamp.Ranges:
    """Calibrated-looking ranges of every matrix op's activation (no run needed)."""
    from graphamp.numerics.ranges import Ranges, TensorRange

    values = ["x", *(n.output[0] for n in proto.graph.node if n.op_type == "Relu")]
    return Ranges({v: TensorRange(max_abs=4.0, min_abs=1e-3) for v in values}, batches=4)


@pytest.mark.slow
@pytest.mark.parametrize("external", [False, True])
def test_weights_left_on_disk_are_quantised_a_block_at_a_time(tmp_path, external):
    """A model whose weights stay in its file (or its external data) while converted: each
    float8 weight is read from there and written a block at a time, so memory does not grow
    with the number of weights (three or nine weights of 4 MiB: the same peak), and the file
    is byte for byte what the same model converted in memory gives, its opset raised from 17
    to 21; the output keeps external data where the input had it."""
    import tracemalloc

    from graphamp.onnx.dialect.float8 import Float8Weight
    from graphamp.onnx.io.infile import StreamedModel

    settings = graphamp.Float8.static(keep_last=False)
    peaks = []
    for count in (3, 9):
        proto = _matmul_stack(count, 1024, axis_last=False)
        path, out = tmp_path / f"stack{count}.onnx", tmp_path / f"out{count}.onnx"
        onnx.save(proto, str(path), save_as_external_data=external, location=f"{path.name}.data")
        ranges = _ranges(proto)
        tracemalloc.start()
        try:
            converted = gonnx.convert(str(path), fp8=settings, ranges=ranges)
            streamed = converted._converted
            assert isinstance(streamed, StreamedModel) and streamed.external == external
            weights = [d for d in streamed.data.values() if isinstance(d, Float8Weight)]
            assert len(weights) == count
            converted.save(out)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert (tmp_path / f"{out.name}.data").exists() == external
        onnx.checker.check_model(str(out), full_check=True)
        written = onnx.load(str(out))
        assert next(o.version for o in written.opset_import if o.domain == "") == 21
        fresh = _matmul_stack(count, 1024, axis_last=False)  # (saving moved proto's data out)
        in_memory = gonnx.convert(fresh, fp8=settings, ranges=ranges).to_proto()
        if not external:
            assert written.SerializeToString() == in_memory.SerializeToString()
        assert [n.SerializeToString() for n in written.graph.node] == [
            n.SerializeToString() for n in in_memory.graph.node
        ]
        assert _stored_values(written) == _stored_values(in_memory)
        stored = [i.dims for i in written.graph.initializer if i.data_type == _FLOAT8 and i.dims]
        assert stored == [[1024, 1024]] * count
    # six more float8 weights (6 MiB of them, 24 MiB read) cost no more memory
    assert peaks[1] < peaks[0] + 1024 * 1024, peaks


def test_a_weight_computed_at_run_time_is_kept_with_a_reason(tmp_path):
    """MatMul(x, Transpose(w)) where the exporter did not fold the Transpose: static scaling
    stores a weight in float8 at conversion, and this one is computed: the node keeps the low
    type with rule fp8_operands, its reason naming the Transpose (and the model converts)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    v = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "v")
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], name="t"),
        helper.make_node("MatMul", ["x", "wt"], ["h"], name="mm"),
        helper.make_node("MatMul", ["h", "v"], ["h2"], name="mm2"),
        helper.make_node("Relu", ["h2"], ["y"], name="relu"),
    ]
    proto = model(nodes, initializers=[w, v], shape=(8, 32))
    feeds = [{"x": rng.standard_normal((8, 32)).astype(np.float32)} for _ in range(2)]
    ranges = gonnx.calibrate(proto, feeds, histograms=True)
    result = gonnx.convert(proto, fp8=graphamp.Float8.static(keep_last=False), ranges=ranges)
    kept, chosen = result.plan.fp8["mm"], result.plan.fp8["mm2"]
    assert kept.rule == "fp8_operands" and "computed from stored values" in kept.reason
    assert "Transpose node 't'" in kept.reason and chosen.rule == "fp8"
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node].count("DequantizeLinear") == 2  # mm2's A and B


def test_matrix_ops_inside_if_branches_keep_the_low_type_with_a_reason(tmp_path):
    """Optimum's merged decoders and torch.cond exports hold MatMuls in If branches: the
    float8 writer writes scales and quantisers in the main graph only, and refused the whole
    model ("not in the written model", exit 2). The branches' products stay in the low type
    (rule fp8_shape, naming the body); the main graph's go float8."""
    rng = np.random.default_rng(0)

    def weight(name: str) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), name)

    def branch(name: str, w: str) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [8, 32])
        node = helper.make_node("MatMul", ["h", w], [f"{name}_y"], name=f"{name}_mm")
        return helper.make_graph([node], name, [], [out])

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"], name="first"),
        helper.make_node("ReduceSum", ["h"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        helper.make_node(
            "If", ["c"], ["b"], name="if",
            then_branch=branch("then", "wa"), else_branch=branch("else", "wb"),
        ),
        helper.make_node("MatMul", ["b", "w1"], ["y"], name="last"),
    ]  # fmt: skip
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    proto = model(
        nodes, initializers=[weight(n) for n in ("w0", "wa", "wb", "w1")] + [zero], shape=(8, 32)
    )
    feeds = [{"x": rng.standard_normal((8, 32)).astype(np.float32)} for _ in range(2)]
    ranges = gonnx.calibrate(proto, feeds, histograms=True)
    result = gonnx.convert(proto, fp8=graphamp.Float8.static(keep_last=False), ranges=ranges)
    fp8 = result.plan.fp8
    assert fp8["first"].rule == fp8["last"].rule == "fp8"
    inside = fp8["if/then_branch/then_mm"]
    assert inside.rule == "fp8_shape" and "inside the body" in inside.reason
    out = result.to_proto()
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node].count("DequantizeLinear") == 4


def test_a_float8_deny_glob_that_matches_no_node_is_warned_about_and_strict_refuses_it():
    """A typo in --fp8-deny-names (one graphamp tune --fp8 prints, copied by hand) left the
    nodes it meant in float8 without a word, where --deny-name says so."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]  # fmt: skip
    proto = model(nodes, initializers=[w], shape=(8, 32))
    ranges = gonnx.calibrate(proto, [{"x": rng.standard_normal((8, 32)).astype(np.float32)}])
    fp8 = graphamp.Float8.static(deny_names=("fc9*",), keep_last=False)
    warning = "float8 deny_names rule (--fp8-deny-names) 'fc9*' matches no node; did you mean"
    with pytest.warns(graphamp.PolicyWarning, match=re.escape(warning)):
        gonnx.convert(proto, fp8=fp8, ranges=ranges)
    with pytest.raises(GraphampError, match=r"'fc9\*' matches no node.*\(--strict\)"):
        gonnx.convert(proto, fp8=fp8, ranges=ranges, strict=True)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_k_comes_from_the_stored_weight_where_the_activation_leaves_it_symbolic(op):
    """An attention output reshaped with -1 before its projection (every TorchScript export of
    a Hugging Face attention block) leaves A's last dimension symbolic: K was 'unknown' and the
    product kept out of float8 though its stored weight fixes K."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), "w")
    attributes = {"transB": 1} if op == "Gemm" else {}
    weight = numpy_helper.from_array(
        numpy_helper.to_array(w).T.copy() if op == "Gemm" else numpy_helper.to_array(w), "w"
    )
    nodes = [helper.make_node(op, ["x", "w"], ["h"], name="proj", **attributes),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]  # fmt: skip
    proto = model(nodes, initializers=[weight], shape=(8, "hidden"))
    feeds = [{"x": rng.standard_normal((8, 32)).astype(np.float32)} for _ in range(2)]
    ranges = gonnx.calibrate(proto, feeds, histograms=True)
    result = gonnx.convert(proto, fp8=graphamp.Float8.static(keep_last=False), ranges=ranges)
    decision = result.plan.fp8["proj"]
    assert decision.rule == "fp8" and decision.reason.startswith("K = 32, N = 48")
    onnx.checker.check_model(result.to_proto(), full_check=True)


def test_the_summary_counts_float8_weights_at_one_byte(tmp_path, capsys):
    """'weights converted 2 (512.0 KiB -> 256.0 KiB)' where the file holds one float16 and
    one float8 weight (192 KiB): the line counted every weight at the low type's size."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) * 0.1, name)
        for name in ("w1", "w2")
    ]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]  # fmt: skip
    path, data = tmp_path / "m.onnx", tmp_path / "cal.npz"
    onnx.save(model(nodes, initializers=weights, shape=(8, 256)), str(path))
    np.savez(data, x=rng.standard_normal((16, 256)).astype(np.float32))
    out = tmp_path / "o.onnx"
    assert main(["convert", str(path), "-o", str(out), "--fp8", "--calibrate", str(data)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "512.0 KiB -> 192.0 KiB" in printed  # fc2 is kept (the last product): float16
    assert "of them stored in 8 bits │ 1" in printed
    stored = sum(numpy_helper.to_array(i).nbytes for i in onnx.load(str(out)).graph.initializer)
    assert abs(stored - 192 * 1024) < 1024
