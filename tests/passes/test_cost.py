"""The cost pass (``spread = "cost"``, ONNX's default): infer and clear ops decided by a minimum
cut of the bytes Casts move and stored weights take, every other rule kept."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphamp.core.graph import NodeKind
from graphamp.core.vocab import Rule
from graphamp.passes import PassContext, PassManager
from graphamp.passes.classify import ClassifyPass
from graphamp.passes.cost import F32, LOW, decide_by_cost
from graphamp.passes.cost_terms import cost_terms
from graphamp.passes.min_cut import cut
from graphamp.policy.policy import Policy
from tests.helpers import assert_valid, chain, convert, model, precisions, weight
from tests.opgraphs import GraphBuilder


def _values(name: str, shape: tuple[int, ...], seed: int = 0) -> TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)


def test_a_cast_sits_before_an_op_that_makes_its_value_larger():
    # MatMul (low) -> Expand 1x16 -> 64x16 -> Exp (float32): the Cast goes before the Expand
    # (16 values), where TensorFlow's colouring puts it after (1024 values).
    shape = numpy_helper.from_array(np.array([64, 16], np.int64), "shape")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Expand", ["m", "shape"], ["e"], name="expand"),
        helper.make_node("Exp", ["e"], ["y"], name="exp"),
    ]
    proto = model(nodes, initializers=[_values("w", (16, 16)), shape], shape=(1, 16))
    out, plan = convert(proto)
    assert precisions(plan)["expand"] == "float32"
    assert [(c.tensor, c.bytes) for c in plan.casts] == [("m", 16 * 6)]
    assert plan.summary()["cast_bytes"] == 96
    _, colouring = convert(proto, spread="tensorflow")
    assert precisions(colouring)["expand"] == "float16"
    assert [(c.tensor, c.bytes) for c in colouring.casts] == [("e", 64 * 16 * 6)]
    assert_valid(out)


def test_an_infer_op_beside_a_low_op_takes_its_weight_low():
    # MatMul -> Add(bias) -> Exp: the Cast costs the same before or after the Add, and the
    # Add low stores its bias once, in float16 (TensorFlow's rules keep the Add float32).
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Exp", ["a"], ["y"], name="exp"),
    ]
    proto = model(nodes, initializers=[weight("w"), weight("b", seed=1)])
    out, plan = convert(proto)
    assert precisions(plan)["add"] == "float16"
    assert {w.name: w.dst for w in plan.weights} == {"w": "float16", "b": "float16"}
    assert [c.tensor for c in plan.casts] == ["a"]
    assert "float32 here would move 32 bytes more" in plan.nodes["add"].reason
    assert plan.nodes["add"].via == "mm"
    assert_valid(out)


def test_an_embedding_table_is_stored_low_and_its_rows_cast():
    # Gather(table, ids) -> Add(position rows) -> Exp: nothing else is low, yet the table is
    # stored float16 and the Cast to float32 comes after the Gather (4 rows, not 64).
    ids = numpy_helper.from_array(np.array([[1, 5, 9, 2]], np.int64), "ids")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather"),
        helper.make_node("Exp", ["rows"], ["y"], name="exp"),
    ]
    proto = model(
        nodes, inputs=(), initializers=[_values("table", (64, 16)), ids], shape=(1, 4, 16)
    )
    out, plan = convert(proto)
    assert precisions(plan)["gather"] == "float16"
    (table,) = plan.weights
    assert (table.name, table.dst, table.in_place) == ("table", "float16", True)
    assert [(c.tensor, c.bytes) for c in plan.casts] == [("rows", 4 * 16 * 6)]
    _, colouring = convert(proto, spread="tensorflow")
    assert precisions(colouring)["gather"] == "float32" and not colouring.weights
    assert_valid(out)


def test_a_weight_that_does_not_fit_keeps_its_exact_reader_float32():
    big = numpy_helper.from_array(np.full((64, 16), 1e5, np.float32), "table")
    ids = numpy_helper.from_array(np.array([[1, 5]], np.int64), "ids")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather"),
        helper.make_node("Exp", ["rows"], ["y"], name="exp"),
    ]
    _, plan = convert(model(nodes, inputs=(), initializers=[big, ids]))
    assert plan.nodes["gather"].rule == "weight_range"
    assert [w.name for w in plan.kept_weights] == ["table"]


def test_a_tie_goes_low():
    # MatMul -> Relu -> kept output: one Cast either side of the Relu, and in float16 the Relu
    # reads and writes half the bytes: the tie goes low.
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    _, plan = convert(model(nodes, initializers=[weight("w")]), keep_io_types=True)
    assert precisions(plan)["relu"] == "float16"
    reason = plan.nodes["relu"].reason  # 16 elements read and 16 written, 2 bytes more each
    assert "no fewer bytes through Casts and weights, and 64 bytes more through the op" in reason
    assert "(a tie goes low)" in reason
    assert [c.dst for c in plan.output_casts] == ["float32"]  # the Cast after the Relu
    _, colouring = convert(model(nodes, initializers=[weight("w")]), spread="tensorflow")
    assert precisions(colouring)["relu"] == "float16"


def _low_ops(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(n for n, d in plan.nodes.items() if d.precision == "float16")


def test_tensorflow_simple_case_ties_go_low():
    """TF's AutoMixedPrecisionTest.Simple (its relu1..relu5 are relu1, relu3, relu5, relu7,
    relu9 here): Exp, relu1, Sqrt float32; relu3, the MatMul, relu5 low (each a Relu between a
    float32 op and the MatMul: one Cast either side); Log, relu7, the unlisted op and relu9
    float32. The cost pass paints it as TensorFlow's colouring does."""
    ops = ["Exp", "Relu", "Sqrt", "Relu", "MatMul", "Relu", "Log", "Relu", "Sin", "Relu"]
    _, plan = convert(chain(ops))
    assert _low_ops(plan) == ["matmul4", "relu3", "relu5"]
    assert "(a tie goes low)" in plan.nodes["relu3"].reason
    assert plan.nodes["sqrt2"].rule == "deny_spread" and plan.nodes["relu7"].precision == "float32"
    assert plan.summary()["casts_inserted"] == 2  # before relu3, after relu5: as TF's +2
    _, colouring = convert(chain(ops), spread="tensorflow")
    assert _low_ops(colouring) == _low_ops(plan)


