"""Float8 in the plan: JSON at version 2 (version 1 plans still load), checks of the float8
fields, diff and check by source and granularity rather than values, explain naming both
operands' scale sources."""

from __future__ import annotations

import copy
import json

import pytest

from graphamp.errors import GraphampError
from graphamp.plans.plan import PLAN_VERSION, Plan
from graphamp.plans.report import explain, text_table
from graphamp.training.float8 import Float8
from tests.opgraphs import calibrated, mlp, run


@pytest.fixture
def fp8_plan() -> Plan:
    graph = mlp()
    return run(graph, Float8.static(), calibrated(graph)).plan("mlp")


def test_a_float8_plan_round_trips_at_version_2(fp8_plan):
    text = fp8_plan.to_json()
    data = json.loads(text)
    assert data["version"] == PLAN_VERSION == 2
    assert list(data)[-3:] == ["fp8_settings", "fp8", "scales"]
    # one line per float8 decision and per scale
    for name in data["fp8"]:
        assert sum(line.lstrip().startswith(json.dumps(name)) for line in text.splitlines()) == 2
    assert sum('"tensor": ' in line for line in text.splitlines()) == len(data["scales"])
    loaded = Plan.from_dict(data)
    assert loaded.to_json() == text
    assert loaded.fp8["up"].operands == ["x", "w_up"]
    assert Float8.from_dict(loaded.fp8_settings) == Float8.static()


def test_a_version_1_plan_still_loads_and_writes_the_same_bytes():
    plan = run(mlp(), None).plan("mlp")
    text = plan.to_json()
    assert json.loads(text)["version"] == 1
    assert Plan.from_dict(json.loads(text)).to_json() == text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=3), "plan version 3 is not supported"),
        (lambda d: d.update(version=1), "a version 1 plan holds no fp8_settings"),
        (lambda d: d.pop("scales"), "scales must be present"),
        (lambda d: d["fp8"]["up"].update(rule="allow"), "fp8['up'].rule must be a float8 rule"),
        (
            lambda d: d["scales"][0].update(source="guess"),
            "scales[0].source must be a scale source",
        ),
        (lambda d: d["scales"][0].update(granularity="block"), "must be a granularity"),
        (
            lambda d: d["fp8"].update(ghost=d["fp8"]["up"]),
            "fp8['ghost'] must be a node of the plan",
        ),
    ],
)
def test_malformed_float8_fields_are_one_line_errors(fp8_plan, change, message):
    data = json.loads(fp8_plan.to_json())
    change(data)
    with pytest.raises(GraphampError, match="plan") as raised:
        Plan.from_dict(data)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_diff_compares_scale_sources_and_granularity_not_values(fp8_plan):
    other = copy.deepcopy(fp8_plan)
    for record in other.scales:  # other calibration data: other values, same decisions
        if "amax" in record.detail:
            record.detail["amax"] = float(record.detail["amax"]) * 1.5
            record.detail["batches"] = 8
    assert fp8_plan.diff(other).empty
    changed = copy.deepcopy(fp8_plan)
    changed.scales[0].granularity = "row"
    diff = fp8_plan.diff(changed)
    assert not diff.empty and len(diff.scales_changed) == 1
    assert "@@ scales: 1 changed @@" in diff.to_text()
    assert diff.to_dict()["scales_changed"][0]["to"]["granularity"] == "row"


def test_diff_lists_float8_decisions_that_change(fp8_plan):
    graph = mlp()
    denied = run(graph, Float8.static(deny_names=("down",)), calibrated(graph)).plan("mlp")
    diff = fp8_plan.diff(denied)
    assert [name for name, _, _ in diff.fp8_changed] == ["down"]
    assert diff.fp8_settings is not None  # the deny rule is a setting
    text = diff.to_text()
    assert "-down  float8_e4m3fn  fp8" in text and "+down  float16  fp8_deny" in text
    # against a plan made without float8, every decision and scale is a change
    plain = run(mlp(), None).plan("mlp")
    assert not fp8_plan.diff(plain).empty
    # and two plans without float8 diff as before: no float8 keys in the JSON
    assert "fp8_changed" not in plain.diff(plain).to_dict()


def test_explain_names_both_operands_scale_sources(fp8_plan):
    text = explain(fp8_plan, "up")
    lines = text.splitlines()
    assert lines[1].startswith("  float8: float8_e4m3fn, rule fp8: K = 64, N = 128")
    amax = next(r for r in fp8_plan.scales if r.tensor == "x").detail["amax"]
    assert (
        lines[2]
        == f"  operand A 'x': e4m3fn per tensor, calibration: max |x| = {amax:.6g} on 4 batches"
    )
    assert lines[3] == "  operand B 'w_up': e4m3fn per channel, weight: at conversion"
    kept = explain(fp8_plan, "head").splitlines()
    assert "rule fp8_deny: the last matrix op" in kept[1]
    assert kept[2] == "  operand A 'down': not quantised (float16)"
    table = text_table(fp8_plan)
    assert "float8 (2 of 3 matrix ops decided low)" in table


def test_explain_of_delayed_and_current_scales():
    plan = run(mlp(), Float8.delayed(history=16, margin=1, sizes="none")).plan("mlp")
    assert "operand A 'x': e4m3fn per tensor, delayed: history 16, max, margin 1" in explain(
        plan, "up"
    )
    plan = run(mlp(), Float8.current("row", sizes="none")).plan("mlp")
    assert "operand B 'w_up': e4m3fn per row, current: this step's amax" in explain(plan, "up")
