"""graphamp.Float8: the recipes, their checks, the plan's record, and no torch at import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import graphamp
from graphamp.errors import GraphampError
from graphamp.training.float8 import Float8


def test_recipes_and_their_defaults():
    current = graphamp.Float8.current()
    assert (current.recipe, current.granularity, current.sizes, current.keep_last) == (
        "current", "tensor", "torchao", True
    )  # fmt: skip
    assert Float8.current("row").granularity == "row"
    delayed = Float8.delayed(history=16, algorithm="most_recent", margin=2)
    assert delayed.source() == "delayed"
    assert delayed.source_detail() == {"history": 16, "algorithm": "most_recent", "margin": 2}
    static = Float8.static(deny_names=["lm_head*"])
    assert static.source() == "calibration" and static.sizes == "none"
    assert static.deny_names == ("lm_head*",)
    # one binade of headroom by default: amax * 2 / 448
    assert static.margin == 1 and static.scale_of(448.0 * 3) == 6.0 and static.scale_of(0.0) == 1.0
    assert Float8.static(margin=0).scale_of(448.0 * 3) == 3.0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Float8.current("block"), "granularity must be one of"),
        (lambda: Float8.delayed(history=0), "history must be a whole number >= 1"),
        (lambda: Float8.delayed(algorithm="mean"), "algorithm must be one of"),
        (lambda: Float8.delayed(margin=-1), "margin must be a whole number >= 0"),
        (lambda: Float8(recipe="dynamic"), "recipe must be one of"),
        (lambda: Float8.current(max_underflow=2.0), "max_underflow must be a share"),
        (lambda: Float8.current(deny_names="lm_head"), "deny_names must be a sequence"),
        (lambda: Float8.current(sizes="big"), "sizes must be one of"),
        (lambda: Float8.current(keep_last="no"), "keep_last must be True or False, not 'no'"),
        (lambda: Float8.static(granularity="row"), "activations take one scale per tensor"),
    ],
)
def test_bad_settings_are_one_line_errors(make, message):
    with pytest.raises(GraphampError, match=message):
        make()


def test_the_plan_record_round_trips():
    for settings in (Float8.current("row"), Float8.delayed(history=16), Float8.static()):
        assert Float8.from_dict(settings.to_dict()) == settings
    assert "history" not in Float8.current().to_dict()
    with pytest.raises(GraphampError, match="unknown float8 setting 'speed'"):
        Float8.from_dict({"recipe": "current", "speed": 2})


def test_importing_the_settings_imports_no_torch():
    code = "import sys, graphamp; graphamp.Float8.current(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