def _relu_between(op: str, first: str, second: str) -> onnx.ModelProto:
    """``first`` (an ``op`` of x and w1) -> Relu -> ``second`` (an ``op`` of its result and
    w2)."""
    nodes = [
        helper.make_node(op, ["x", "w1"], ["h"], name=first),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node(op, ["r", "w2"], ["y"], name=second),
    ]
    return model(nodes, initializers=[weight("w1"), weight("w2", seed=1)])


def test_mxnet_excluded_name_case_ties_go_low():
    """MXNet's two FCs, one excluded by name (DisableAMP): the Relu after the excluded FC and
    before the low one runs low, its Cast before it, as TensorFlow's colouring paints it."""
    for spread in ("cost", "tensorflow"):
        _, plan = convert(_relu_between("Gemm", "fc1", "fc2"), deny_names=["fc1"], spread=spread)
        assert _low_ops(plan) == ["fc2", "relu"], spread
        assert [c.tensor for c in plan.casts] == ["h"], spread
        assert spread != "cost" or "(a tie goes low)" in plan.nodes["relu"].reason


def test_paddle_denied_parameter_case_ties_go_low():
    """Paddle's custom_black_varnames naming a MatMul's parameter (deny_tensors): the Relu
    between the low MatMul and the denied one runs low, its Cast after it, as TensorFlow's
    colouring paints it."""
    for spread in ("cost", "tensorflow"):
        _, plan = convert(_relu_between("MatMul", "mm1", "mm2"), deny_tensors=["w2"], spread=spread)
        assert _low_ops(plan) == ["mm1", "relu"], spread
        assert plan.nodes["mm2"].rule == "deny_tensor", spread
        assert [c.tensor for c in plan.casts] == ["r"], spread
        assert spread != "cost" or "(a tie goes low)" in plan.nodes["relu"].reason


