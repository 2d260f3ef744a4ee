"""The command line keeps its word: each case here once ended in a traceback, a partial output
file or a silent no-op. One line, exit status 2, nothing written."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import onnx
import pytest

from graphamp.cli import main
from tests.helpers import assert_user_error, chain, model


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Softmax", "MatMul", "Exp"]), str(path))
    return path


def test_check_update_creates_the_baseline_folder(small, tmp_path):
    config = tmp_path / "graphamp.toml"
    config.write_text('[[graphamp.check]]\nmodel = "m.onnx"\nbaseline = "plans/new/m.json"\n')
    assert main(["check", "--config", str(config), "--update"]) == 0
    assert (tmp_path / "plans/new/m.json").exists()
    assert main(["check", "--config", str(config)]) == 0


def test_a_misspelt_key_of_a_check_entry_is_named_with_the_key_it_may_mean(cli, small, tmp_path):
    config = tmp_path / "graphamp.toml"
    config.write_text('[[graphamp.check]]\nmodle = "m.onnx"\nbaseline = "m.json"\n')
    assert_user_error(
        cli("check", "--config", str(config)),
        "[[graphamp.check]] entry 1: unknown key 'modle'; did you mean 'model'?",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plan", "{tmp}/missing/plan.json"], "does not exist"),
        (["--plan", "{tmp}"], "is a folder"),
        (["--rtol", "-1", "--verify"], "expected a number >= 0"),
        (["--rtol", "0.1"], "only used with --verify"),
        (["--provider", "cuda"], "--provider are only used with --verify"),
    ],
)
def test_bad_output_and_tolerance_options(cli, small, tmp_path, args, message):
    out = tmp_path / "out.onnx"
    args = [a.format(tmp=tmp_path) for a in args]
    assert_user_error(cli("convert", str(small), "-o", str(out), *args), message)
    assert not out.exists()


def test_output_naming_a_folder_and_plan_into_a_missing_folder(cli, small, tmp_path):
    assert_user_error(cli("convert", str(small), "-o", str(tmp_path)), "is a folder")
    missing = tmp_path / "no" / "plan.txt"
    assert_user_error(cli("plan", str(small), "-o", str(missing)), "does not exist")
    (tmp_path / "file").write_text("x")
    assert_user_error(cli("demo", "--keep", str(tmp_path / "file")), "is a file")


def test_bad_verification_inputs_write_nothing(cli, small, tmp_path):
    out = tmp_path / "out.onnx"
    wrong_shape = tmp_path / "wrong.npz"
    np.savez(wrong_shape, x=np.ones((3, 5), np.float32))
    result = cli("convert", str(small), "-o", str(out), "--verify", "--inputs", str(wrong_shape))
    assert_user_error(result, "input 'x' has shape (3, 5), the model declares (4, 4)")
    assert not out.exists() and not list(tmp_path.glob(".out.onnx*"))
    unknown = tmp_path / "unknown.npz"
    np.savez(unknown, y=np.ones((4, 4), np.float32))
    result = cli("convert", str(small), "-o", str(out), "--verify", "--inputs", str(unknown))
    assert_user_error(result, "array 'y' is no input of the model")
    assert not out.exists()


def test_cuda_verification_without_a_gpu_is_an_error_not_a_fallback(cli, small, tmp_path):
    out = tmp_path / "out.onnx"
    result = cli("convert", str(small), "-o", str(out), "--verify", "--provider", "cuda")
    assert_user_error(result, "--provider cuda")
    assert not out.exists()


def test_keep_io_types_no_longer_swallows_the_model_path(small, tmp_path):
    out = tmp_path / "out.onnx"
    assert main(["convert", "--keep-io-types", str(small), "-o", str(out)]) == 0
    converted = onnx.load(str(out))
    assert converted.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert main(["convert", str(small), "-o", str(out), "--keep-io", "x"]) == 0


@pytest.mark.parametrize(
    ("flags", "warning"),
    [
        (
            ["--deny", "Softmx"],
            "op 'Softmx' (moved to deny) is the type of no node of the model; "
            "did you mean 'Softmax'?",
        ),
        (["--deny", "softmax"], "did you mean 'Softmax'?"),
        (["--deny-name", "/layer.11/*"], "rule (--deny-name) '/layer.11/*' matches no node"),
        (["--deny-tensor", "t9"], "deny_tensors name (--deny-tensor) 't9' is no tensor"),
        (["--deny-tensor", "T1"], "(--deny-tensor) 'T1' is no tensor; did you mean 't1'?"),
        (["--keep-io", "z"], "keep_io_types name (--keep-io) 'z' is no graph input or output"),
    ],
)
def test_rules_that_match_nothing_are_warned_about_and_strict_refuses_them(
    cli, small, tmp_path, flags, warning
):
    out = tmp_path / "out.onnx"
    result = cli("convert", str(small), "-o", str(out), *flags)
    assert result.returncode == 0 and "graphamp: warning: " in result.stderr
    assert warning in result.stderr
    assert "Traceback" not in result.stderr
    out.unlink()
    assert_user_error(cli("convert", str(small), "-o", str(out), *flags, "--strict"), warning)
    assert not out.exists()


def test_a_list_move_on_the_command_line_is_credited_to_it(small, tmp_path):
    config = tmp_path / "amp.toml"
    config.write_text('[graphamp]\ninfer = ["Relu"]\n')
    plan = tmp_path / "plan.json"
    args = ["plan", str(small), "--config", str(config), "--deny", "Softmax", "--format", "json"]
    assert main([*args, "-o", str(plan)]) == 0
    reason = json.loads(plan.read_text())["nodes"]["softmax1"]["reason"]
    assert reason == "deny list: moved to deny by command line"


def test_an_already_converted_model_says_nothing_was_converted(cli, small, tmp_path):
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    assert main(["convert", str(small), "-o", str(once)]) == 0
    result = cli("convert", str(once), "-o", str(twice))
    assert result.returncode == 0
    assert "graphamp: warning: nothing converted:" in result.stderr
    assert "nodes already compute in float16" in result.stderr


def test_bfloat16_before_opset_22_says_which_ops_stay_float32(cli, tmp_path):
    from onnx import helper

    from tests.helpers import weight

    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    proto = model(nodes, initializers=[weight("w", (4, 1, 1, 1))], opset=21, shape=(1, 1, 4, 4))
    path = tmp_path / "conv21.onnx"
    onnx.save(proto, str(path))
    result = cli("convert", str(path), "-o", str(tmp_path / "o.onnx"), "--dtype", "bfloat16")
    assert result.returncode == 0
    assert "its schema does not admit the type (schema)" in result.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["convert", "{bad}", "-o", "{tmp}/o.onnx"],
        ["plan", "{bad}"],
        ["explain", "{bad}", "node"],
        ["diff", "{bad}", "{bad}"],
        ["check", "{bad}", "--baseline", "{tmp}/b.json"],
        ["lists", "--config", "{bad}"],
        ["convert", "{good}", "-o", "{tmp}/o.onnx", "--config", "{bad}"],
        ["convert", "{good}", "-o", "{tmp}/o.onnx", "--from-plan", "{bad}"],
    ],
)
def test_every_subcommand_answers_a_broken_file_in_one_line(cli, small, tmp_path, command):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(small.read_bytes()[:57])  # truncated
    args = [a.format(bad=bad, good=small, tmp=tmp_path) for a in command]
    result = cli(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.onnx").exists()


def test_a_model_onnxruntime_cannot_load_is_a_user_error_under_verify(cli, tmp_path):
    from onnx import helper

    # an attribute Relu does not have: graphamp passes it through, onnxruntime refuses it
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    proto = model(nodes)
    proto.graph.node[0].attribute.add(name="bogus", type=onnx.AttributeProto.INT, i=1)
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    result = cli("convert", str(path), "-o", str(tmp_path / "o.onnx"), "--verify")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    # one line naming the model file first, as every other exit-2 line does
    assert f"graphamp: error: {path}: onnxruntime cannot load the model" in result.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_an_output_that_is_a_pipe_or_a_link_is_refused_not_replaced(cli, small, tmp_path):
    """Outputs are staged and renamed into place: '-o /dev/null' as root replaced the
    container's /dev/null with a regular file, a FIFO's reader never got the data, and a link
    was replaced by a file instead of written through."""
    fifo, target, link = tmp_path / "fifo", tmp_path / "v3.json", tmp_path / "current.json"
    os.mkfifo(fifo)
    target.write_text("{}")
    link.symlink_to(target.name)
    result = cli("plan", str(small), "-o", str(fifo))
    assert_user_error(result, "fifo: is not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    result = cli("plan", str(small), "-o", str(link), "--format", "json")
    assert_user_error(result, "current.json: is a symbolic link (to v3.json)")
    assert link.is_symlink() and target.read_text() == "{}"


@pytest.mark.parametrize(
    "args",
    [
        ["convert", "{m}", "-o", "{out}", "--from-plan", ""],
        ["convert", "{m}", "-o", ""],
        ["plan", "{m}", "--config", ""],
        ["plan", ""],
        ["plan", "{m}", "--config="],
    ],
    ids=["from-plan", "output", "config", "input", "equals"],
)
def test_an_empty_value_is_refused_not_taken_for_none(cli, small, tmp_path, args):
    """An unset variable in a CI script: --from-plan '' decided afresh without a word (a node
    the reviewed plan kept float32 came out float16), -o '' was an internal error."""
    out = tmp_path / "out.onnx"
    filled = [a.format(m=small, out=out) for a in args]
    assert_user_error(cli(*filled), "an empty value (an unset variable?)")
    assert not out.exists()


def test_a_folder_leaves_out_pipes_and_dangling_links(cli, tmp_path):
    """A FIFO among a folder's files hung the copy (open waits for a writer), and a dangling
    link was an internal error after every model had been converted. A link to a file is
    still read as the file, wherever it points (Hugging Face's cache layout)."""
    folder, elsewhere = tmp_path / "in", tmp_path / "blobs"
    folder.mkdir()
    elsewhere.mkdir()
    onnx.save(chain(["MatMul"]), str(folder / "m.onnx"))
    (elsewhere / "abc123").write_text("{}")
    (folder / "config.json").symlink_to(elsewhere / "abc123")
    (folder / "README.md").symlink_to(folder / "nowhere")
    os.mkfifo(folder / "pipe")
    result = cli("convert", str(folder), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "m.onnx"]
    assert not (tmp_path / "out" / "config.json").is_symlink()
    left = result.stdout[result.stdout.index("left out") :]
    assert "README.md" in left and "pipe" in left


def test_external_data_that_is_a_pipe_is_refused_not_waited_on(cli, tmp_path):
    """A model whose external data 'location' is a FIFO: plan and convert blocked forever in
    the readability check (open on a pipe waits for a writer)."""
    from onnx.external_data_helper import convert_model_to_external_data

    proto = chain(["MatMul"])
    convert_model_to_external_data(proto, location="data.bin", size_threshold=0)
    onnx.save(proto, str(tmp_path / "m.onnx"))
    (tmp_path / "data.bin").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "data.bin")
    assert_user_error(cli("plan", str(tmp_path / "m.onnx")), "is not a regular file")


