"""A model folder in, a model folder out: ``graphamp convert DIR -o OUTDIR`` converts every model
file (external data kept beside each), copies every other file, writes a plan per model, and
writes nothing at all when something fails; ``plan`` and ``check`` take a folder; the commands
that take one model say so in one line. (tests/onnx/test_optimum.py loads the result in Optimum.)"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from graphamp.cli import main
from graphamp.core.progress import FolderBar
from tests.helpers import model, weight

WIDTH = 32  # weights of 32x32: over the 1 KiB a tensor needs to stay in the external data file


def matmul_model(name: str, ops: list[str]) -> onnx.ModelProto:
    """x -> MatMul(w) -> ops... -> y, named ``name/...``, with 32x32 weights."""
    nodes, inits, prev = [], [], "x"
    for index, op in enumerate(["MatMul", *ops]):
        out = "y" if index == len(ops) else f"t{index}"
        if op == "MatMul":
            inits.append(weight(f"w{index}", (WIDTH, WIDTH), seed=index))
            nodes.append(
                helper.make_node(op, [prev, f"w{index}"], [out], name=f"/{name}/mm{index}")
            )
        else:
            nodes.append(helper.make_node(op, [prev], [out], name=f"/{name}/{op.lower()}{index}"))
        prev = out
    return model(nodes, initializers=inits, shape=(2, WIDTH))


def make_folder(root: Path) -> Path:
    """An exported-model folder: a model with external data, one in a subfolder, the files
    a loader reads beside them, and a hidden folder that is not part of it."""
    root.mkdir()
    onnx.save_model(
        matmul_model("encoder", ["Relu", "MatMul"]),
        str(root / "encoder.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="encoder.onnx_data",
        size_threshold=0,
    )
    (root / "sub").mkdir()
    onnx.save(matmul_model("decoder", ["Softmax", "MatMul"]), str(root / "sub" / "decoder.onnx"))
    (root / "config.json").write_text(json.dumps({"model_type": "toy"}))
    (root / "tokenizer.json").write_text(json.dumps({"vocab": ["a", "b"]}))
    (root / "sub" / "notes.txt").write_text("kept as it is\n")
    (root / ".cache").mkdir()
    (root / ".cache" / "stale.onnx").write_bytes(b"not part of the folder")
    return root


def digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def first_matmul_input_type(path: Path) -> int:
    proto = onnx.load(str(path))
    types = {i.name: i.data_type for i in proto.graph.initializer}
    node = next(n for n in proto.graph.node if n.op_type == "MatMul")
    return types[node.input[1]]


@pytest.fixture()
def folder(tmp_path):
    return make_folder(tmp_path / "export")


def test_a_folder_converts_into_a_folder_that_runs(folder, tmp_path, capsys):
    before = digest(folder)
    out, plans = tmp_path / "fp16", tmp_path / "plans"
    assert main(["convert", str(folder), "-o", str(out), "--plan", str(plans)]) == 0
    assert digest(folder) == before, "the input folder changed"
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == [
        "config.json",
        "encoder.onnx",
        "encoder.onnx.data",  # the converted model's own external data, beside it
        "sub/decoder.onnx",
        "sub/notes.txt",
        "tokenizer.json",
    ]
    for name in ("config.json", "tokenizer.json", "sub/notes.txt"):
        assert (out / name).read_bytes() == (folder / name).read_bytes()
    for name in ("encoder.onnx", "sub/decoder.onnx"):
        onnx.checker.check_model(str(out / name), full_check=True)
        assert first_matmul_input_type(out / name) == TensorProto.FLOAT16
        session = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        feed = np.random.default_rng(0).standard_normal((2, WIDTH)).astype(np.float32)
        x = session.get_inputs()[0]
        dtype = np.float16 if x.type == "tensor(float16)" else np.float32
        (y,) = session.run(None, {x.name: feed.astype(dtype)})
        assert np.isfinite(y.astype(np.float32)).all()
    # the weights really are in the data file beside the model, not inside it
    assert (out / "encoder.onnx.data").stat().st_size >= 2 * WIDTH * WIDTH * 2
    assert (out / "encoder.onnx").stat().st_size < WIDTH * WIDTH
    assert sorted(str(p.relative_to(plans)) for p in plans.rglob("*.json")) == [
        "encoder.plan.json",
        "sub/decoder.plan.json",
    ]
    plan = json.loads((plans / "sub" / "decoder.plan.json").read_text())
    assert plan["nodes"]["/decoder/mm0"]["precision"] == "float16"
    printed = capsys.readouterr().out
    assert "sub/decoder.onnx" in printed and "copied 3 other files" in printed
    assert ".cache" in printed  # left out, and said so
    assert not [p for p in tmp_path.rglob(".*graphamp*")], "staging left behind"


def test_converting_the_converted_folder_changes_no_byte(folder, tmp_path):
    once, twice = tmp_path / "once", tmp_path / "twice"
    assert main(["convert", str(folder), "-o", str(once)]) == 0
    assert main(["convert", str(once), "-o", str(twice)]) == 0
    assert digest(once) == digest(twice)


def test_a_damaged_model_writes_nothing(folder, tmp_path, capsys):
    (folder / "sub" / "zz_broken.onnx").write_bytes(b"\x08\x07garbage")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("the user's")
    assert main(["convert", str(folder), "-o", str(out), "--plan", str(tmp_path / "p")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "zz_broken.onnx" in error[0], error
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (["-o", "{folder}"], "is the input folder"),
        (["-o", "{folder}/out"], "inside the input"),
        (["-o", "{tmp}/out", "--plan", "{folder}/plans"], "inside the input"),
        (["-o", "{tmp}/missing/out"], "does not exist"),
        (["-o", "{tmp}/file.txt"], "is a file"),
        (["-o", "{tmp}/out", "--inputs", "{tmp}/file.txt", "--verify"], "--inputs"),
        (["-o", "{tmp}/out", "--calibrate", "{tmp}/file.txt"], "--calibrate"),
        (["-o", "{tmp}/out", "--from-plan", "{tmp}/file.txt"], "folder of reviewed plans"),
        (["-o", "{tmp}/out", "--from-plan", "{tmp}"], "no reviewed plan"),
    ],
)
def test_bad_folder_arguments_are_one_line_and_write_nothing(
    folder, tmp_path, capsys, arguments, fragment
):
    (tmp_path / "file.txt").write_text("x")
    before = digest(tmp_path)
    args = [a.format(folder=folder, tmp=tmp_path) for a in arguments]
    assert main(["convert", str(folder), *args]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and fragment in error[0], error
    assert digest(tmp_path) == before


def test_a_folder_with_no_model_and_a_missing_folder(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert main(["convert", str(empty), "-o", str(tmp_path / "out")]) == 2
    assert "no model file" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "nowhere")]) == 2
    assert not (tmp_path / "out").exists()


def test_commands_that_take_one_model_refuse_a_folder_in_one_line(folder, tmp_path, capsys):
    single = folder / "sub" / "decoder.onnx"
    for command in (
        ["explain", str(folder), "/decoder/mm0"],
        ["diff", str(folder), str(single)],
        ["debug", str(folder), str(single), "--inputs", str(tmp_path)],
    ):
        assert main(command) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and "is a folder" in error[0], error


def test_plan_then_convert_from_the_reviewed_plans_then_check(folder, tmp_path, capsys):
    plans, out, fresh = tmp_path / "plans", tmp_path / "out", tmp_path / "fresh"
    assert main(["plan", str(folder), "--format", "json"]) == 2  # one file per model: -o
    assert "-o FOLDER" in capsys.readouterr().err
    assert main(["plan", str(folder), "--format", "json", "-o", str(plans)]) == 0
    assert main(["convert", str(folder), "-o", str(out), "--from-plan", str(plans)]) == 0
    assert main(["convert", str(folder), "-o", str(fresh)]) == 0
    assert digest(out) == digest(fresh)
    capsys.readouterr()
    assert main(["check", str(folder), "--baseline", str(plans)]) == 0
    assert capsys.readouterr().out.count("plan matches") == 2
    assert main(["check", str(folder), "--baseline", str(plans), "--deny", "Softmax"]) == 1
    assert "sub/decoder.onnx: plan drifted" in capsys.readouterr().out
    (plans / "gone.plan.json").write_text((plans / "encoder.plan.json").read_text())
    assert main(["check", str(folder), "--baseline", str(plans)]) == 1
    assert "gone.plan.json: a baseline plan whose model is not in" in capsys.readouterr().out


def test_plan_of_a_folder_prints_each_model(folder, capsys):
    assert main(["plan", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert f"== {folder / 'encoder.onnx'}" in printed
    assert f"== {folder / 'sub' / 'decoder.onnx'}" in printed


def test_a_rule_is_unmatched_only_when_no_model_matches_it(folder, tmp_path, capsys):
    out = tmp_path / "out"
    # matches a node of the decoder only: no warning about the encoder
    assert main(["convert", str(folder), "-o", str(out), "--deny-name", "/decoder/*"]) == 0
    assert "matches no node" not in capsys.readouterr().err
    plan_args = ["--deny-name", "/nothing/*", "--deny-name", "/decoder/*"]
    assert main(["convert", str(folder), "-o", str(out), *plan_args]) == 0
    error = capsys.readouterr().err
    assert error.count("matches no node") == 1 and "'/nothing/*'" in error
    assert main(["convert", str(folder), "-o", str(tmp_path / "o2"), *plan_args, "--strict"]) == 2
    assert not (tmp_path / "o2").exists()


def test_a_stale_model_in_the_output_folder_is_a_warning(folder, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    onnx.save(matmul_model("old", []), str(out / "decoder_model_merged.onnx"))
    assert main(["convert", str(folder), "-o", str(out)]) == 0
    assert "decoder_model_merged.onnx: a model file this conversion does not write" in (
        capsys.readouterr().err
    )


def test_a_rerun_into_a_relative_output_folder_warns_of_nothing_stale(
    folder, tmp_path, capsys, monkeypatch
):
    """The models a conversion writes were compared absolute with the folder walked as given:
    every re-run with a relative -o warned that each model it writes was 'left from before'."""
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["convert", str(folder), "-o", "out"]) == 0
    assert "does not write" not in capsys.readouterr().err


def test_verify_runs_every_model_of_the_folder(folder, tmp_path, capsys):
    assert main(["convert", str(folder), "-o", str(tmp_path / "out"), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("verification on") == 2


def test_folder_progress_draws_the_file_and_the_count(tmp_path):
    from rich.console import Console

    with open(tmp_path / "screen", "w") as screen:
        console = Console(file=screen, force_terminal=True, width=100)
        bar = FolderBar(2, console, min_bytes=0)
        bar.file("decoder_model_merged.onnx")
        bar.begin("writing weights", 1000, 3)
        bar.advance(500)
        bar._live.refresh()
        bar.file_done()
        bar.close()
    drawn = (tmp_path / "screen").read_text()
    assert "converting decoder_model_merged.onnx" in drawn and "writing weights" in drawn


def test_a_link_to_a_model_is_read_as_the_model(folder, tmp_path):
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(folder / "sub" / "decoder.onnx", linked / "decoder.onnx")
    (linked / "config.json").write_text("{}")
    out = tmp_path / "out"
    assert main(["convert", str(linked), "-o", str(out)]) == 0
    assert not (out / "decoder.onnx").is_symlink()
    assert first_matmul_input_type(out / "decoder.onnx") == TensorProto.FLOAT16


def test_a_reader_that_stops_early_is_no_internal_error(folder):
    """``graphamp plan DIR | head -1``: the pipe closes before the plans are written."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "graphamp.cli", "plan", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()
    error = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert "internal error" not in error and "Traceback" not in error, error


