"""`.pt2` programs (torch.export.save) through the CLI, read without pickle."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from torch.export import Dim

import graphamp.fx as gfx
from graphamp.cli import main
from graphamp.errors import GraphampError
from graphamp.fx.dialect import pt2
from graphamp.models import build
from tests.helpers import assert_user_error


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


@pytest.mark.slow
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


def test_onnx_only_flags_on_a_pt2_program_are_said_to_do_nothing(cli, bert_pt2):
    path, _, _ = bert_pt2
    result = cli("plan", str(path), "--target", "cpu", "--no-fuse")
    assert result.returncode == 0
    assert "--target, --no-fuse only change ONNX models: ignored for this pt2 model" in (
        result.stderr
    )
    assert "only change ONNX" not in cli("plan", str(path)).stderr


def test_pickled_payloads_are_refused(cli, bert_pt2, tmp_path):
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
    assert_user_error(cli("convert", str(tampered), "-o", str(target)), "pickle")
    assert not target.exists()


def test_bad_pt2_inputs(cli, tmp_path, bert_pt2):
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    assert_user_error(cli("convert", str(junk), "-o", str(tmp_path / "o.pt2")), "junk.pt2")
    path, _, _ = bert_pt2
    assert_user_error(cli("convert", str(path), "-o", str(tmp_path / "o.onnx")), ".pt2")


# graphamp.fx.save / graphamp.fx.load ------------------------------------------------------------


@pytest.fixture(scope="module")
def converted_bert():
    model, inputs = build("bert", "small")
    converted, plan = gfx.convert(model, inputs, weights="low")
    return model, inputs, converted, plan


@pytest.mark.slow
def test_save_writes_a_program_both_readers_load_with_the_same_outputs(converted_bert, tmp_path):
    _, inputs, converted, plan = converted_bert
    path = tmp_path / "bert.pt2"
    gfx.save(converted, path)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        # no pickle: the sample inputs torch would pickle are left out
        assert archive.read("bert/data/sample_inputs/model.pt") == b""
        stored_plan = archive.read("bert/extra/graphamp/plan.json").decode()
    assert stored_plan == plan.to_json()
    assert any(name.startswith("bert/data/weights/") for name in names)
    theirs = torch.export.load(str(path))
    ours, loaded_plan = gfx.load(path)
    assert loaded_plan.to_json() == plan.to_json()
    # weights in the types the conversion chose (weights="low": bfloat16 where only bf16 reads)
    low = {p.name for p in plan.weights}
    assert low and all(theirs.state_dict[name].dtype == torch.bfloat16 for name in low)
    # the batch stays dynamic; outputs bit for bit those of the converted module
    batch = tuple(x.repeat(3, 1)[:5] for x in inputs)
    with torch.no_grad():
        expected = converted(*batch)
        for module in (theirs.module(), ours):
            got = module(*batch)
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.slow
def test_save_is_deterministic_and_a_loaded_module_saves_the_same_program(converted_bert, tmp_path):
    _, _, converted, _ = converted_bert
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    gfx.save(converted, tmp_path / "a" / "m.pt2")
    gfx.save(converted, tmp_path / "b" / "m.pt2")
    loaded, _ = gfx.load(tmp_path / "a" / "m.pt2")
    gfx.save(loaded, tmp_path / "c" / "m.pt2")
    first = (tmp_path / "a" / "m.pt2").read_bytes()
    assert first == (tmp_path / "b" / "m.pt2").read_bytes()
    assert first == (tmp_path / "c" / "m.pt2").read_bytes()


@pytest.mark.slow
def test_the_cli_and_save_write_the_same_program(tmp_path):
    """`graphamp convert model.pt2` and graphamp.fx.save on the same model and policy: the same
    program and weights byte for byte, the same plan but for the name of its source."""
    model, inputs = build("bert", "small")
    program = torch.export.export(model, inputs, dynamic_shapes=[{0: Dim.AUTO}] * 2)
    torch.export.save(program, str(tmp_path / "bert.pt2"))
    (tmp_path / "cli").mkdir(), (tmp_path / "api").mkdir()
    assert main(["convert", str(tmp_path / "bert.pt2"), "-o", str(tmp_path / "cli/m.pt2")]) == 0
    gfx.save(gfx.convert(model, inputs)[0], tmp_path / "api" / "m.pt2")
    with (
        zipfile.ZipFile(tmp_path / "cli/m.pt2") as cli,
        zipfile.ZipFile(tmp_path / "api/m.pt2") as api,
    ):
        assert cli.namelist() == api.namelist()
        for name in cli.namelist():
            if name.endswith("plan.json"):
                ours, theirs = json.loads(cli.read(name)), json.loads(api.read(name))
                assert (ours.pop("model"), theirs.pop("model")) == ("bert.pt2", "BertEncoder")
                assert ours == theirs
            elif not name.endswith("serialization_id"):  # a checksum of the files, plan included
                assert cli.read(name) == api.read(name), name
    loaded, _ = gfx.load(tmp_path / "cli/m.pt2")
    assert loaded(*(x.repeat(2, 1) for x in inputs))[0].shape[0] == 2 * inputs[0].shape[0]


def test_load_of_a_program_graphamp_did_not_write_has_no_plan(bert_pt2):
    path, model, inputs = bert_pt2
    module, plan = gfx.load(path)
    assert plan is None
    with torch.no_grad():
        assert torch.equal(module(*inputs)[0], model(*inputs)[0])


def test_save_refuses_bad_paths_and_modules_writing_nothing(converted_bert, tmp_path):
    model, _, converted, _ = converted_bert
    cases = [
        (converted, tmp_path / "missing" / "m.pt2", "folder .*missing does not exist"),
        (converted, tmp_path, "is a folder"),
        (converted, tmp_path / "m.onnx", r"\.pt2 file"),
        (model, tmp_path / "m.pt2", "graphamp.fx.convert returned, got BertEncoder"),
    ]
    for module, path, message in cases:
        with pytest.raises(GraphampError, match=message) as caught:
            gfx.save(module, path)
        assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_load_refuses_what_is_not_a_program(tmp_path, bert_pt2):
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    other = tmp_path / "other.pt2"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("other/readme.txt", "hello")
    broken = tmp_path / "broken.pt2"
    with zipfile.ZipFile(bert_pt2[0]) as source, zipfile.ZipFile(broken, "w") as out:
        for item in source.infolist():
            out.writestr(item, source.read(item))
        out.writestr("bert/extra/graphamp/plan.json", "{not json")
    cases = [
        (junk, "not a zip file"),
        (other, "not a torch.export .pt2 archive"),
        (tmp_path / "absent.pt2", "no such file"),
        (tmp_path, "is a folder"),
        (broken, "plan.json.*not a JSON plan"),
    ]
    for path, message in cases:
        with pytest.raises(GraphampError, match=message) as caught:
            gfx.load(path)
        assert "\n" not in str(caught.value)


def test_the_torch_dialects_refuse_a_source_of_another_kind_in_one_line():
    """Pt2Dialect loads a path or a program, FxDialect a module or a program: anything else
    is a GraphampError naming its type, before torch.export or the archive reader sees it."""
    from graphamp.fx.dialect.plugin import FxDialect

    with pytest.raises(GraphampError, match=r"^expected a \.pt2 path or a program, got dict$"):
        pt2.Pt2Dialect().load({"not": "a program"})
    with pytest.raises(GraphampError, match=r"^expected an nn\.Module, .*, got list$"):
        FxDialect().load([torch.zeros(2)])


# damaged archives ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_pt2(tmp_path_factory):
    """A two-layer program's archive (its members stored, as torch.export.save writes them)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    path = tmp_path_factory.mktemp("tiny") / "tiny.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 4),)), str(path))
    return path


