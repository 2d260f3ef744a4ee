"""Smaller command-line behaviours, each on a hand-written model: --version, -v after
the command, abbreviated flags refused, debug --top below 1 refused, explain with an op type,
debug with its models swapped or unrelated, policy flags on a diff of two plan files, a
torch.save file given to convert, and what demo says it builds."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import onnx
import pytest

from graphamp.cli import main
from graphamp.models import ZOO
from tests.helpers import chain, cli_process


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul", "Exp"]), str(path))
    return path


def test_version(cli):
    status, out, _ = cli("--version")
    assert status == 0 and out.strip() == "graphamp 0.2.0"


@pytest.mark.slow
def test_verbose_after_the_command_counts_as_before_it(small):
    """(In processes of their own: logging is configured once per process.)"""
    quiet = cli_process("plan", str(small)).stderr
    after = cli_process("plan", str(small), "-v").stderr
    before = cli_process("-v", "plan", str(small)).stderr
    assert "pass classify" not in quiet
    assert "pass classify" in after and "pass classify" in before
    twice = cli_process("-v", "plan", str(small), "-v").stderr  # -v twice: every decision
    assert twice.count("\n") > after.count("\n")


@pytest.mark.parametrize(
    ("flag", "meant"), [("--dtyp", "--dtype"), ("--keep-io-type", "--keep-io-types")]
)
def test_abbreviated_flags_are_refused_naming_the_flag(cli, small, tmp_path, flag, meant):
    argv = ["convert", str(small), "-o", str(tmp_path / "o.onnx"), flag]
    status, _, err = cli(*([*argv, "bfloat16"] if flag == "--dtyp" else argv))
    assert status == 2 and f"did you mean {meant}?" in err
    assert not (tmp_path / "o.onnx").exists()


def test_debug_top_must_be_positive(cli, small, tmp_path):
    argv = ["debug", str(small), str(small), "--inputs", "x.npz", "--top", "-3"]
    status, _, err = cli(*argv)
    assert status == 2 and "--top: expected a number >= 1, got '-3'" in err


def test_explain_with_an_op_type_suggests_its_nodes(cli, small):
    status, _, err = cli("explain", str(small), "MatMul")
    assert status == 2
    assert "MatMul is an op type: explain one of its 2 node(s), e.g. 'matmul0', 'matmul2'" in err


def test_debug_with_models_swapped_or_unrelated_says_so(cli, small, tmp_path):
    converted = tmp_path / "c.onnx"
    assert main(["convert", str(small), "-o", str(converted)]) == 0
    data = tmp_path / "x.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    status, _, err = cli("debug", str(converted), str(small), "--inputs", str(data))
    assert status == 2 and "the models look swapped; give the float32 model first" in err
    other = tmp_path / "other.onnx"
    onnx.save(chain(["Sigmoid", "MatMul"]), str(other))
    status, _, err = cli("debug", str(small), str(other), "--inputs", str(data))
    assert status == 2 and "not a model and its conversion: CONVERTED has 0 of IN's 4" in err
    status, out, _ = cli("debug", str(small), str(converted), "--inputs", str(data))
    assert status == 0 and "output y" in out


def test_policy_flags_on_a_diff_of_two_plan_files_are_warned_about(cli, small, tmp_path):
    plans = [tmp_path / "a.json", tmp_path / "b.json"]
    for plan in plans:
        assert main(["plan", str(small), "--format", "json", "-o", str(plan)]) == 0
    status, _, err = cli("diff", *map(str, plans), "--deny", "Relu")
    assert status == 0 and "--deny changes nothing here: A and B are plan files" in err
    _, _, err = cli("diff", str(small), str(plans[0]), "--deny", "Relu")
    assert "change nothing" not in err  # a model is planned under them


def test_a_torch_save_file_says_how_to_export_the_model(cli, tmp_path):
    zipped = tmp_path / "model.pt"
    with zipfile.ZipFile(zipped, "w") as archive:  # torch.save's layout
        archive.writestr("model/data.pkl", pickle.dumps({"weight": 1}))
        archive.writestr("model/version", "3")
    legacy = tmp_path / "legacy.pth"
    legacy.write_bytes(pickle.dumps({"weight": 1}, protocol=2))
    for path in (zipped, legacy):
        status, _, err = cli("convert", str(path), "-o", str(tmp_path / "o.onnx"))
        assert status == 2 and "saved with torch.save" in err
        assert "torch.export.save(" in err and "torch.onnx.export(" in err


@pytest.mark.parametrize("name", sorted(ZOO))
def test_demo_describes_the_model_it_builds(name):
    """The description comes from the settings the size builds with (it said '12 x 768, seq
    128' for the 2-layer, 32-wide small BERT)."""
    from graphamp.models import build

    small, full = ZOO[name].describe("small"), ZOO[name].describe("full")
    assert small != full
    if name == "bert":
        model, _ = build("bert", "small")
        assert "2 layers x 32 wide" in small and "12 layers x 768 wide" in full
        assert sum(1 for _ in model.layers) == 2


def test_verify_says_when_the_float32_model_itself_gives_nan(cli, small, tmp_path):
    """NaN/Inf counts only what the conversion adds, so inputs the float32 model cannot take
    compared nothing and passed without a word."""
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    x[1, 2] = np.nan  # one row of y is NaN in float32 already
    np.savez(tmp_path / "nan.npz", x=x)
    status, out, _ = cli(
        "convert", str(small), "-o", str(tmp_path / "o.onnx"), "--verify", "--inputs",
        str(tmp_path / "nan.npz"),
    )  # fmt: skip
    assert status == 0
    assert "the float32 model itself gives NaN/Inf on these inputs in y (4)" in " ".join(
        out.split()
    )
    np.savez(tmp_path / "finite.npz", x=np.nan_to_num(x, nan=0.5))
    status, out, _ = cli(
        "convert", str(small), "-o", str(tmp_path / "p.onnx"), "--verify", "--inputs",
        str(tmp_path / "finite.npz"),
    )  # fmt: skip
    assert status == 0 and "itself gives NaN" not in out


def test_lists_default_to_the_dtype_the_dialect_converts_to(cli, tmp_path):
    """fx_cpu's lists are bfloat16's, as graphamp.fx.convert on a CPU; a policy file's dtype
    is shown unless --dtype says otherwise (its default once overrode the file's)."""
    config = tmp_path / "amp.toml"
    config.write_text('[graphamp]\ndtype = "bfloat16"\n')
    for args, dtype in (
        ((), "float16"),
        (("--dialect", "fx_cpu"), "bfloat16"),
        (("--dialect", "fx_cuda"), "float16"),
        (("--config", str(config)), "bfloat16"),
        (("--config", str(config), "--dtype", "float16"), "float16"),
    ):
        status, out, _ = cli("lists", *args)
        assert status == 0 and out.startswith(f"allow ({dtype})"), (args, out[:40])


def test_a_json_file_that_is_no_plan_is_named_so_in_one_line(cli, small, tmp_path):
    """Read as ONNX, it was a two-line protobuf error listing ModelProto's fields."""
    other = tmp_path / "results.json"
    other.write_text('{"accuracy": 0.9}\n')
    status, _, err = cli("diff", str(small), str(other))
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{other}: a JSON file but not a graphamp plan" in err


def test_small_messages_say_what_is_meant(cli, tmp_path):
    """A logged warning says "warning:"; a name rule that is a node's own name holding glob
    characters says how to match it; a Git LFS pointer is named as one; one file copied is
    "1 other file"."""
    from onnx import TensorProto, helper

    rec = helper.make_function(
        "local",
        "Rec",
        ["x"],
        ["y"],
        [helper.make_node("Rec", ["x"], ["y"], domain="local")],
        [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
    )
    graph = helper.make_graph(
        [helper.make_node("Rec", ["x"], ["y"], name="call", domain="local")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    proto = helper.make_model(graph, opset_imports=opsets, functions=[rec])
    proto.ir_version = 10
    onnx.save(proto, str(tmp_path / "rec.onnx"))
    logged = cli("plan", str(tmp_path / "rec.onnx")).stderr.splitlines()
    assert all(line.startswith(("graphamp: warning: ", "graphamp: error: ")) for line in logged)

    bracket = chain(["MatMul", "Softmax", "MatMul"])
    bracket.graph.node[1].name = "blk[0]/act"
    onnx.save(bracket, str(tmp_path / "br.onnx"))
    result = cli("plan", str(tmp_path / "br.onnx"), "--deny-name", "blk[0]/act", "--strict")
    assert result.returncode == 2 and "'blk[[]0]/act' matches that node" in result.stderr
    assert cli("plan", str(tmp_path / "br.onnx"), "--deny-name", "blk[[]0]/act").stderr == ""

    lfs = tmp_path / "lfs.onnx"
    lfs.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 12345\n")
    result = cli("plan", str(lfs))
    assert result.returncode == 2 and "Git LFS pointer" in result.stderr, result.stderr

    folder = tmp_path / "D"
    folder.mkdir()
    onnx.save(chain(["MatMul"]), str(folder / "m.onnx"))
    (folder / "README.md").write_text("hello")
    result = cli("convert", str(folder), "-o", str(tmp_path / "DO"))
    assert "copied 1 other file: README.md" in result.stdout


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["-o", "out.fp16.onnx"], ".onnx names a model file"),  # meant convert
        (["-o", "out.pt2"], ".pt2 names a model file"),
    ],
)
def test_plan_never_writes_a_report_under_another_files_name(cli, small, tmp_path, arguments, says):
    arguments = [str(tmp_path / a) if a.startswith("out.") else a for a in arguments]
    status, _, err = cli("plan", str(small), *arguments)
    assert status == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not any(p.name.startswith("out.") for p in tmp_path.iterdir())
