"""Embedding tables stored in 8 bits with float8 (``convert --fp8 --fp8-embeddings``,
``Float8.static(embeddings=True)``): int8 with one scale per row, the Gather reading the int8
rows and their scales, multiplied back to the low type."""

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
from graphamp.onnx.numerics.runtime import run
from graphamp.plans.plan import Plan
from graphamp.plans.report import explain
from tests.helpers import weight

ROWS, WIDTH = 96, 64


def table_values() -> np.ndarray:
    """Rows of many magnitudes: normal rows, one all zero, one tiny, one huge, one a spike."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    table *= np.exp2(rng.integers(-6, 6, (ROWS, 1))).astype(np.float32)
    table[3] = 0.0
    table[5] *= 1e-6
    table[7] *= 1e3
    table[9] = 0.01
    table[9, 11] = 40.0
    return table


def ids_model(nodes: list, outputs: list, inits: list) -> onnx.ModelProto:
    """A model of ``nodes`` reading int64 token ids ``ids`` [2, 5], opset 21."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        outputs, inits,
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    return proto


def lookup_model(*, shared: int | None = None) -> onnx.ModelProto:
    """ids -> Gather(table) -> e (an output), e -> MatMul(w) -> Relu -> MatMul -> y; with
    ``shared`` (an axis) a second Gather, ``other``, reads the table too."""
    table = numpy_helper.from_array(table_values(), "table")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="head"),
    ]
    outputs = [
        helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 5, WIDTH]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
    ]
    inits = [table, weight("w", (WIDTH, 32)), weight("w2", (32, 16))]
    if shared is not None:
        other = helper.make_node("Gather", ["table", "picked"], ["e2"], name="other", axis=shared)
        nodes.insert(1, other)
        inits.append(numpy_helper.from_array(np.array([1, 4], np.int64), "picked"))
        outputs.append(helper.make_tensor_value_info("e2", TensorProto.FLOAT, None))
    return ids_model(nodes, outputs, inits)


def feeds(seed: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, ROWS, (2, 5)).astype(np.int64)
    ids[0, :4] = [3, 5, 7, 9]  # the zero, tiny, huge and spiked rows
    return {"ids": ids}


def converted(proto: onnx.ModelProto, **settings: object) -> gonnx.Conversion:
    ranges = gonnx.calibrate(proto, [feeds(seed) for seed in range(3)], histograms=True)
    return gonnx.convert(proto, fp8=graphamp.Float8.static(**settings), ranges=ranges)


