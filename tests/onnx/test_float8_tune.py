"""``graphamp tune --fp8`` on a model with one planted sensitive product: the float8
switchable model computes what the real conversions compute, the search keeps the sensitive
MatMul and only it (the others stay float8), the plan says why with the errors measured, the
result holds on held-out data, and a re-conversion from the plan keeps it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import graphamp
import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.onnx.numerics.fp8_switchable import Fp8Switchable
from graphamp.onnx.numerics.fp8_tuning import tune_fp8
from graphamp.onnx.numerics.runtime import run
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy
from tests.helpers import model

SIZE = 32  # K and N multiples of 16: every product may take float8
CHAIN = 4  # products before the planted one
RTOL = 0.2


def planted() -> onnx.ModelProto:
    """x -> (MatMul -> Relu) x CHAIN -> h; y = h @ Ws - h @ Wl with Wl = Ws + 0.01 E.

    y is the small difference of two large products: a float8 rounding of Ws (2**-4 relative
    to h @ Ws) is many times y itself, so ``sensitive`` cannot take float8. ``last`` (the last
    matrix op) keeps the low type by the fp8 rules' keep_last; the chain's products add their
    ordinary few-percent errors and may all take float8 at the test's tolerance."""
    rng = np.random.default_rng(0)
    nodes, inits, value = [], [], "x"
    for index in range(CHAIN):
        w = (rng.standard_normal((SIZE, SIZE)) * np.sqrt(2 / SIZE)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{index}"))
        product = helper.make_node("MatMul", [value, f"w{index}"], [f"m{index}"], name=f"mm{index}")
        nodes.append(product)
        nodes.append(helper.make_node("Relu", [f"m{index}"], [f"r{index}"], name=f"relu{index}"))
        value = f"r{index}"
    ws = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    wl = ws + 0.01 * rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    inits += [numpy_helper.from_array(ws, "ws"), numpy_helper.from_array(wl, "wl")]
    nodes += [
        helper.make_node("MatMul", [value, "ws"], ["s"], name="sensitive"),
        helper.make_node("MatMul", [value, "wl"], ["l"], name="last"),
        helper.make_node("Sub", ["s", "l"], ["y"], name="difference"),
    ]
    return model(nodes, initializers=inits, shape=(8, SIZE), opset=17)


def batches(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, SIZE)).astype(np.float32)} for _ in range(count)]


def error(proto: onnx.ModelProto, reference: onnx.ModelProto, data) -> float:
    worst = 0.0
    for feeds in data:
        want, _ = run(reference, feeds)
        got, _ = run(proto, feeds)
        for name, value in want.items():
            worst = max(worst, float(np.abs(got[name] - value).max() / np.abs(value).max()))
    return worst


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp8tune")
    path = folder / "planted.onnx"
    onnx.save(planted(), str(path))
    calibration, tuning, held_out = batches(4, 0), batches(4, 1), batches(8, 2)
    ranges = gonnx.calibrate(str(path), calibration, histograms=True)
    return path, ranges, calibration, tuning, held_out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_switchable_model_computes_each_set_as_its_real_conversion(setup, dtype):
    path, ranges, _, tuning, _ = setup
    policy = Policy.create(dtype=dtype)
    full = gonnx.convert(str(path), policy, fp8=graphamp.Float8.static(), ranges=ranges)
    chosen = [n for n, d in full.plan.fp8.items() if d.rule == "fp8"]
    assert sorted(chosen) == ["mm0", "mm1", "mm2", "mm3", "sensitive"]
    switch = Fp8Switchable(full.to_proto(), onnx.load(str(path)), full.graph, chosen, dtype)
    for float8 in (chosen, ["mm1", "sensitive"], []):
        denied = tuple(n for n in chosen if n not in float8)
        settings = graphamp.Float8.static(deny_names=denied)
        real = gonnx.convert(str(path), policy, fp8=settings, ranges=ranges).to_proto()
        for feeds in tuning[:2]:
            want, _ = run(real, feeds)
            got = switch.run(feeds, float8)
            assert np.array_equal(got["y"], want["y"]), float8  # bit for bit


