"""Kept products' weights stored int8 with float8 (``convert --fp8 --fp8-kept-int8``,
``Float8.static(kept_int8=True)``): a matrix op the float8 rules keep in the low type for its
shape, range, tuning or as the last one reads its weight through a DequantizeLinear of an int8
copy with one scale per output channel; deny names and weights other ops read stay as they
are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import graphamp
import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import GraphampError
from graphamp.onnx.dialect import float8
from graphamp.onnx.numerics.fp8_switchable import Fp8Switchable
from graphamp.onnx.numerics.fp8_tuning import _convert
from graphamp.onnx.numerics.runtime import run
from graphamp.plans.plan import Plan
from graphamp.plans.report import explain
from graphamp.policy.policy import Policy
from tests.helpers import model, weight
from tests.onnx.test_float8_tables import converted_again_and_from_the_plan
from tests.onnx.test_float8_tune import batches as planted_batches
from tests.onnx.test_float8_tune import planted

# x -> mm (float8) -> odd (N = 40: shape) -> gemm (transposed weight, K = 40: shape) -> twin and
# twin_deny (one weight; the second denied by name) -> Add -> head (the last matrix op)
WEIGHTS = {
    "w_mm": (64, 64), "w_odd": (64, 40), "w_gemm": (48, 40), "w_tw": (48, 40), "w_head": (40, 16),
}  # fmt: skip
DENY = ("twin_d*",)


def kept_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "w_mm"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w_odd"], ["o"], name="odd"),
        helper.make_node("Relu", ["o"], ["r2"], name="relu2"),
        helper.make_node("Gemm", ["r2", "w_gemm", "b_gemm"], ["g"], name="gemm", transB=1),
        helper.make_node("Relu", ["g"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "w_tw"], ["t1"], name="twin"),
        helper.make_node("MatMul", ["r3", "w_tw"], ["t2"], name="twin_deny"),
        helper.make_node("Add", ["t1", "t2"], ["s"], name="add"),
        helper.make_node("MatMul", ["s", "w_head"], ["y"], name="head"),
    ]
    inits = [
        weight(name, shape, scale=float(np.sqrt(2 / shape[0])), seed=index)
        for index, (name, shape) in enumerate(WEIGHTS.items())
    ]
    inits.append(weight("b_gemm", (48,), scale=0.1, seed=9))
    return model(nodes, initializers=inits, shape=(8, 64))


def feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((8, 64)).astype(np.float32)}


def converted(proto: onnx.ModelProto, dtype: str = "float16", **settings) -> gonnx.Conversion:
    ranges = gonnx.calibrate(proto, [feeds(seed) for seed in range(3)], histograms=True)
    fp8 = graphamp.Float8.static(deny_names=DENY, **settings)
    return gonnx.convert(proto, Policy.create(dtype=dtype), fp8=fp8, ranges=ranges)


def reference_channels(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's int8 weight and float16 scales along ``axis``: max |channel| / 127 rounded up
    to a float16 value, then rint."""
    moved = np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)
    exact = (np.abs(moved).max(axis=1) / np.float32(127)).astype(np.float32)
    scales = exact.astype(np.float16)
    below = scales.astype(np.float32) < exact
    scales[below] = np.nextafter(scales[below], np.float16(np.inf))
    shape = [1] * values.ndim
    shape[axis] = -1
    ints = np.rint(values / scales.astype(np.float32).reshape(shape))
    return np.clip(ints, -127, 127).astype(np.int8), scales


