"""The numerics commands: convert/plan --calibrate DATA, --inputs DATA (an .npz or a folder),
graphamp debug and graphamp tune; bad DATA refused in one line with nothing written."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphamp.onnx as gonnx
from graphamp.cli import main
from graphamp.errors import DataWarning, GraphampError
from graphamp.numerics.inputs import InputSpec, check_feeds, random_inputs
from graphamp.plans.plan import Plan
from tests.helpers import chain
from tests.numerics import numerics_models as planted


@pytest.fixture()
def overflow(tmp_path):
    path = tmp_path / "overflow.onnx"
    onnx.save(planted.overflowing_hidden_layer(), str(path))
    return path


@pytest.fixture()
def data_folder(tmp_path):
    """Two .npz files: one batch of 4 rows, and 8 rows the model's fixed batch splits in two."""
    folder = tmp_path / "data"
    folder.mkdir()
    batches = planted.batches(3)
    np.savez(folder / "a.npz", x=batches[0]["x"])
    np.savez(folder / "b.npz", x=np.concatenate([batches[1]["x"], batches[2]["x"]]))
    (folder / "notes.txt").write_text("not data: ignored")
    return folder


def user_error(capsys, argv, *fragments):  # type: ignore[no-untyped-def]
    """Run argv in-process; assert exit 2 and one stderr line holding ``fragments``."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    for fragment in fragments:
        assert fragment in err[0], err[0]
    return err[0]


def test_convert_calibrate_on_a_folder_keeps_the_overflow_float32_and_verifies(
    overflow, data_folder, tmp_path, capsys
):
    out, plan = tmp_path / "out.onnx", tmp_path / "plan.json"
    argv = ["convert", str(overflow), "-o", str(out), "--calibrate", str(data_folder)]
    argv += ["--plan", str(plan), "--verify", "--inputs", str(data_folder)]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "float16 rounding emulated" in shown and "OVER" not in shown
    assert "kept float32: values out of range on data (range)" in shown
    nodes = Plan.load(plan).nodes
    assert nodes["hidden"].rule == "range" and "3 batches" in nodes["hidden"].reason
    assert nodes["side"].precision == "float16"
    # without calibration the same verification fails: new inf/NaN
    assert main(["convert", str(overflow), "-o", str(out), "--verify", "--inputs",
                 str(data_folder)]) == 1  # fmt: skip
    assert "OVER" in capsys.readouterr().out


def test_plan_calibrate(overflow, data_folder, capsys):
    assert main(["plan", str(overflow), "--calibrate", str(data_folder), "--format", "json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert {n for n in nodes if nodes[n]["rule"] == "range"} == {"hidden", "relu", "down"}


def test_debug_json_and_text(overflow, data_folder, tmp_path, capsys):
    converted, plan = tmp_path / "fp16.onnx", tmp_path / "plan.json"
    assert main(["convert", str(overflow), "-o", str(converted), "--plan", str(plan)]) == 0
    capsys.readouterr()
    argv = ["debug", str(overflow), str(converted), "--inputs", str(data_folder)]
    assert main([*argv, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["first_nonfinite"] == "hidden"
    assert report["nodes"][0] == {"name": "hidden", "op": "MatMul", "precision": "float16",
                                  "error": "inf"}  # fmt: skip
    assert {n["name"] for n in report["nodes"]} == {"hidden", "relu", "down", "side", "sum"}
    errors = [n["error"] for n in report["nodes"][1:]]
    assert errors == sorted(errors, reverse=True)
    assert main([*argv, "--plan", str(plan)]) == 0
    text = capsys.readouterr().out
    assert "first non-finite: hidden (MatMul, float16, allow)" in text
    assert "evaluated on 3 batch(es) by onnxruntime cpu, float16 rounding emulated" in text


def test_tune_writes_the_tuned_model_and_prints_the_snippet(tmp_path, capsys):
    model, out, plan = tmp_path / "m.onnx", tmp_path / "tuned.onnx", tmp_path / "plan.json"
    onnx.save(planted.cancellation_beside_a_healthy_branch(), str(model))
    data = tmp_path / "d.npz"
    np.savez(data, x=np.concatenate([b["x"] for b in planted.batches(3)]))
    # the planted cancellation is one TensorFlow's colouring makes (the cost pass's cut keeps
    # it float32 by itself)
    argv = ["tune", str(model), "-o", str(out), "--inputs", str(data), "--rtol", "0.01"]
    argv += ["--spread", "tensorflow"]
    assert main([*argv, "--plan", str(plan)]) == 0
    shown = capsys.readouterr().out
    assert 'deny_names = ["cancel"]' in shown
    assert "kept float32: 1 of 9 low nodes" in shown and "evaluations" in shown
    nodes = Plan.load(plan).nodes
    assert nodes["cancel"].rule == "tuned" and nodes["healthy_mm"].precision == "float16"
    assert out.exists()
    # the tuned model meets the tolerance under --verify's faithful evaluator
    config = tmp_path / "amp.toml"
    config.write_text('[graphamp]\nspread = "tensorflow"\ndeny_names = ["cancel"]\n')
    verified = ["convert", str(model), "-o", str(tmp_path / "v.onnx"), "--config", str(config)]
    assert main([*verified, "--verify", "--inputs", str(data), "--rtol", "0.01"]) == 0


def _bad_files(tmp_path):  # type: ignore[no-untyped-def]
    x = planted.batches(1)[0]["x"]
    cases = {}

    def npz(name, **arrays):  # type: ignore[no-untyped-def]
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        return path

    cases["missing"] = (tmp_path / "none.npz", "not found")
    (tmp_path / "empty").mkdir()
    cases["empty folder"] = (tmp_path / "empty", "no .npz files in this folder")
    (tmp_path / "text.npz").write_text("hello")
    cases["not a zip"] = (tmp_path / "text.npz", "not an .npz file of arrays")
    cases["unknown array"] = (npz("unknown", x=x, z=x), "array 'z' is no input of the model")
    cases["no input"] = (npz("noinput", z=x), "array 'z' is no input")
    cases["shape"] = (npz("shape", x=x[:, :5]), "input 'x' has shape (4, 5)")
    cases["rows"] = (npz("rows", x=np.concatenate([x, x[:2]])), "input 'x' has shape (6, 16)")
    cases["scalar"] = (npz("scalar", x=np.float32(1.5)), "input 'x' has shape ()")
    cases["strings"] = (npz("strings", x=np.full((4, 16), "a")), "the array holds <U1")
    cases["objects"] = (
        npz("objects", x=np.array([[1.5] * 16] * 4, dtype=object)),
        "holds Python objects",
    )
    cases["no rows"] = (npz("norows", x=np.ones((0, 16), np.float32)), "holds no values")
    return cases


def test_bad_data_files_are_refused_in_one_line_with_nothing_written(overflow, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    for name, (path, message) in _bad_files(tmp_path).items():
        for argv in (
            ["convert", str(overflow), "-o", str(out), "--calibrate", str(path)],
            ["convert", str(overflow), "-o", str(out), "--verify", "--inputs", str(path)],
            ["tune", str(overflow), "-o", str(out), "--inputs", str(path), "--rtol", "0.01"],
            ["debug", str(overflow), str(overflow), "--inputs", str(path)],
        ):
            line = user_error(capsys, argv, message)
            assert str(path) in line, (name, line)
            assert not out.exists() and not list(tmp_path.glob(".out.onnx*"))


def test_option_errors(overflow, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", str(overflow), "--format", "json", "-o", str(plan)]) == 0
    out = str(tmp_path / "o.onnx")
    user_error(capsys, ["plan", str(plan), "--calibrate", str(overflow)], "needs a model")
    user_error(capsys, ["tune", str(overflow), "-o", out, "--inputs", "d.npz"], "--rtol")
    argv = ["convert", str(overflow), "-o", out, "--from-plan", str(plan), "--calibrate", "d"]
    user_error(capsys, argv, "drop --calibrate")


def test_tune_says_how_to_keep_a_kept_matrix_op_float32_on_a_gpu():
    """onnxruntime's CUDA provider computes float32 MatMul in TF32 by default (measured by
    tools/gpu/gpu_numerics.py: tune's fix of a cancellation undone, 3e-3 -> 0.6): a kept matrix op
    comes with the provider option that keeps it float32; for the CPU target, no note."""
    from rich.console import Console

    from graphamp.cli.tune import _warn_tf32
    from tests.helpers import chain

    plan = gonnx.convert(chain(["MatMul", "Relu", "MatMul"])).plan
    for target, kept, said in (
        ("cuda", ("matmul0",), True),
        ("cpu", ("matmul0",), False),
        ("cuda", ("relu1",), False),
    ):
        console = Console(record=True, width=300)
        _warn_tf32(kept, plan, target, console)
        assert ('"use_tf32": "0"' in console.export_text()) is said, (target, kept)


@pytest.fixture()
def vad(tmp_path):
    path = tmp_path / "vad.onnx"
    onnx.save(planted.voice_activity(), str(path))
    return path


def test_verify_on_random_inputs_a_model_cannot_run_is_one_line_and_exit_2(vad, tmp_path, capfd):
    """A voice-activity model's sample rate drawn at random (1 to 15) breaks the float32 model
    itself: refused before converting, in one line, without onnxruntime's own log lines."""
    out = tmp_path / "vad.fp16.onnx"
    assert main(["convert", str(vad), "-o", str(out), "--verify"]) == 2
    captured = capfd.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"graphamp: error: {vad}: the float32 model fails on random inputs ")
    assert "(onnxruntime: Reshape node 'frames': " in line and line.endswith(": pass --inputs")
    assert "onnxruntime_src" not in line and "[E:onnxruntime" not in captured.out
    assert not captured.out.strip()  # refused before any work: no summary of a conversion
    assert not out.exists() and not list(tmp_path.glob(".vad.fp16*"))