def reference_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's int8 rows and float16 scales: max |row| / 127 rounded up to a float16 value
    (float16's smallest positive value where smaller, 1 for a zero row), then rint."""
    amax = np.abs(table).max(axis=1)
    exact = np.where(amax > 0, amax / np.float32(127), 1).astype(np.float32)
    scales = np.empty(len(exact), np.float16)
    for row, value in enumerate(exact):
        candidate = max(np.float16(value), np.float16(2.0**-24))
        if np.float32(candidate) < value:
            candidate = np.nextafter(candidate, np.float16(np.inf))
        scales[row] = candidate
    ints = np.clip(np.rint(table / scales.astype(np.float32)[:, None]), -127, 127)
    return ints.astype(np.int8), scales


def test_rows_round_trip_as_numpy_computes_them():
    table = table_values()
    ints, scales = float8.quantise_rows(table, np.float16)
    expected_ints, expected_scales = reference_rows(table)
    assert ints.dtype == np.int8 and scales.dtype == np.float16
    np.testing.assert_array_equal(ints, expected_ints)
    np.testing.assert_array_equal(scales.view(np.uint16), expected_scales.view(np.uint16))
    restored = ints.astype(np.float32) * scales.astype(np.float32)[:, None]
    # every row within half a step of its scale; each non-zero row reaches 126 or 127
    assert np.all(np.abs(restored - table) <= scales.astype(np.float32)[:, None] / 2)
    top = np.abs(ints.astype(np.int32)).max(axis=1)
    assert top[3] == 0 and np.all(top[~np.isin(np.arange(ROWS), [3, 5])] >= 126)
    # the tiny row takes float16's smallest scale, not 1 (which would flush it to zero)
    assert scales[5] == np.float16(2.0**-24) and 0 < top[5] < 126
    # the spiked row: its small values keep about 2 of 127 steps, as per-row scaling gives
    assert np.all(np.abs(ints[9, np.arange(WIDTH) != 11]) == 0)
    # blocks of rows give the same result as the whole table at once
    whole = float8.TABLE_BLOCK_ROWS
    try:
        float8.TABLE_BLOCK_ROWS = 7
        blocked = float8.quantise_rows(table, np.float16)
    finally:
        float8.TABLE_BLOCK_ROWS = whole
    np.testing.assert_array_equal(blocked[0], ints)


def test_the_table_is_stored_int8_and_both_runtimes_gather_its_rows_exactly():
    result = converted(lookup_model(), embeddings=True)
    proto = result.to_proto()
    onnx.checker.check_model(proto, full_check=True)
    inits = {init.name: init for init in proto.graph.initializer}
    assert "table" not in inits  # no float16 copy stays beside the int8 one
    stored = numpy_helper.to_array(inits["table/int8"])
    scales = numpy_helper.to_array(inits["table/row_scale"])
    assert stored.dtype == np.int8 and stored.shape == (ROWS, WIDTH)
    assert scales.dtype == np.float16 and scales.shape == (ROWS, 1)
    ints, expected = reference_rows(table_values())
    np.testing.assert_array_equal(stored, ints)
    ops = [node.op_type for node in proto.graph.node][:4]
    assert ops == ["Gather", "Gather", "Cast", "Mul"]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])
    reference = ReferenceEvaluator(proto)
    for seed in range(4):
        batch = feeds(10 + seed)
        ids = batch["ids"]
        want = (ints[ids].astype(np.float16) * expected.reshape(-1, 1)[ids]).astype(np.float16)
        got_ort = session.run(["e"], batch)[0]
        got_reference = np.asarray(reference.run(["e"], batch)[0])
        assert got_ort.dtype == got_reference.dtype == np.float16
        np.testing.assert_array_equal(got_ort.view(np.uint16), want.view(np.uint16))
        np.testing.assert_array_equal(got_reference.view(np.uint16), want.view(np.uint16))
        # the faithful evaluator too; the rows are within half an int8 step of float32's
        # (and the float16 rounding of the product)
        emulated, _ = run(proto, batch)
        np.testing.assert_array_equal(np.asarray(emulated["e"], np.float32), want)
        step = expected.astype(np.float32)[ids][..., None]
        restored = want.astype(np.float32)
        bound = step / 2 + np.abs(restored) * 2.0**-11
        assert np.all(np.abs(restored - table_values()[ids]) <= bound)


def test_the_plan_records_the_table_and_explain_says_why(tmp_path):
    result = converted(lookup_model(), embeddings=True)
    plan = result.plan
    decision = plan.fp8["embed"]
    assert decision.rule == "fp8_table" and decision.precision == "float16"
    assert decision.operands == ["table"]
    assert "stored int8 with one scale per row" in decision.reason
    (record,) = [r for r in plan.scales if r.tensor == "table"]
    assert (record.format, record.granularity, record.source) == ("int8", "row", "weight")
    assert record.detail == {"axis": 0} and record.consumers == ["embed"]
    assert record.describe() == "int8 per row, weight: at conversion"
    assert plan.fp8_settings is not None and plan.fp8_settings["embeddings"] is True
    assert plan.summary()["tables_8bit"] == 1 and plan.fp8_tables() == ["embed"]
    # the file says so and loads back to the same record
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert Plan.load(path).to_json() == plan.to_json()
    report = explain(Plan.load(path), "embed")
    assert "rule fp8_table: an embedding table 96 x 64: stored int8" in report
    assert "table 'table': int8 per row, weight: at conversion" in report
    # without the option: no lookup is decided, the settings do not name it
    plain = converted(lookup_model()).plan
    assert "embed" not in plain.fp8 and "embeddings" not in (plain.fp8_settings or {})
    assert "tables_8bit" not in plain.summary()


