"""tools/bench/profile_steps.py, issue 42's side-by-side profiles, kept working: two
configurations of a tiny ResNet profiled op by op (no time is asserted: tests never time
anything), and the table's order and group sums from tables given here."""

from __future__ import annotations

import pytest

from tests.helpers import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("tools/bench/profile_steps.py")


def cells(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in text.splitlines():
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if row[0] == first:
            return row[1:]
    raise AssertionError(f"no row {first!r} in\n{text}")


def test_ops_are_listed_by_the_largest_difference_and_summed_by_group(tool):
    tables = [
        {"aten::mm": (10.0, 4), "aten::mul": (1.0, 2), "aten::_to_copy": (2.0, 8)},
        {"aten::mm": (9.0, 4), "aten::mul": (6.0, 6), "aten::_foreach_add_": (0.5, 1)},
    ]
    text = tool.report(["a", "b"], tables, [[1.0, 2.0], [1.5, 2.0]], [[1.0, 1.0], [1.0, 2.0]], 3)
    listed = [line.split("|")[1].strip() for line in text.splitlines() if "aten::" in line]
    assert listed == ["aten::mul", "aten::_to_copy", "aten::mm"]  # 5.0, 2.0, 1.0 apart
    assert cells(text, "aten::mul") == ["1.0", "2", "6.0", "6", "5.0"]
    assert cells(text, "matrix products") == ["10.0", "4", "9.0", "4"]
    assert cells(text, "casts and copies") == ["2.0", "8", "0.0", "0"]
    assert cells(text, "optimizer (foreach)") == ["0.0", "0", "0.5", "1"]
    assert cells(text, "all") == ["13.0", "14", "15.5", "11"]
    # per-round ratios, medians: wall (1.5, 1.0) -> 1.25; CPU (1.0, 2.0) -> 1.5
    assert cells(text, "median wall ms (2 interleaved rounds)")[-1] == "1.250"
    assert cells(text, "median thread CPU ms (2 interleaved rounds)")[-1] == "1.500"


def test_two_configurations_of_a_tiny_resnet_side_by_side(tool, capsys):
    args = ["--model", "resnet50", "--scale", "tiny", "--configs", "autocast", "graphamp"]
    assert (
        tool.main([*args, "--warmup", "1", "--rounds", "1", "--threads", "1", "--top", "500"]) == 0
    )
    text = capsys.readouterr().out
    convolutions = cells(text, "aten::mkldnn_convolution")
    assert convolutions[1] == convolutions[3] != "0"  # the same convolutions, counted alike
    # graphamp's SGD update runs in foreach calls; autocast's torch.optim loop calls none
    foreach = cells(text, "optimizer (foreach)")
    assert foreach[1] == "0" and float(foreach[3]) > 0, text


def test_the_cut_and_whole_configurations_force_partitions_choice(tool):
    """graphamp-compiled-cut / -whole compile the step cut or whole whatever cut_pays says,
    and leave cut_pays as it was."""
    from graphamp.fx.training import partition

    chosen = partition.cut_pays
    for key, cut in (("graphamp-compiled-cut", True), ("graphamp-compiled-whole", False)):
        with tool.forced_cut(tool.FORCED_CUT[key]):
            assert partition.cut_pays(None) is cut
        assert partition.cut_pays is chosen
    with tool.forced_cut(None):
        assert partition.cut_pays is chosen