def test_inputs_feed_a_scalar_and_a_state_batched_on_axis_1_as_they_are(vad, tmp_path, capsys):
    data = tmp_path / "vad.npz"
    feeds = planted.voice_activity_inputs(batch=3)
    assert feeds["sr"].shape == () and feeds["state"].shape == (2, 3, 128)
    np.savez(data, **feeds)
    out = tmp_path / "vad.fp16.onnx"
    assert main(["convert", str(vad), "-o", str(out), "--verify", "--inputs", str(data)]) == 0
    table = capsys.readouterr().out
    assert "float16 rounding emulated" in table and "stateN" in table
    assert out.exists()
    # calibration reads the same files
    plan = tmp_path / "plan.json"
    assert main(["plan", str(vad), "--calibrate", str(data), "-o", str(plan)]) == 0
    # a sample rate the model does not know, given as data: refused, naming the file
    np.savez(data, **{**feeds, "sr": np.array(7)})
    out.unlink()
    argv = ["convert", str(vad), "-o", str(out), "--verify", "--inputs", str(data)]
    line = user_error(capsys, argv, f"the float32 model fails on {data} (onnxruntime: Reshape")
    assert "pass --inputs" not in line and not out.exists()


def test_calibration_and_debug_data_a_model_cannot_run_on_is_one_line(vad, tmp_path, capfd):
    data = tmp_path / "vad.npz"
    np.savez(data, **{**planted.voice_activity_inputs(batch=2), "sr": np.array(7)})
    out = tmp_path / "vad.fp16.onnx"
    for argv in (
        ["convert", str(vad), "-o", str(out), "--calibrate", str(data)],
        ["debug", str(vad), str(vad), "--inputs", str(data)],
    ):
        assert main(argv) == 2
        captured = capfd.readouterr()
        (line,) = captured.err.strip().splitlines()
        assert "onnxruntime cannot run" in line and "Reshape node 'frames': " in line, line
        assert "onnxruntime_src" not in line and not out.exists()


