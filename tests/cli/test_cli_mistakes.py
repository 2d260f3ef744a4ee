"""What a newcomer trips on in the first hour (issue 39): each mistake is one line naming
the option, exit status 2, found before any work and with nothing written; and the help and
README say what the tool does."""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
import pytest

from graphamp.cli import build_parser, main
from tests.helpers import chain

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Softmax", "MatMul"]), str(path))
    return path


def files_under(folder: Path) -> set[str]:
    """Every file and folder under ``folder`` (hidden ones too)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *fragments: str) -> str:
    """Run ``argv``: exit 2, one line on stderr holding every fragment, nothing on stdout."""
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not out.strip(), f"printed before refusing: {out}"
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_an_output_suffix_of_another_format_is_refused(capsys, small, tmp_path):
    """-o out.pt2 for an ONNX model would write ONNX bytes under a .pt2 name: the suffix
    names the format. A name with no model suffix is the user's to choose."""
    before = files_under(tmp_path)
    out = tmp_path / "out.pt2"
    refused(capsys, ["convert", str(small), "-o", str(out)], "out.pt2", "-o", "name it out.onnx")
    assert files_under(tmp_path) == before
    assert main(["convert", str(small), "-o", str(tmp_path / "out.fp16")]) == 0


def test_a_folder_output_named_like_a_model_file_is_refused(capsys, small, tmp_path):
    """A folder IN converts into a folder; one named out.onnx would look like a model file."""
    source = tmp_path / "export"
    source.mkdir()
    small.rename(source / "model.onnx")
    before = files_under(tmp_path)
    refused(
        capsys,
        ["convert", str(source), "-o", str(tmp_path / "out.onnx")],
        "out.onnx",
        "-o is a folder",
        ".onnx, a model file's suffix",
    )
    assert files_under(tmp_path) == before
    # --plan is a folder too (one plan per model): plans.json made a folder of that name
    refused(
        capsys,
        ["convert", str(source), "-o", str(tmp_path / "out"), "--plan", str(tmp_path / "p.json")],
        "p.json: --plan is a folder for a folder IN",
        "ends in .json, a file's suffix",
    )
    assert files_under(tmp_path) == before


def test_a_provider_this_machine_lacks_is_refused_before_converting(
    capsys, small, tmp_path, monkeypatch
):
    """--verify --provider cuda where onnxruntime has no CUDA: refused before the conversion
    (no summary table printed, no model written), not after it."""
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    before = files_under(tmp_path)
    argv = ["convert", str(small), "-o", str(tmp_path / "o.onnx"), "--verify"]
    refused(capsys, [*argv, "--provider", "cuda"], "--provider cuda", "--provider cpu")
    assert files_under(tmp_path) == before


def policy_help() -> dict[str, str]:
    parser = build_parser()
    convert = next(
        action.choices["convert"]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return {
        option: action.help or "" for action in convert._actions for option in action.option_strings
    }


def test_the_list_flags_help_reads_and_describes_the_default_spread():
    """--allow/--infer/--clear/--deny: each help is a phrase about op types, and infer and
    clear say how the default (cost) decides them, TensorFlow's colouring only as an option."""
    helps = policy_help()
    for flag in ("--allow", "--infer", "--clear", "--deny"):
        assert helps[flag].startswith("op types that "), helps[flag]
        assert "that run follow" not in helps[flag] and "that run always" not in helps[flag]
    assert "cost" in helps["--infer"] and "fewer bytes" in helps["--infer"]
    assert "decided as infer ops" in helps["--clear"]
    assert "--spread tensorflow" in helps["--clear"]


def test_the_readme_says_how_to_reach_the_virtual_environments_commands():
    """The set-up makes .venv; the examples after it call graphamp and python bare."""
    readme = (ROOT / "README.md").read_text()
    setup_end = readme.index("```", readme.index("```sh setup") + 3)
    after = readme[setup_end:]
    assert "source .venv/bin/activate" in after
    assert after.index("source .venv/bin/activate") < after.index("graphamp convert")


def resolved(path: str) -> object:
    """What the dotted ``path`` names, as a reader reaches it: attribute by attribute from
    ``graphamp``, importing a submodule where the attribute is not there yet. A module reached
    as an attribute must import by that path too (``graphamp.verify`` resolves after ``import
    graphamp``, but ``import graphamp.verify`` fails)."""
    import importlib
    import types

    parts = path.split(".")
    found: object = importlib.import_module(parts[0])
    for index in range(1, len(parts)):
        dotted = ".".join(parts[: index + 1])
        if not hasattr(found, parts[index]):
            importlib.import_module(dotted)
        found = getattr(found, parts[index])
        if isinstance(found, types.ModuleType):
            try:
                importlib.import_module(dotted)
            except ModuleNotFoundError:
                raise AssertionError(f"{path}: `import {dotted}` fails") from None
    return found


def test_the_docs_name_functions_by_paths_that_import():
    """Every ``graphamp.<...>.<function>(`` the README and the guides call is reached as
    written, its module importable by the path the page gives."""
    import re

    pattern = re.compile(r"\b(graphamp(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\(")
    named = {
        match
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for match in pattern.findall(page.read_text())
    }
    assert "graphamp.numerics.verify.verify" in named
    for path in sorted(named):
        assert callable(resolved(path)), path


def test_a_flag_a_command_does_not_know_points_at_that_commands_help(capsys, small):
    """argparse reports a command's unknown flags from the top parser: the hint named
    'graphamp --help', which lists commands, not the flag the user wanted."""
    for argv, prog in (
        (["tune", str(small), "--from-plan", "p.json"], "graphamp tune"),
        (["-v", "plan", str(small), "--bogus"], "graphamp plan"),
        (["--bogus"], "graphamp"),
    ):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 2
        assert capsys.readouterr().err.endswith(f" (see '{prog} --help')\n"), argv


def test_fp8_deny_names_given_twice_keeps_both():
    """--fp8-deny-names takes several globs; given twice, the second replaced the first."""
    args = build_parser().parse_args(
        ["convert", "m.onnx", "-o", "x.onnx", "--fp8", "--calibrate", "d",
         "--fp8-deny-names", "a*", "b*", "--fp8-deny-names", "c*"]
    )  # fmt: skip
    assert args.fp8_deny_names == ["a*", "b*", "c*"]
