"""The ``range`` rule and the ``tuned`` pass on OpGraphs built in code, and Ranges files."""

from __future__ import annotations

import pytest

from graphamp.core.vocab import Precision, Rule
from graphamp.errors import GraphampError
from graphamp.numerics.ranges import Ranges, TensorRange, limit, range_decisions
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import DECIDING, MODEL
from graphamp.policy.policy import Policy
from tests.opgraphs import GraphBuilder


def ranges_of(**largest: float) -> Ranges:
    return Ranges({name: TensorRange(value, value / 100, 0) for name, value in largest.items()}, 2)


def two_branches():
    """x -> mm (MatMul) -> relu -> mm2 ; x -> side (MatMul) ; add(mm2, side) -> out."""
    b = GraphBuilder()
    x = b.input("x")
    b.op("mm", "MatMul", [x, b.weight("w1")])
    b.op("relu", "Relu", ["mm"])
    b.op("mm2", "MatMul", ["relu", b.weight("w2")])
    b.op("side", "MatMul", [x, b.weight("w3")])
    b.op("add", "Add", ["mm2", "side"])
    return b.output("add")


def decide(graph, ranges=None, tuned=None, dtype="float16", **policy):  # type: ignore[no-untyped-def]
    options = Options(ranges=ranges, tuned=frozenset(tuned or ()))
    context = PassContext(graph, Policy.create(dtype, **policy), options)
    return PassManager(MODEL, check=True).run(context).decisions


def test_range_and_tuned_run_after_classify_and_before_every_spread():
    names = PassManager(DECIDING).names
    for spreading in ("paint", "promote", "cost", "spread_all"):
        assert names.index("classify") < names.index("range") < names.index(spreading)
        assert names.index("range") < names.index("tuned") < names.index(spreading)


@pytest.mark.parametrize("spread", ["cost", "tensorflow", "autocast", "all"])
def test_tuned_and_range_nodes_stay_float32_under_every_spread(spread):
    """Both rules are deny seeds under every spread; under ``all`` the tuned pass once came
    after the decide step (an order by import) and so never ran."""
    graph = two_branches()
    found = decide(graph, ranges_of(mm=2.0e5), tuned={"side"}, spread=spread)
    assert (found["side"].rule, found["side"].precision) == (Rule.TUNED, Precision.FLOAT32)
    assert (found["mm"].rule, found["mm"].precision) == (Rule.RANGE, Precision.FLOAT32)


def test_an_overflowing_value_keeps_its_producer_and_readers_float32_with_the_value_named():
    graph = two_branches()
    found = decide(graph, ranges_of(x=3.0, mm=2.0e5, relu=1.9e5, mm2=40.0, side=5.0, add=41.0))
    assert {n for n, d in found.items() if d.rule is Rule.RANGE} == {"mm", "relu", "mm2"}
    assert found["mm"].precision == Precision.FLOAT32
    assert "'mm' reaches |x| = 200000" in found["mm"].reason
    assert "2 batches" in found["mm"].reason and "float16's limit 32752" in found["mm"].reason
    assert "'relu' reaches |x| = 190000" in found["mm2"].reason  # its own largest value
    assert found["side"].precision == Precision.FLOAT16  # the healthy branch stays low
    without = decide(two_branches())
    assert without["mm"].precision == Precision.FLOAT16 and without["mm"].rule is Rule.ALLOW


def test_the_float16_margin_is_one_binade_and_bfloat16_keeps_only_what_it_cannot_hold():
    assert limit("float16") == 65504 / 2
    assert limit("float16", margin=1.0) == pytest.approx(65519.99, abs=0.01)
    graph = two_branches()
    just_below = ranges_of(mm=32000.0)
    assert not range_decisions(just_below, graph, "float16")
    assert set(range_decisions(ranges_of(mm=40000.0), graph, "float16")) == {"mm", "relu"}
    # 1e30 fits bfloat16; float32's largest value (a finfo.min mask) rounds to inf in it
    assert not range_decisions(ranges_of(mm=1e30), graph, "bfloat16")
    assert set(range_decisions(ranges_of(mm=3.4e38), graph, "bfloat16")) == {"mm", "relu"}


def test_a_node_already_float32_for_its_own_reason_keeps_that_reason():
    found = decide(two_branches(), ranges_of(mm=1e5), deny_names=["mm"])
    assert found["mm"].rule is Rule.DENY_NAME
    assert found["relu"].rule is Rule.RANGE


def test_tuned_nodes_are_deny_seeds_like_the_deny_names_snippet_tune_prints():
    tuned = decide(two_branches(), tuned={"side"})
    named = decide(two_branches(), deny_names=["side"])
    assert tuned["side"].rule is Rule.TUNED and named["side"].rule is Rule.DENY_NAME
    assert {n: d.precision for n, d in tuned.items()} == {n: d.precision for n, d in named.items()}
    with pytest.raises(GraphampError, match="tuned node 'nope' is not a node"):
        decide(two_branches(), tuned={"nope"})


def test_ranges_round_trip_through_json_and_merge_over_batches(tmp_path):
    first = Ranges({"a": TensorRange(3.0, 0.5, 0)}, 1, "m")
    first.update(Ranges({"a": TensorRange(2.0, 0.25, 1), "b": TensorRange(7.0, None, 0)}, 1))
    assert first.tensors["a"] == TensorRange(3.0, 0.25, 1)
    assert first.batches == 2
    path = tmp_path / "r.json"
    first.save(path)
    again = Ranges.load(path)
    assert again.tensors == first.tensors and again.batches == 2 and again.model == "m"
    assert again.to_json() == first.to_json()
    path.write_text('{"format": "graphamp-ranges", "version": 1, "tensors": {"a": 3}}')
    with pytest.raises(GraphampError, match="malformed ranges"):
        Ranges.load(path)


def test_binade_histograms_merge_round_trip_and_give_the_underflow_share():
    import json

    import numpy as np

    from graphamp.numerics.ranges import log2_counts, underflow_share

    values = np.array([0.0, 1.0, 1.5, -3.0, 0.25, np.inf, 2.0**-20], np.float32)
    counts = log2_counts(values)
    assert counts == ((-20, 1), (-2, 1), (0, 2), (1, 1))  # zero and inf are not counted
    first = TensorRange(3.0, 2.0**-20, 1, counts)
    merged = first.merged(TensorRange(4.0, 0.5, 0, log2_counts(np.array([4.0, 0.5]))))
    assert merged.log2_counts == ((-20, 1), (-2, 1), (-1, 1), (0, 2), (1, 1), (2, 1))
    # binades wholly below the threshold: 2**-20's, not 0.25's (its binade reaches 0.5)
    assert underflow_share(first, 0.3) == 1 / 5
    assert underflow_share(TensorRange(1.0, None), 0.3) is None
    ranges = Ranges({"a": first, "b": TensorRange(1.0, None)}, batches=2)
    data = ranges.to_dict()
    assert "log2_counts" in data["tensors"]["a"] and "log2_counts" not in data["tensors"]["b"]
    assert Ranges.from_dict(json.loads(ranges.to_json())).tensors == ranges.tensors