def test_a_tie_goes_low_only_where_the_casts_tie():
    """Ties go low; a Cast saved still wins: MatMul -> Relu -> Relu -> Exp moves one Cast
    wherever it sits (both Relus low), but Exp -> Relu -> Exp keeps the Relu float32 (low, it
    would need two Casts), and so do four clear ops between two Exps, although their halved
    traffic (4 x 64 bytes) would pay for the two Casts (2 x 96): the ops' own traffic only
    breaks the Casts' ties, it overturns no decision they make."""
    _, plan = convert(chain(["MatMul", "Relu", "Relu", "Exp"]))
    assert _low_ops(plan) == ["matmul0", "relu1", "relu2"]
    _, plan = convert(chain(["Exp", "Relu", "Exp"]))
    assert _low_ops(plan) == []
    _, plan = convert(chain(["Exp", "Relu", "Transpose", "Relu", "Relu", "Exp"]))
    assert _low_ops(plan) == []


def test_deny_spreads_and_name_rules_hold_under_cost():
    nodes = [
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Add", ["e", "b"], ["a"], name="add"),  # downstream of deny, to Sigmoid
        helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
        helper.make_node("MatMul", ["s", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm2"),
    ]
    proto = model(nodes, initializers=[weight("w"), weight("b", seed=2)])
    _, plan = convert(proto)
    assert plan.nodes["add"].rule == "deny_spread" and plan.nodes["add"].precision == "float32"
    assert precisions(plan)["relu"] == "float16"
    _, named = convert(proto, deny_names=["relu"])
    assert named.nodes["relu"].rule == "deny_name"
    # s into mm (Sigmoid is float32 by deny's spread), m out of mm and r into mm2 (the Relu)
    assert sorted(c.tensor for c in named.casts) == ["m", "r", "s"]


def test_keep_io_types_keeps_the_input_and_the_cast_goes_where_it_is_cheapest():
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
        helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
    ]
    inits = [
        weight("w", shape=(16, 4)),
        numpy_helper.from_array(np.array([0], np.int64), "starts"),
        numpy_helper.from_array(np.array([1], np.int64), "ends"),
    ]
    proto = model(nodes, initializers=inits, shape=(8, 16))
    _, free = convert(proto)  # the input takes float16: no Cast at all
    assert not free.casts and precisions(free)["slice"] == "float16"
    out, kept = convert(proto, keep_io_types=True)  # the Cast after the Slice: 16 values, not 128
    assert precisions(kept)["slice"] == "float32"
    assert [(c.tensor, c.bytes) for c in kept.casts if c.purpose == "precision boundary"] == [
        ("s", 16 * 6)
    ]
    assert_valid(out)


def test_explain_says_why_a_cast_sits_where_it_does(tmp_path):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Exp", ["r"], ["y"], name="exp"),
    ]
    path = tmp_path / "m.onnx"
    import onnx

    onnx.save(model(nodes, initializers=[weight("w")]), str(path))
    done = subprocess.run(
        [sys.executable, "-m", "graphamp.cli", "explain", str(path), "r__float32"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    # one Cast before or after the Relu: a tie, which goes low (the Relu moves half the bytes)
    assert "Cast 'r__float32': 'r' float16 -> float32 (96 bytes per run)" in text
    assert "comes from relu (Relu): float16" in text and "read by exp (Exp): float32" in text
    assert "a tie goes low" in text
    assert "before relu (its inputs cast, relu in float32): 96 bytes" in text


def test_tensorflow_colouring_is_selectable_by_policy_file_and_flag(tmp_path):
    config = tmp_path / "graphamp.toml"
    config.write_text('[graphamp]\nspread = "tensorflow"\n', encoding="utf-8")
    assert Policy.from_toml(config).spread == "tensorflow"
    assert Policy.create("float16").spread == "cost"
    assert Policy.create("float16", dialect="fx_cpu").spread == "autocast"
    _, plan = convert(model([helper.make_node("Relu", ["x"], ["y"], name="r")]))
    assert plan.policy["spread"] == "cost"
    with pytest.raises(Exception, match="spread 'paint' is not one of cost, tensorflow"):
        Policy.create("float16", spread="paint")
    bad = tmp_path / "bad.toml"
    bad.write_text("[graphamp]\nspread = 1\n", encoding="utf-8")
    with pytest.raises(Exception, match="'spread' must be a string"):
        Policy.from_toml(bad)


# -- the cut is a minimum: brute force on random graphs ----------------------------------------

_OPS = ["MatMul", "Add", "Sigmoid", "Relu", "Exp", "Transpose", "Mul"]


def _random_graph(seed: int):
    rng = random.Random(seed)
    b = GraphBuilder()
    values = [b.input("x"), b.input("x2")]
    for index in range(rng.randint(3, 9)):
        op = rng.choice(_OPS)
        inputs = [rng.choice(values)]
        if op in ("MatMul", "Add", "Mul"):
            other = rng.choice([*values, b.weight(f"w{index}")])
            inputs.append(other)
        values.append(b.op(f"n{index}", op, inputs))
    graph = b.output(values[-1], *rng.sample(values[2:], k=min(1, len(values) - 3)))
    for tensor in graph.tensors.values():  # sizes that differ, so the cut has choices to make
        tensor.shape = (rng.choice([1, 2, 8]), rng.choice([1, 4, 16]))
    return graph


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_the_cut_is_the_cheapest_assignment_and_ties_go_low(seed, keep):
    graph = _random_graph(seed)
    policy = Policy.create("float16", keep_io_types=keep)
    context = PassContext(graph, policy)
    PassManager([ClassifyPass]).run(context)
    classes = context.decisions
    decided = decide_by_cost(graph, classes, policy)
    free = {
        n
        for n, d in decided.items()
        if d.rule in (Rule.INFER, Rule.CLEAR) and graph.nodes[n].kind is NodeKind.OP
    }
    terms = cost_terms(graph, decided, policy)
    costs = terms.costs
    variables = sorted({v for c in costs for v in (c.head, *c.members)} - {LOW, F32})

    def price(low: set[int]) -> int:
        side = [LOW if v == LOW or v in low else F32 for v in range(len(terms.names))]
        return sum(c.cost for c in costs if c.paid(side))

    best, cheapest = None, []
    for size in range(len(variables) + 1):
        for low in itertools.combinations(variables, size):
            cost = price(set(low))
            if best is None or cost < best:
                best, cheapest = cost, [set(low)]
            elif cost == best:
                cheapest.append(set(low))
    preferences = terms.preferences()
    side = cut(len(terms.names), costs, preferences)
    chosen = {v for v in variables if side[v] == LOW}
    assert price(chosen) == best
    # of the cheapest cuts, those whose float32 ops would read and write the fewest bytes
    # themselves (a tie goes low), and of those the one with the fewest variables low
    # (a tie nothing breaks stays float32: inside every such set)
    own = dict(preferences)
    assert all(saved > 0 and terms.names[v] in free for v, saved in own.items())

    def wide_traffic(low: set[int]) -> int:
        return sum(saved for v, saved in own.items() if v not in low)

    least = min(wide_traffic(low) for low in cheapest)
    assert chosen == set.intersection(*[low for low in cheapest if wide_traffic(low) == least])
    # a variable in no cost is float32
    assert all(side[v] == F32 for v in range(F32 + 1, len(terms.names)) if v not in variables)
    chosen_names = {terms.names[v] for v in chosen}
    assert {n for n in free if decided[n].precision == "float16"} == chosen_names & free


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("name", ["mnist", "bert", "gpt"])
def test_cost_moves_no_more_bytes_than_colouring_on_the_zoo(zoo_model, name, keep):
    """The plan's Cast bytes plus the stored weights' bytes, what the cut minimises, are never
    above TensorFlow's colouring's (a feasible cut), and the output is as valid."""
    import graphamp.onnx as gonnx

    def moved(spread: str) -> tuple[int, int]:
        result = gonnx.convert(zoo_model(name), keep_io_types=keep, spread=spread)
        proto = result.to_proto()
        assert_valid(proto)
        stored = sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)
        return result.plan.summary()["cast_bytes"], stored

    cast_bytes, stored = moved("cost")
    colour_cast_bytes, colour_stored = moved("tensorflow")
    assert cast_bytes + stored <= colour_cast_bytes + colour_stored
    assert cast_bytes <= colour_cast_bytes