def test_diff_of_two_folders_pairs_each_model_with_its_plan(folder, tmp_path, capsys):
    """A folder of models against the folder of their plans: each model with the plan of the
    same relative path; a plan on one side only and a changed decision are differences."""
    plans = tmp_path / "plans"
    assert main(["plan", str(folder), "--format", "json", "-o", str(plans)]) == 0
    capsys.readouterr()
    assert main(["diff", str(plans), str(folder), "--exit-code"]) == 0
    assert capsys.readouterr().out == ""
    # the models planned under another policy: a name rule of the decoder's (matching nothing
    # in the encoder, which is no warning over a folder)
    command = ["diff", str(plans), str(folder), "--deny-name", "/decoder/mm0", "--exit-code"]
    assert main(command) == 1
    printed = capsys.readouterr()
    assert "== sub/decoder.plan.json" in printed.out and "/decoder/mm0" in printed.out
    assert "encoder.plan.json" not in printed.out and "matches no node" not in printed.err
    (plans / "encoder.plan.json").unlink()
    assert main(["diff", str(plans), str(folder), "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["encoder.plan.json"] == f"only in B: {folder / 'encoder.onnx'}"
    assert set(found) == {"encoder.plan.json", "sub/decoder.plan.json"}
    assert main(["diff", str(plans), str(folder), "--exit-code"]) == 1
    for command, message in (
        (["diff", str(plans), str(folder), "--format", "html"], "--format html"),
        (["diff", str(tmp_path / "nothing-here"), str(folder)], "nothing-here"),
    ):
        (tmp_path / "nothing-here").mkdir(exist_ok=True)
        assert main(command) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0], error