@pytest.mark.parametrize(
    ("model", "settings", "node", "rule", "reason"),
    [
        (lookup_model(shared=0), {"deny_names": ("oth*",)}, "embed", "fp8_deny",
         "'other' reads 'table' as it is too"),
        (lookup_model(shared=0), {"deny_names": ("oth*",)}, "other", "fp8_deny",
         "the float8 deny rule 'oth*'"),
        (lookup_model(shared=1), {}, "embed", "fp8_deny", "'other' reads 'table' as it is too"),
        (lookup_model(shared=1), {}, "other", "fp8_shape", "it indexes axis 1 of 'table'"),
        (lookup_model(), {"deny_names": ("emb*",)}, "embed", "fp8_deny",
         "the float8 deny rule 'emb*'"),
    ],
)  # fmt: skip
def test_a_table_that_cannot_go_8_bit_keeps_the_low_type_with_its_reason(
    model, settings, node, rule, reason
):
    result = converted(model, embeddings=True, **settings)
    decision = result.plan.fp8[node]
    assert decision.rule == rule and reason in decision.reason
    assert decision.reason.endswith("its table kept float16")
    assert not [r for r in result.plan.scales if r.tensor == "table"]
    inits = {init.name: init for init in result.to_proto().graph.initializer}
    assert inits["table"].data_type == TensorProto.FLOAT16 and "table/int8" not in inits


def test_embeddings_need_the_static_onnx_recipe():
    with pytest.raises(GraphampError, match="embeddings=True stores tables at conversion"):
        graphamp.Float8.current(embeddings=True)
    with pytest.raises(GraphampError, match="embeddings must be True or False"):
        graphamp.Float8.static(embeddings="yes")
    settings = graphamp.Float8.static(embeddings=True)
    assert graphamp.Float8.from_dict(settings.to_dict()) == settings
    assert "embeddings" not in graphamp.Float8.static().to_dict()


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    source, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(lookup_model(), str(source))
    np.savez(data, ids=np.concatenate([feeds(seed)["ids"] for seed in range(3)]))
    return source, data


@pytest.mark.parametrize("flag", ["--fp8-embeddings", "--fp8-kept-int8"])
def test_the_flag_without_fp8_is_one_line_and_writes_nothing(files, capsys, flag):
    source, data = files
    out = source.with_name("out.onnx")
    argv = ["convert", str(source), "-o", str(out), flag, "--calibrate", str(data)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"graphamp: error: {flag} is only used with --fp8"
    assert not out.exists()


def converted_again_and_from_the_plan(source: Path, fp8: list[str]) -> tuple[Path, Path]:
    """``source`` converted with the float8 flags ``fp8`` (its output and plan returned), and
    checked to stay byte for byte the same when its output is converted again, and when the
    plan is applied to ``source`` with no data (``--from-plan``)."""
    once, plan = source.with_name("once.onnx"), source.with_name("once.plan.json")
    assert main(["convert", str(source), "-o", str(once), "--plan", str(plan), *fp8]) == 0
    twice = source.with_name("twice.onnx")
    assert main(["convert", str(once), "-o", str(twice)]) == 0
    assert twice.read_bytes() == once.read_bytes()
    reviewed = source.with_name("reviewed.onnx")
    assert main(["convert", str(source), "-o", str(reviewed), "--from-plan", str(plan)]) == 0
    assert reviewed.read_bytes() == once.read_bytes()
    return once, plan


def test_converting_again_or_from_the_plan_keeps_the_8_bit_table(files, capsys):
    source, data = files
    # the int8 table and its Gathers stay, converted again or from the plan
    fp8 = ["--fp8", "--fp8-embeddings", "--calibrate", str(data)]
    _, plan = converted_again_and_from_the_plan(source, fp8)
    assert json.loads(plan.read_text())["fp8"]["embed"]["rule"] == "fp8_table"
    reviewed = source.with_name("reviewed.onnx")
    # a plan whose table decision the model no longer allows is refused, naming the node
    edited = json.loads(plan.read_text())
    edited["fp8_settings"]["deny_names"] = ["embed"]
    bad = source.with_name("bad.json")
    bad.write_text(json.dumps(edited))
    capsys.readouterr()
    assert main(["convert", str(source), "-o", str(reviewed), "--from-plan", str(bad)]) == 2
    assert "puts 'embed' in an 8-bit table, but the model now keeps it" in capsys.readouterr().err
    # check without the flag: the tables' decisions and records are a drift
    check = ["check", str(source), "--baseline", str(plan), "--fp8", "--calibrate", str(data)]
    assert main(check) == 1
    assert "fp8_table" in capsys.readouterr().out
    assert main([*check, "--fp8-embeddings"]) == 0


def position_model(*, shared: bool = False) -> onnx.ModelProto:
    """ids -> Gather(table) + pos (a folded position table) -> e -> MatMul(w) -> h, and
    h + offsets (a stored 2-D value added to no lookup) -> y; with ``shared`` a Mul reads
    ``pos`` too."""
    rng = np.random.default_rng(1)
    pos = (rng.standard_normal((5, WIDTH)) * np.exp2(rng.integers(-4, 4, (5, 1)))).astype(
        np.float32
    )
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["g"], name="embed"),
        helper.make_node("Add", ["g", "pos"], ["e"], name="position"),
        helper.make_node("MatMul", ["e", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "offsets"], ["y"], name="offset"),
    ]
    outputs = [
        helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 5, WIDTH]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
    ]
    inits = [
        numpy_helper.from_array(table_values(), "table"),
        numpy_helper.from_array(pos, "pos"),
        weight("w", (WIDTH, 32)),
        weight("offsets", (5, 32), seed=2),
    ]
    if shared:
        nodes.append(helper.make_node("Mul", ["pos", "pos"], ["p2"], name="square"))
        outputs.append(helper.make_tensor_value_info("p2", TensorProto.FLOAT, None))
    return ids_model(nodes, outputs, inits)


