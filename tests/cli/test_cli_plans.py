"""graphamp plan / explain / diff / check, and the CI scenario the check exists for."""

from __future__ import annotations

import json
import subprocess

import onnx
import pytest

from graphamp.cli import main
from tests.helpers import assert_user_error, chain, layer_norm_model


@pytest.fixture()
def bert(zoo_model):
    return str(zoo_model("bert"))


def test_plan_text_groups_nodes_by_precision(bert, capsys):
    assert main(["plan", bert, "--keep-io-types", "--deny", "Tanh"]) == 0
    out = capsys.readouterr().out
    assert "\nfloat16 (" in out and "\nfloat32 (" in out
    assert "/layers.0/attention/MatMul" in out


def test_plan_json_to_file_equals_the_api(bert, tmp_path):
    import graphamp.onnx as gonnx

    target = tmp_path / "plan.json"
    assert main(["plan", bert, "--format", "json", "-o", str(target)]) == 0
    plan = gonnx.analyse(bert).plan
    assert target.read_text() == plan.to_json()


def test_a_left_out_format_is_what_the_output_suffix_names(bert, tmp_path, capsys):
    """plan -o plan.json once wrote the text table under that name, which check --baseline
    then refused as no JSON plan; a suffix naming a format the command lacks is refused."""
    starts = {"p.json": '{\n  "format": "graphamp-plan"', "p.html": "<!DOCTYPE html>"}
    for name, start in starts.items():
        assert main(["plan", bert, "-o", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_text().startswith(start), name
    assert main(["plan", bert, "-o", str(tmp_path / "p.txt")]) == 0
    assert (tmp_path / "p.txt").read_text().startswith("plan for ")
    assert main(["plan", bert, "--format", "text", "-o", str(tmp_path / "t.json")]) == 0
    assert (tmp_path / "t.json").read_text().startswith("plan for ")
    capsys.readouterr()
    debug = ["debug", bert, bert, "--inputs", str(tmp_path / "batch.npz")]
    assert main([*debug, "-o", str(tmp_path / "d.html")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"graphamp: error: -o {tmp_path / 'd.html'}: debug writes text, json, not html: pass "
        "--format or name the file otherwise\n"
    )
    assert not (tmp_path / "d.html").exists()


def test_explain_follows_the_chain_of_reasons(bert, capsys):
    # LayerNormalization runs low by default (stash_type=1); denied, it spreads to the Adds
    assert main(["explain", bert, "/layers.0/Add_1", "--deny", "LayerNormalization"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("/layers.0/Add_1 (Add): float32, rule deny_spread")
    assert "LayerNormalization" in lines[1] and "rule deny" in lines[1]
    assert any(line.strip().startswith("input 0") for line in lines)


def test_explain_unknown_node_suggests_names(cli, bert):
    assert_user_error(cli("explain", bert, "/layers.0/Ad"), "did you mean", "/layers.0/Add")


def test_diff_exit_code(tmp_path, bert, capsys):
    plan_file = tmp_path / "b.json"
    assert main(["plan", bert, "--format", "json", "-o", str(plan_file)]) == 0
    assert main(["diff", str(plan_file), bert, "--exit-code"]) == 0
    assert main(["diff", str(plan_file), bert, "--deny", "LayerNormalization", "--exit-code"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"--- {plan_file}\n+++ {bert}\n@@ nodes:")
    assert main(["diff", str(plan_file), bert, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes_changed"] == []


def test_ci_scenario_check_catches_one_layernorm_moving_to_float16(tmp_path, capsys):
    """A repository keeps its policy and reviewed plan; an edit to the model's weights lets one
    LayerNorm run in float16. `graphamp check` fails and its diff names that node only."""
    repo = tmp_path / "repo"
    (repo / "plans").mkdir(parents=True)
    onnx.save(layer_norm_model(gain=1e5), str(repo / "encoder.onnx"))
    (repo / "graphamp.toml").write_text(
        '[graphamp]\nallow = ["LayerNormalization"]\n\n'
        '[[graphamp.check]]\nmodel = "encoder.onnx"\nbaseline = "plans/encoder.json"\n'
    )
    config = str(repo / "graphamp.toml")
    assert main(["check", "--config", config, "--update"]) == 0
    assert main(["check", "--config", config]) == 0
    capsys.readouterr()

    onnx.save(layer_norm_model(gain=1.0), str(repo / "encoder.onnx"))  # the model edit
    assert main(["check", "--config", config]) == 1
    sections = diff_sections(capsys.readouterr().out)
    node_lines = sections["nodes"]
    assert {line[1:].split()[0] for line in node_lines} == {"/encoder/norm/LayerNormalization"}
    assert "float32" in node_lines[0] and "float16" in node_lines[1]
    # What else moved belongs to that node: its own gain and bias, and the casts around it.
    assert {line[1:].split(":")[0] for line in sections["weights"]} == {"gamma", "beta"}
    assert all(
        "/encoder/norm/LayerNormalization" in line or " h:" in line or " n:" in line
        for line in sections["casts"]
    )

    assert main(["check", "--config", config, "--update"]) == 0  # accept the change
    assert main(["check", "--config", config]) == 0


def diff_sections(text: str) -> dict[str, list[str]]:
    """The +/- lines of a plan diff by section (nodes, casts, weights, ...)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("@@ "):
            current = line[3:].split(":")[0].split(" ")[0]
            sections[current] = []
        elif current and line[:1] in "+-":
            sections[current].append(line)
    return sections


def test_check_single_model_and_missing_baseline(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Exp"]), str(path))
    assert_user_error(
        cli("check", str(path), "--baseline", str(tmp_path / "none.json")), "--update"
    )
    assert main(["check", str(path), "--baseline", str(tmp_path / "p.json"), "--update"]) == 0
    assert main(["check", str(path), "--baseline", str(tmp_path / "p.json")]) == 0
    assert (
        main(["check", str(path), "--baseline", str(tmp_path / "p.json"), "--deny", "MatMul"]) == 1
    )


@pytest.mark.slow
def test_shipped_ci_hook_and_workflow_run_the_check(tmp_path):
    """tools/ci/pre-commit and the workflow's command pass on a clean repo, fail on drift."""
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    repo = tmp_path / "repo"
    repo.mkdir()
    onnx.save(layer_norm_model(gain=1e5), str(repo / "encoder.onnx"))
    (repo / "graphamp.toml").write_text(
        '[graphamp]\nallow = ["LayerNormalization"]\n\n'
        '[[graphamp.check]]\nmodel = "encoder.onnx"\nbaseline = "encoder.plan.json"\n'
    )
    assert main(["check", "--config", str(repo / "graphamp.toml"), "--update"]) == 0
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    workflow = (root / "tools/ci/graphamp-check.yml").read_text()
    command = next(
        line.split("run:", 1)[1].strip()
        for line in workflow.splitlines()
        if "run: graphamp" in line
    )

    def run_both() -> tuple[int, int]:
        hook = subprocess.run(
            [str(root / "tools/ci/pre-commit")], cwd=repo, env=env, capture_output=True, text=True
        )
        job = subprocess.run(command, shell=True, cwd=repo, env=env, capture_output=True, text=True)
        return hook.returncode, job.returncode

    assert run_both() == (0, 0)
    onnx.save(layer_norm_model(gain=1.0), str(repo / "encoder.onnx"))
    assert run_both() == (1, 1)


def test_a_drift_outside_the_decisions_names_the_fields_that_moved(tmp_path, capsys):
    """A node's op changed (same precision) or the model renamed: check drifted with the one
    line 'plan: baseline -> changed reasons/policy', naming nothing."""
    first, second = tmp_path / "a.onnx", tmp_path / "renamed.onnx"
    onnx.save(chain(["MatMul", "Softmax"]), str(first))
    onnx.save(chain(["MatMul", "Softmax"]), str(second))
    baseline = tmp_path / "base.json"
    assert main(["check", str(first), "--baseline", str(baseline), "--update"]) == 0
    capsys.readouterr()
    assert main(["check", str(second), "--baseline", str(baseline)]) == 1
    out = capsys.readouterr().out
    assert "model: a.onnx -> renamed.onnx" in out and "changed reasons/policy" not in out


def test_check_update_removes_the_baseline_of_a_model_gone_from_the_folder(tmp_path, capsys):
    """--update said the orphan was there, left it, and exited 0; the next check failed on it."""
    models, plans = tmp_path / "models", tmp_path / "plans"
    models.mkdir()
    for name in ("a", "b"):
        onnx.save(chain(["MatMul", "Softmax"]), str(models / f"{name}.onnx"))
    assert main(["check", str(models), "--baseline", str(plans), "--update"]) == 0
    (models / "b.onnx").unlink()
    assert main(["check", str(models), "--baseline", str(plans)]) == 1
    assert main(["check", str(models), "--baseline", str(plans), "--update"]) == 0
    assert "b.plan.json: removed (its model is gone)" in capsys.readouterr().out
    assert main(["check", str(models), "--baseline", str(plans)]) == 0
    assert sorted(p.name for p in plans.iterdir()) == ["a.plan.json"]


def test_a_configs_check_entries_are_one_set_of_models_for_unmatched_rules(cli, tmp_path):
    """As in a folder, a rule that matches in one entry's model (Softmax in a.onnx) is no
    mistake in another's (b.onnx has none): only a rule no model of any entry matches is
    warned about once, or refused under --strict, in one line naming the config."""
    onnx.save(chain(["MatMul", "Softmax", "MatMul"]), str(tmp_path / "a.onnx"))
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(tmp_path / "b.onnx"))
    config = tmp_path / "g.toml"
    config.write_text(
        '[[graphamp.check]]\nmodel = "a.onnx"\nbaseline = "plans/a.json"\n'
        '[[graphamp.check]]\nmodel = "b.onnx"\nbaseline = "plans/b.json"\n'
    )
    checks = ("check", "--config", str(config))
    assert cli(*checks, "--deny", "Softmax", "--strict", "--update").returncode == 0
    assert cli(*checks, "--deny", "Softmax", "--strict").returncode == 0
    result = cli(*checks, "--deny", "Softmax", "--deny", "Exp")
    assert result.returncode == 0  # Exp is in neither: no decision moved
    warned = [line for line in result.stderr.splitlines() if "'Exp'" in line]
    assert len(warned) == 1 and "Softmax" not in result.stderr, result.stderr
    assert f"any model of {config}'s [[graphamp.check]] entries" in warned[0]
    before = (tmp_path / "plans" / "a.json").read_bytes()
    result = cli(*checks, "--deny", "Exp", "--strict", "--update")
    assert_user_error(result, "'Exp'", str(config), "(--strict)")
    assert (tmp_path / "plans" / "a.json").read_bytes() == before  # nothing written


def test_a_damaged_json_plan_is_named_a_plan_by_every_command(cli, tmp_path):
    """A JSON file that is no plan (nested past Python's stack, led by a BOM, an array) is
    a plan file at fault for diff, explain and plan as for --from-plan and --baseline: one
    line saying what is wrong with its JSON, never "not an ONNX model"."""
    model = tmp_path / "m.onnx"
    onnx.save(chain(["MatMul", "Softmax", "MatMul"]), str(model))
    good = tmp_path / "good.json"
    assert cli("plan", str(model), "--format", "json", "-o", str(good)).returncode == 0
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    cases = [(deep, "nested too deeply"), (bom, "byte order mark"), (array, "not a graphamp plan")]
    for path, fragment in cases:
        for args in (
            ("diff", str(path), str(good)),
            ("explain", str(path), "x"),
            ("plan", str(path)),
            ("check", str(model), "--baseline", str(path)),
            ("convert", str(model), "-o", str(tmp_path / "o.onnx"), "--from-plan", str(path)),
        ):
            result = cli(*args)
            assert_user_error(result, str(path), fragment)
            assert "ONNX" not in result.stderr
