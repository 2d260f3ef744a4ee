"""The switchable evaluator computes what the real conversion computes under the faithful
evaluator, for any set of nodes kept float32; and the search finds small sets."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graphamp import engine
from graphamp.numerics.search import ddmin, find_kept
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.onnx.numerics.runtime import run
from graphamp.onnx.numerics.session import as_proto
from graphamp.onnx.numerics.switchable import Switchable
from graphamp.onnx.numerics.tuning import Decider
from graphamp.passes.options import Options
from graphamp.policy.policy import Policy
from tests.helpers import chain
from tests.numerics import numerics_models as planted


def unnamed_chain() -> onnx.ModelProto:
    """A chain whose nodes carry no names (the reader names them) and share a weight."""
    proto = chain(["MatMul", "Add", "Relu", "MatMul", "Softmax", "Mul", "Tanh"], weight_scale=8.0)
    for node in proto.graph.node:
        node.name = ""
    return proto


def fully_masked_attention() -> onnx.ModelProto:
    """Scores plus a mask at float32's lowest in every column (a fully masked row, as padding
    gives), Softmax, @ v: the conversion stores the mask at the low type's lowest, so each row
    stays a distribution over finite values; rounded to inf instead, it would be NaN."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
        helper.make_node("Add", ["s", "mask"], ["m"], name="masked"),
        helper.make_node("Softmax", ["m"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="attend"),
    ]
    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.1).astype(np.float32), "w"),
        numpy_helper.from_array(np.full((1, 16), np.finfo(np.float32).min, np.float32), "mask"),
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "v"),
    ]
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "masked",
        [helper.make_tensor_value_info("x", f32, [4, 16])],
        [helper.make_tensor_value_info("y", f32, None)],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    proto.ir_version = 10
    return proto


GRAPHS = {
    "mask": fully_masked_attention,
    "overflow": planted.overflowing_hidden_layer,
    "cancellation": planted.cancellation_beside_a_healthy_branch,
    "softmax": planted.softmax_over_large_logits,
    "unnamed_chain": unnamed_chain,
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_switchable_agrees_with_the_real_conversion(name, dtype):
    proto = GRAPHS[name]()
    width = proto.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    feeds = planted.batches(1, width=width)[0]
    policy = Policy.create(dtype)
    analysis = engine.analyse(proto, policy, dialect=OnnxDialect())
    decide = Decider(analysis, policy, Options())
    switch = Switchable(proto, analysis.graph, dtype)
    low_nodes = sorted(decide(frozenset()))
    assert low_nodes  # something to switch
    rng = np.random.default_rng(0)
    sets = [(), tuple(low_nodes[:1]), tuple(low_nodes[-1:])]
    sets.append(tuple(n for n in low_nodes if rng.random() < 0.5))
    for kept in sets:
        options = Options(tuned=frozenset(kept))
        converted = engine.convert(proto, policy, dialect=OnnxDialect(), options=options)
        real, evaluator = run(engine_proto(converted), feeds)
        low = decide(frozenset(kept))
        assert (f"{dtype} rounding emulated" in evaluator) == bool(low)
        switched = switch.run(feeds, low)
        for output, want in real.items():
            np.testing.assert_allclose(switched[output], want, rtol=1e-6, atol=0, err_msg=name)
    # and all float32 is the float32 model exactly
    float32 = run(proto, feeds)[0]
    for output, got in switch.run(feeds, ()).items():
        np.testing.assert_array_equal(got, float32[output])


def engine_proto(conversion):  # type: ignore[no-untyped-def]
    return as_proto(conversion.model)  # the converted ModelProto


def test_search_finds_the_planted_set_with_few_evaluations():
    needed = {"n3", "n17"}
    ranked = [f"n{i}" for i in (3, 5, 8, 17, 1, 2)] + [f"n{i}" for i in range(20, 60)]
    asked: list[frozenset[str]] = []

    def meets(kept: frozenset[str]) -> bool:
        asked.append(kept)
        return needed <= kept

    result = find_kept(ranked, meets)
    assert result.met and set(result.kept) == needed and result.kept == ("n3", "n17")
    assert result.prefix == 4  # n3, n5, n8, n17
    assert result.evaluations == len(asked) == len(set(asked)) <= 12


def test_search_reports_a_tolerance_no_set_meets():
    result = find_kept(["a", "b"], lambda kept: False)
    assert not result.met and result.kept == ("a", "b") and result.evaluations == 2
    assert find_kept(["a"], lambda kept: True).kept == ()


def test_ddmin_is_one_minimal_when_any_of_two_pairs_will_do():
    def test(kept):  # type: ignore[no-untyped-def]
        return {"a", "b"} <= set(kept) or {"c", "d"} <= set(kept)

    found = ddmin(list("abcdefgh"), test)
    assert found in (["a", "b"], ["c", "d"])
    for name in found:
        assert not test([n for n in found if n != name])