def test_control_characters_from_a_model_are_escaped_in_every_text_output(cli, tmp_path):
    """Names come from files graphamp did not make: an escape sequence in one never reaches
    the terminal raw, a newline never forges a line ("plan matches" inside a drift, a second
    line under a one-line error), and rich never reads ``[/]`` as its markup (that was an
    internal error). JSON plans keep the names as they are."""
    node = "\x1b]0;PWNED\x07\x1b[31mred\nm.onnx: plan matches base.json"
    value = "a\x1b[2J\n[/]"
    output = "y\x9b31m[/]"
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w"], [value], name="mm1"),
        onnx.helper.make_node("Softmax", [value], ["b"], name=node),
        onnx.helper.make_node("MatMul", ["b", "w"], [output], name="mm2"),
    ]
    path = tmp_path / "m.onnx"
    weight = onnx.numpy_helper.from_array(np.full((4, 4), 0.1, np.float32), "w")
    onnx.save(model(nodes, outputs=(output,), initializers=[weight]), str(path))
    base = tmp_path / "base.json"
    runs = [
        (0, ("plan", str(path))),
        (0, ("plan", str(path), "--format", "json", "-o", str(base))),
        (1, ("check", str(path), "--baseline", str(base), "--deny", "Softmax")),
        (1, ("diff", str(base), str(path), "--deny", "Softmax", "--exit-code")),
        (0, ("explain", str(path), node)),
        (2, ("explain", str(path), value)),  # no node: an error naming it
        (0, ("convert", str(path), "-o", str(tmp_path / "out.onnx"))),
        (0, ("plan", str(path), "--deny-name", "x\x1b[31m\nplan matches")),  # a warning
        (2, ("plan", str(tmp_path / "no\x1b[31m\nplan matches.onnx"))),  # an error
    ]
    for status, args in runs:
        result = cli(*args)
        assert result.returncode == status, (args, result.stderr)
        for text in (result.stdout, result.stderr):
            assert not {"\x1b", "\x07", "\x9b"} & set(text), (args, text)
            assert not any(line.startswith("m.onnx: plan matches") for line in text.splitlines())
            assert not any(line.startswith("plan matches") for line in text.splitlines())
        assert len(result.stderr.strip().splitlines()) <= 1, (args, result.stderr)
    assert "\\x1b]0;PWNED\\x07\\x1b[31mred\\nm.onnx: plan matches" in cli("plan", str(path)).stdout
    assert json.loads(base.read_text())["nodes"][node]["op"] == "Softmax"  # JSON: as it is