@pytest.mark.parametrize(("shape", "axis"), [((64, 40), 1), ((48, 40), 0), ((8, 3, 3, 3), 0)])
def test_channels_round_trip_as_numpy_computes_them(shape, axis):
    values = numpy_helper.to_array(weight("w", shape, seed=3)).copy()
    values[..., 0] *= 1e3  # a spike in one channel, or in every one on axis 0
    ints, scales = float8.quantise_channels_int8(values, axis, np.float16)
    expected_ints, expected_scales = reference_channels(values, axis)
    assert ints.dtype == np.int8 and ints.shape == values.shape and ints.flags.c_contiguous
    assert scales.dtype == np.float16 and scales.shape == (shape[axis],)
    np.testing.assert_array_equal(ints, expected_ints)
    np.testing.assert_array_equal(scales.view(np.uint16), expected_scales.view(np.uint16))
    step = np.expand_dims(scales.astype(np.float32), [a for a in range(len(shape)) if a != axis])
    assert np.all(np.abs(ints * step - values) <= step / 2)
    moved = np.moveaxis(np.abs(ints.astype(np.int32)), axis, 0).reshape(shape[axis], -1)
    assert np.all(moved.max(axis=1) >= 126)  # each channel's largest value uses the grid


def test_kept_products_read_an_int8_weight_and_the_rest_stay_as_they_were():
    result = converted(kept_model(), kept_int8=True)
    rules = {name: decision.rule for name, decision in result.plan.fp8.items()}
    assert rules == {
        "mm": "fp8", "odd": "fp8_shape", "gemm": "fp8_shape", "twin": "fp8_shape",
        "twin_deny": "fp8_deny", "head": "fp8_deny",
    }  # fmt: skip
    int8 = {r.tensor: r for r in result.plan.scales if r.format == "int8"}
    assert sorted(int8) == ["w_gemm", "w_head", "w_odd"]
    assert int8["w_odd"].detail == {"axis": 1} and int8["w_gemm"].detail == {"axis": 0}
    assert (int8["w_head"].granularity, int8["w_head"].source) == ("channel", "weight")
    assert int8["w_head"].consumers == ["head"]
    for node in ("odd", "gemm", "head"):
        assert "stored int8 with one scale per output channel" in result.plan.fp8[node].reason
    # the twins' weight: one is denied by name, so the other keeps it as it is too
    for node in ("twin", "twin_deny"):
        assert "int8" not in result.plan.fp8[node].reason
    proto = result.to_proto()
    onnx.checker.check_model(proto, full_check=True)
    inits = {init.name: init for init in proto.graph.initializer}
    assert not {"w_odd", "w_gemm", "w_head"} & set(inits)  # no float16 copy beside the int8
    assert inits["w_tw"].data_type == TensorProto.FLOAT16
    assert inits["w_mm/fp8"].data_type == TensorProto.FLOAT8E4M3FN
    for name in ("w_odd", "w_gemm", "w_head"):
        assert inits[f"{name}/int8"].data_type == TensorProto.INT8
    summary = result.plan.summary()
    assert summary["matrix_ops_fp8"] == 1 and summary["scales"] == len(result.plan.scales)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_runtime_reads_the_int8_weight_exactly(dtype):
    proto = converted(kept_model(), dtype, kept_int8=True).to_proto()
    inits = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    restored = {"w_odd": 1, "w_gemm": 0}  # the weight and its N axis
    proto.graph.output.extend(
        helper.make_empty_tensor_value_info(f"{name}/int8_dq") for name in restored
    )
    faithful, _ = run(proto, feeds(5))
    runtimes = {"faithful evaluator": faithful}
    if dtype == "float16":  # onnxruntime's CPU provider has no bfloat16 DequantizeLinear
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        session = ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])
        x = {"x": feeds(5)["x"].astype(np.float16)}
        names = [output.name for output in proto.graph.output]
        runtimes["onnxruntime"] = dict(zip(names, session.run(names, x), strict=True))
        runtimes["onnx.reference"] = dict(
            zip(names, ReferenceEvaluator(proto).run(names, x), strict=True)
        )
    original = {init.name: numpy_helper.to_array(init) for init in kept_model().graph.initializer}
    for name, axis in restored.items():
        ints, scales = inits[f"{name}/int8"], inits[f"{name}/int8_scale"]
        assert str(scales.dtype) == dtype
        expected = float8.quantise_channels_int8(original[name], axis, scales.dtype.type)
        np.testing.assert_array_equal(ints, expected[0])
        # int8 x a 16-bit scale is exact in float32: one rounding to the low type
        shape = [1, 1]
        shape[axis] = -1
        want = (ints * scales.astype(np.float32).reshape(shape)).astype(scales.dtype)
        for runtime, outputs in runtimes.items():
            got = np.asarray(outputs[f"{name}/int8_dq"])
            # (the faithful evaluator gives low-type values held in float32)
            assert got.dtype in (want.dtype, np.float32), runtime
            np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
        # within half an int8 step of the float32 weight (and the low type's rounding)
        step = np.abs(scales.astype(np.float32)).reshape(shape)
        bound = step / 2 + np.abs(want.astype(np.float32)) * 2.0**-8
        assert np.all(np.abs(want.astype(np.float32) - original[name]) <= bound)