def _rewritten(source, target, member, change):
    """``source`` written again to ``target`` with ``member``'s bytes changed (its CRC made
    to match, so only the content is damaged)."""
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as out:
        for item in archive.infolist():
            data = archive.read(item)
            out.writestr(item, change(data) if item.filename.endswith(member) else data)
    return target


def _edit_json(edit):
    def change(data):
        value = json.loads(data)
        edit(value)
        return json.dumps(value).encode()

    return change


def _first_weight(config):
    return config["config"][next(iter(config["config"]))]


def test_a_damaged_pt2_archive_is_one_line_naming_the_file_and_member(cli, tiny_pt2, tmp_path):
    """Whatever the damage (cut short, a flipped byte the CRC catches, JSON that does not parse
    or has values of the wrong type), exit 2 and one line naming the file and what is wrong,
    never zipfile's, json's or torch's exception as an internal error (exit 3)."""
    data = tiny_pt2.read_bytes()
    weights, program = "_weights_config.json", "models/model.json"
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(data[: len(data) // 2])
    crc = tmp_path / "crc.pt2"
    flipped = bytearray(data)
    flipped[data.index(b'"graph_module"') + 3] ^= 1  # inside the stored program's JSON
    crc.write_bytes(bytes(flipped))

    def sizes_int(config):
        _first_weight(config)["tensor_meta"]["sizes"] = 5

    def no_path(config):
        del _first_weight(config)["path_name"]

    def strides_short(config):
        _first_weight(config)["tensor_meta"]["strides"] = []

    def graph_int(program):
        program["graph_module"] = 5

    def inflated(config):  # a few stored bytes described as 2**40 elements, strides 0
        meta = _first_weight(config)["tensor_meta"]
        meta["sizes"] = [{"as_int": 1 << 20}, {"as_int": 1 << 20}]
        meta["strides"] = [{"as_int": 0}, {"as_int": 0}]

    def damaged(name, member, change):
        return _rewritten(tiny_pt2, tmp_path / name, member, change)

    cases = [
        (cut, "not a zip file"),
        (crc, f"member 'tiny/{program}' is damaged (CRC)"),
        (damaged("flip.pt2", program, lambda d: d[:-1] + b"]"), "not valid JSON"),
        (damaged("deep.pt2", program, lambda d: b"[" * 5000 + b"]" * 5000), "nested too deeply"),
        (damaged("list.pt2", weights, lambda d: b"[]"), 'schema: no "config" object'),
        (damaged("sizes.pt2", weights, _edit_json(sizes_int)), "'0.weight': the archive's JSON"),
        (damaged("path.pt2", weights, _edit_json(no_path)), "'0.weight' has no \"path_name\""),
        (damaged("strides.pt2", weights, _edit_json(strides_short)), "strides and shape"),
        (damaged("graph.pt2", program, _edit_json(graph_int)), f"{program}: the archive's JSON"),
        (damaged("big.pt2", weights, _edit_json(inflated)), "1,099,511,627,776 elements"),
    ]
    for path, fragment in cases:
        target = tmp_path / "out.pt2"
        assert_user_error(cli("convert", str(path), "-o", str(target)), str(path), fragment)
        assert not target.exists()