def test_tune_keeps_the_planted_product_and_only_it(setup):
    path, ranges, _, tuning, held_out = setup
    reference = onnx.load(str(path))
    plain = gonnx.convert(str(path), fp8=graphamp.Float8.static(), ranges=ranges).to_proto()
    assert error(plain, reference, tuning) > 10 * RTOL  # float8 everywhere misses by far
    result = tune_fp8(path, tuning, rtol=RTOL, ranges=ranges)
    assert result.met and result.kept == ("sensitive",)
    assert result.alone["sensitive"] > RTOL > max(result.alone[f"mm{i}"] for i in range(CHAIN))
    plan = result.conversion.plan
    fp8 = {name: decision.rule for name, decision in plan.fp8.items()}
    assert fp8 == {
        "mm0": "fp8", "mm1": "fp8", "mm2": "fp8", "mm3": "fp8",
        "sensitive": "fp8_tuned", "last": "fp8_deny",
    }  # fmt: skip
    reason = plan.fp8["sensitive"].reason
    assert "graphamp tune --fp8" in reason and f"rtol {RTOL:g}" in reason
    alone = float(reason.split("it puts the outputs ")[1].split(" ")[0])
    assert alone > RTOL and "rank 1 of 5" in reason  # its error alone, measured
    assert "keeping the 1 products of largest error alone meets the tolerance" in reason
    tuned = result.conversion.to_proto()
    assert error(tuned, reference, tuning) <= RTOL
    assert error(tuned, reference, held_out) <= RTOL  # data the search never saw
    # the tuned model stores the four chain weights in float8 and ws in float16
    kinds = {i.name: i.data_type for i in tuned.graph.initializer}
    assert kinds["ws"] == onnx.TensorProto.FLOAT16
    stored = [i for i in tuned.graph.initializer if len(i.dims) == 2]  # (not zero points)
    assert sum(i.data_type == onnx.TensorProto.FLOAT8E4M3FN for i in stored) == CHAIN


def test_the_command_writes_the_tuned_plan_and_a_reconversion_keeps_it(setup, tmp_path, capsys):
    path, _, calibration, tuning, _ = setup
    cal, inputs = tmp_path / "cal.npz", tmp_path / "tune.npz"
    np.savez(cal, x=np.concatenate([b["x"] for b in calibration]))
    np.savez(inputs, x=np.concatenate([b["x"] for b in tuning]))
    out, plan_path = tmp_path / "tuned.onnx", tmp_path / "tuned.plan.json"
    args = ["tune", str(path), "-o", str(out), "--inputs", str(inputs), "--rtol", str(RTOL)]
    assert main([*args, "--fp8", "--calibrate", str(cal), "--plan", str(plan_path)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "kept float16: 1 of 5 float8 nodes" in shown and "--fp8-deny-names 'sensitive'" in shown
    saved = json.loads(plan_path.read_text())["fp8"]
    assert saved["sensitive"]["rule"] == "fp8_tuned"
    again = tmp_path / "again.onnx"
    assert main(["convert", str(path), "-o", str(again), "--from-plan", str(plan_path)]) == 0
    assert Plan.load(plan_path).fp8["sensitive"].reason in main_explain(plan_path, capsys)
    assert _stored(onnx.load(str(again))) == _stored(onnx.load(str(out)))


def main_explain(plan_path, capsys) -> str:
    assert main(["explain", str(plan_path), "sensitive"]) == 0
    return " ".join(capsys.readouterr().out.split())


def _stored(proto: onnx.ModelProto) -> dict[str, tuple[int, bytes]]:
    return {
        i.name: (i.data_type, numpy_helper.to_array(i).tobytes()) for i in proto.graph.initializer
    }


def test_a_real_conversion_that_misses_keeps_the_next_products_by_rank(setup, monkeypatch):
    """The real check is the truth: where it misses what the switchable model met, tune keeps
    the next product by error alone and checks again (the miss is simulated once here)."""
    from graphamp.onnx.numerics import fp8_tuning

    path, ranges, _, tuning, _ = setup
    real_check, calls = fp8_tuning._checked, []

    def first_misses(*args, **kwargs):
        errors, met = real_check(*args, **kwargs)
        calls.append(met)
        return errors, met and len(calls) > 1

    monkeypatch.setattr(fp8_tuning, "_checked", first_misses)
    result = tune_fp8(path, tuning, rtol=RTOL, ranges=ranges)
    second = max((f"mm{i}" for i in range(CHAIN)), key=lambda n: result.alone[n])
    assert result.met and result.kept == ("sensitive", second) and len(calls) == 2
    reason = result.conversion.plan.fp8[second].reason
    assert result.conversion.plan.fp8[second].rule == "fp8_tuned"
    assert "the real conversion missed the tolerance the switchable model met" in reason


def test_the_snippets_tune_prints_quote_a_hostile_node_name():
    """A node name is the model's: in the TOML snippet a quote or control character is
    escaped and reads back as the same name; in the shell snippet a quote cannot end the
    word (and run what follows when pasted)."""
    import tomllib

    from graphamp.onnx.numerics.fp8_tuning import _quoted
    from graphamp.onnx.numerics.tuning import _toml_string

    name = 'a"b\\c\nd\x1b[31m\u2028'
    text = f"deny_names = [{_toml_string(name)}]"
    assert text.isprintable()
    assert tomllib.loads(text)["deny_names"] == [name]
    assert _quoted("x'; rm -rf ~; echo '") == "'x'\"'\"'; rm -rf ~; echo '\"'\"''"
