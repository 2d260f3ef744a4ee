"""`.pt2` programs (torch.export.save) through the CLI, read without pickle."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from graphamp.cli import main
from graphamp.fx import pt2
from graphamp.models import build
from tests.test_cli import assert_user_error, run_cli


@pytest.fixture(scope="module")
def bert_pt2(tmp_path_factory):
    model, inputs = build("bert", "small")
    path = tmp_path_factory.mktemp("pt2") / "bert.pt2"
    torch.export.save(torch.export.export(model, inputs), str(path))
    return path, model, inputs


def test_load_reads_the_program_exactly(bert_pt2):
    path, model, inputs = bert_pt2
    program = pt2.load(path)
    with torch.no_grad():
        assert torch.equal(program.module()(*inputs)[0], model(*inputs)[0])


def test_convert_pt2_writes_a_program_that_runs_in_bfloat16(bert_pt2, tmp_path):
    path, model, inputs = bert_pt2
    target, plan = tmp_path / "bert.bf16.pt2", tmp_path / "plan.json"
    assert main(["convert", str(path), "-o", str(target), "--verify", "--plan", str(plan)]) == 0
    converted = pt2.load(target)
    with torch.no_grad():
        expected = model(*inputs)
        actual = converted.module()(*inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(*inputs)
    # each output in the type autocast gives it (the residual stream stays float32, the
    # pooled output comes from a bfloat16 product), and as close to float32
    assert [t.dtype for t in actual] == [t.dtype for t in autocast]
    assert torch.bfloat16 in [t.dtype for t in actual]
    for got, want in zip(actual, expected, strict=True):
        assert (got.float() - want).abs().max() <= 5e-2 * want.abs().max()
    data = json.loads(plan.read_text())
    assert data["dtype"] == "bfloat16"
    assert data["nodes"]["layers.0.attention.query/linear"]["precision"] == "bfloat16"


def test_plan_of_a_pt2_program(bert_pt2, capsys):
    path, _, _ = bert_pt2
    assert main(["plan", str(path), "--dtype", "float16"]) == 0
    assert "(float16)" in capsys.readouterr().out.splitlines()[0]


def test_pickled_payloads_are_refused(bert_pt2, tmp_path):
    path, _, _ = bert_pt2
    tampered = tmp_path / "tampered.pt2"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(tampered, "w") as out:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith("_weights_config.json"):
                config = json.loads(data)
                first = next(iter(config["config"]))
                config["config"][first]["use_pickle"] = True
                data = json.dumps(config).encode()
            out.writestr(item, data)
    target = tmp_path / "o.pt2"
    assert_user_error(run_cli("convert", str(tampered), "-o", str(target)), "pickle")
    assert not target.exists()


def test_bad_pt2_inputs(tmp_path, bert_pt2):
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    assert_user_error(run_cli("convert", str(junk), "-o", str(tmp_path / "o.pt2")), "junk.pt2")
    path, _, _ = bert_pt2
    assert_user_error(run_cli("convert", str(path), "-o", str(tmp_path / "o.onnx")), ".pt2")