def test_a_position_table_added_to_a_lookup_is_stored_int8_and_read_exactly():
    source = position_model()
    result = converted(source, embeddings=True)
    decision = result.plan.fp8["position"]
    assert decision.rule == "fp8_table" and decision.operands == ["pos"]
    assert decision.reason.startswith("a position table 5 x 64 added to an embedding lookup")
    assert "offset" not in result.plan.fp8  # a stored value added to no lookup: as it was
    (record,) = [r for r in result.plan.scales if r.tensor == "pos"]
    assert (record.format, record.granularity, record.consumers) == ("int8", "row", ["position"])
    proto = result.to_proto()
    onnx.checker.check_model(proto, full_check=True)
    inits = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    assert "pos" not in inits and inits["offsets"].dtype == np.float16
    pos = numpy_helper.to_array(source.graph.initializer[1])
    ints, scales = reference_rows(pos)
    np.testing.assert_array_equal(inits["pos/int8"], ints)
    np.testing.assert_array_equal(inits["pos/row_scale"].view(np.uint16), scales.view(np.uint16))
    (dq,) = [node for node in proto.graph.node if node.op_type == "DequantizeLinear"]
    assert list(dq.input) == ["pos/int8", "pos/row_scale"] and dq.attribute[0].i == 0
    # the Add's operand, as every runtime computes it: int8 x its row's scale, one rounding
    proto.graph.output.append(helper.make_empty_tensor_value_info("pos/int8_dq"))
    want = (ints * scales.astype(np.float32)[:, None]).astype(np.float16)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])
    batch = feeds(3)
    got = {
        "onnxruntime": session.run(["pos/int8_dq"], batch)[0],
        "onnx.reference": ReferenceEvaluator(proto).run(["pos/int8_dq"], batch)[0],
        "faithful evaluator": run(proto, batch)[0]["pos/int8_dq"],
    }
    for runtime, value in got.items():
        np.testing.assert_array_equal(np.asarray(value, np.float32), want, err_msg=runtime)
    bound = scales.astype(np.float32)[:, None] / 2 + np.abs(want.astype(np.float32)) * 2.0**-11
    assert np.all(np.abs(want.astype(np.float32) - pos) <= bound)


def test_a_position_table_another_op_reads_keeps_the_low_type():
    result = converted(position_model(shared=True), embeddings=True)
    decision = result.plan.fp8["position"]
    assert decision.rule == "fp8_deny" and "'square' reads 'pos' as it is too" in decision.reason
    assert not [r for r in result.plan.scales if r.tensor == "pos"]
    assert result.plan.fp8["embed"].rule == "fp8_table"  # the lookup's own table still 8-bit