def test_an_input_of_no_declared_shape_is_not_taken_for_a_scalar(tmp_path, capsys):
    """A graph input with no shape at all (legal ONNX; onnxruntime runs it) was read as 0-d:
    "input 'x' has shape (16, 64), the model declares ()". It takes any array; the one line
    is now about what graphamp cannot do without a shape."""
    spec = InputSpec("x", "float32", None)
    check_feeds([spec], {"x": np.ones((16, 64), np.float32)}, "data.npz")  # no error
    with pytest.raises(GraphampError, match="input 'x' declares no shape"):
        random_inputs([spec])
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w],
    )  # fmt: skip
    path = tmp_path / "m.onnx"
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path
    )
    np.savez(tmp_path / "cal.npz", x=np.ones((16, 64), np.float32))
    code = main(["convert", str(path), "-o", str(tmp_path / "o.onnx"), "--calibrate",
                 str(tmp_path / "cal.npz")])  # fmt: skip
    error = capsys.readouterr().err
    assert code == 2 and "the model declares ()" not in error and "declares no shape" in error
    assert not (tmp_path / "o.onnx").exists()


def test_nan_in_calibration_data_is_said_once_per_input():
    """One NaN pixel turned float8 and the range rule off for every product it reached
    (fp8_range: 'held 1 inf/NaN values'), exit 0, nothing said about the data."""
    x = np.ones((4, 4), np.float32)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.warns(DataWarning, match=r"input 'x' holds 1 NaN values \(batch 2\)") as caught:
        ranges = gonnx.calibrate(chain(["MatMul", "Relu"]), [{"x": x}, {"x": bad}, {"x": bad}])
    assert len([w for w in caught if w.category is DataWarning]) == 1
    assert ranges.tensors["x"].nonfinite == 2
    mask = np.where(np.eye(4) > 0, 0.0, -np.inf).astype(np.float32)  # an additive mask: fine
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        gonnx.calibrate(chain(["Add"]), [{"x": mask}])