def error(proto: onnx.ModelProto, reference: onnx.ModelProto, seeds: range) -> float:
    worst = 0.0
    for seed in seeds:
        want, _ = run(reference, feeds(seed))
        got, _ = run(proto, feeds(seed))
        worst = max(worst, float(np.abs(got["y"] - want["y"]).max() / np.abs(want["y"]).max()))
    return worst


def stored_bytes(proto: onnx.ModelProto) -> int:
    return sum(numpy_helper.to_array(init).nbytes for init in proto.graph.initializer)


def test_the_int8_weights_halve_their_bytes_at_a_small_error():
    source = kept_model()
    plain, kept = converted(source).to_proto(), converted(source, kept_int8=True).to_proto()
    # three weights from 2 bytes a value to 1, plus a 16-bit scale per output channel
    int8 = {"w_odd": 40, "w_gemm": 48, "w_head": 16}
    saved = sum(int(np.prod(WEIGHTS[name])) - 2 * channels for name, channels in int8.items())
    assert stored_bytes(plain) - stored_bytes(kept) == saved
    # int8's rounding of three weights adds little to float8's own error
    base, with_int8 = error(plain, source, range(10, 14)), error(kept, source, range(10, 14))
    assert 0 < with_int8 <= 1.25 * base


def test_the_plan_records_the_int8_weights_and_explain_says_so(tmp_path):
    plan = converted(kept_model(), kept_int8=True).plan
    assert plan.fp8_settings is not None and plan.fp8_settings["kept_int8"] is True
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert Plan.load(path).to_json() == plan.to_json()
    report = explain(Plan.load(path), "odd")
    assert "rule fp8_shape: K = 64, N = 40" in report and "stored int8" in report
    assert "operand B 'w_odd': int8 per channel, weight: at conversion" in report
    assert "operand A 'r1': not quantised (float16)" in report
    # without the option: no int8 record, the settings do not name it
    plain = converted(kept_model()).plan
    assert not [r for r in plain.scales if r.format == "int8"]
    assert "kept_int8" not in (plain.fp8_settings or {})


def test_kept_int8_needs_the_static_onnx_recipe():
    with pytest.raises(GraphampError, match="kept_int8=True stores kept products' weights"):
        graphamp.Float8.current(kept_int8=True)
    with pytest.raises(GraphampError, match="kept_int8 must be True or False"):
        graphamp.Float8.static(kept_int8=1)
    settings = graphamp.Float8.static(kept_int8=True)
    assert graphamp.Float8.from_dict(settings.to_dict()) == settings
    import torch

    from graphamp.fx import convert as fx_convert

    module = torch.nn.Sequential(torch.nn.Linear(32, 40), torch.nn.Linear(40, 32))
    x = torch.randn(4, 32)
    with pytest.raises(GraphampError, match="ONNX models with the static recipe only"):
        fx_convert(module, (x,), fp8=settings, calibrate=[(x,)])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tune_s_switchable_model_reads_the_kept_int8_weights_as_the_conversion(dtype):
    source = planted()
    calibration = planted_batches(4, 0)
    ranges = gonnx.calibrate(source, calibration, histograms=True)
    policy = Policy.create(dtype=dtype)
    settings = graphamp.Float8.static(kept_int8=True)
    full = gonnx.convert(source, policy, fp8=settings, ranges=ranges)
    chosen = [n for n, d in full.plan.fp8.items() if d.rule == "fp8"]
    assert "last" not in chosen and "int8" in full.plan.fp8["last"].reason
    switch = Fp8Switchable(full.to_proto(), source, full.graph, chosen, dtype, kept_int8=True)
    for in_float8 in (chosen, ["mm1", "sensitive"], []):
        # the others kept as tune keeps them (rule fp8_tuned), their weights int8
        kept = {n: "kept by the test" for n in chosen if n not in in_float8}
        real = _convert(source, policy, settings, ranges, kept).to_proto()
        assert sum(i.data_type == TensorProto.INT8 for i in real.graph.initializer) == len(kept) + 1
        for feeds in planted_batches(2, 1):
            want, _ = run(real, feeds)
            got = switch.run(feeds, in_float8)
            assert np.array_equal(got["y"], want["y"]), in_float8  # bit for bit


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    source, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(kept_model(), str(source))
    np.savez(data, x=np.concatenate([feeds(seed)["x"] for seed in range(3)]))
    return source, data


