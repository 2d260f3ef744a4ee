"""tools/bench/curve_spread.py and gpu_train.held_out_inside: whether one configuration's loss
curves lie inside another's run-to-run spread, asked so that a second set of runs of the same
configuration passes and a shifted one fails."""

from __future__ import annotations

import json
import random

import pytest

from tests.helpers import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("tools/bench/curve_spread.py")


def curves(seed: int, count: int, shift: float = 0.0) -> list[list[float]]:
    """``count`` noisy falling curves of 100 steps (each run its own level, as seeds give)."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        level = rng.gauss(0, 0.05)
        found.append([2.0 * 0.99**i + level + shift + rng.gauss(0, 0.01) for i in range(100)])
    return found


def test_runs_of_the_same_kind_are_inside_at_the_held_out_rate(tool):
    """Eight more runs drawn as the baseline's: the bench's all-inside count is low for them
    (every one of 8 inside 8 others' range is rare), but their held-out share is near the
    baseline's own; runs shifted by 0.5 are inside nowhere."""
    import gpu_train

    theirs, same, shifted = curves(0, 8), curves(1, 8), curves(2, 8, shift=0.5)
    ours_share, theirs_share, windows = gpu_train.held_out_inside(same, theirs)
    assert windows == 10 and 0.5 < theirs_share < 1.0
    assert abs(ours_share - theirs_share) < 0.25
    assert gpu_train.held_out_inside(shifted, theirs)[0] == 0.0
    assert gpu_train.held_out_inside(same, theirs[:2]) is None


def test_the_tool_reads_a_saved_result_and_prints_the_three_figures(tool, tmp_path, capsys):
    path = tmp_path / "bench-speedup-curves-bert-base.json"
    results = {"bert-base": {"autocast": curves(0, 8), "graphamp": curves(1, 8)}}
    path.write_text(json.dumps({"environment": "test", "results": results}))
    assert tool.main([str(path), "--splits", "200"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| bert")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "8 / 8" and cells[2].endswith("/10")
    assert "(" in cells[3] and cells[4].count("%") == 2


@pytest.mark.parametrize("content", ["{}", "not json", '{"results": {"m": [1, 2]}}'])
def test_a_file_that_is_not_a_curves_result_is_one_line_and_status_2(
    tool, tmp_path, capsys, content
):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(SystemExit) as stopped:
        tool.main([str(path)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"curve_spread: {path}") and "\n" not in err