def test_converting_again_or_from_the_plan_keeps_the_int8_weights(files, capsys):
    source, data = files
    # the int8 weights and their DequantizeLinears stay, converted again or from the plan
    fp8 = ["--fp8", "--fp8-kept-int8", "--fp8-deny-names", *DENY, "--calibrate", str(data)]
    _, plan = converted_again_and_from_the_plan(source, fp8)
    written = json.loads(plan.read_text())
    assert "stored int8" in written["fp8"]["head"]["reason"]
    assert {r["tensor"] for r in written["scales"] if r["format"] == "int8"} == {
        "w_odd", "w_gemm", "w_head",
    }  # fmt: skip
    # --verify passes against the float32 model (the faithful evaluator runs the int8 DQs)
    verified = source.with_name("verified.onnx")
    capsys.readouterr()
    argv = ["convert", str(source), "-o", str(verified), *fp8, "--verify", "--rtol", "0.1"]
    assert main(argv) == 0
    # check without the flag: the int8 records are a drift; with it, none
    check = ["check", str(source), "--baseline", str(plan), "--fp8", "--calibrate", str(data)]
    check += ["--fp8-deny-names", *DENY]
    capsys.readouterr()
    assert main(check) == 1
    assert "w_odd" in capsys.readouterr().out
    assert main([*check, "--fp8-kept-int8"]) == 0


def test_tune_with_int8_kept_weights_from_the_command_line(files, tmp_path, capsys):
    source, data = files
    out, plan = tmp_path / "tuned.onnx", tmp_path / "tuned.plan.json"
    args = ["tune", str(source), "-o", str(out), "--inputs", str(data), "--rtol", "0.1"]
    fp8 = ["--fp8", "--fp8-kept-int8", "--calibrate", str(data), "--plan", str(plan)]
    assert main([*args, *fp8]) == 0
    written = json.loads(plan.read_text())
    assert written["fp8_settings"]["kept_int8"] is True
    assert {r["tensor"] for r in written["scales"] if r["format"] == "int8"} >= {"w_odd", "w_head"}
    # the planted model (tests/onnx/test_float8_tune.py): its output is the small difference of
    # two products, so int8 weights on the two it keeps miss any tolerance: one line, exit 1
    planted_path = tmp_path / "planted.onnx"
    onnx.save(planted(), str(planted_path))
    inputs = tmp_path / "planted.npz"
    np.savez(inputs, x=np.concatenate([b["x"] for b in planted_batches(4, 0)]))
    missed = tmp_path / "missed.onnx"
    argv = ["tune", str(planted_path), "-o", str(missed), "--inputs", str(inputs)]
    argv += ["--rtol", "0.2", "--fp8", "--fp8-kept-int8", "--calibrate", str(inputs)]
    capsys.readouterr()
    assert main(argv) == 1
    shown = " ".join(capsys.readouterr().out.split())
    assert "their weights int8" in shown and "tune without --fp8-kept-int8" in shown
    assert not missed.exists()
