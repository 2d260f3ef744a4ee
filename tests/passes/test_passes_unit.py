"""Each pass alone, on OpGraphs built in code: classify, paint, casts, the reviewed-plan
passes and the pass manager's contract."""

from __future__ import annotations

import numpy as np
import pytest

from graphamp.core.graph import NodeKind
from graphamp.core.vocab import Precision, Rule
from graphamp.errors import GraphampError, InternalError
from graphamp.passes import Choice, Fact, Pass, PassContext, PassManager, PassResult
from graphamp.passes.casts import CastsPass
from graphamp.passes.classify import ClassifyPass
from graphamp.passes.options import Options
from graphamp.passes.paint import PaintPass
from graphamp.passes.pipeline import MODEL
from graphamp.passes.promote import PromotePass
from graphamp.policy.policy import Policy
from tests.opgraphs import GraphBuilder, chain


def run(graph, policy=None, **options):  # type: ignore[no-untyped-def]
    policy = policy or Policy.create("float16", spread="tensorflow")
    context = PassContext(graph, policy, Options(**options))
    return PassManager(MODEL, check=True).run(context)


def rules(context: PassContext) -> dict[str, str]:
    return {name: str(d.rule) for name, d in context.decisions.items()}


def test_classify_rules_in_order():
    b = GraphBuilder()
    x = b.input("x")
    b.op("cast", "Cast", [x], kind=NodeKind.CAST, cast_to="float16")
    b.op("opaque", "Custom", [x], kind=NodeKind.OPAQUE)
    b.op("loop", "Loop", [x], kind=NodeKind.CONTROL_FLOW)
    b.op("shape", "Shape", [x], dtype="int64", follow=[])
    b.op("named", "MatMul", [x, x])
    b.op("tensor", "MatMul", [x, b.weight("secret")])
    b.op("unknown_op", "Frobnicate", [x])
    b.op("exp", "Exp", [x])
    b.op("narrow", "MatMul", [x, x], allowed=frozenset({"float32"}))
    b.op("huge", "MatMul", [x, b.weight("big", 1e6)])
    b.op("mm", "MatMul", [x, x])
    b.op("half", "MatMul", [b.input("h", "float16"), b.input("h2", "float16")])
    b.op("double", "MatMul", [b.input("d", "float64"), b.input("d2", "float64")])
    b.output("mm")
    policy = Policy.create("float16", deny_names=["named"], deny_tensors=["secret"])
    context = PassContext(b.graph, policy)
    ClassifyPass().run(context)
    assert rules(context) == {
        "cast": "cast",
        "opaque": "opaque",
        "loop": "control_flow",
        "shape": "no_float",
        "named": "deny_name",
        "tensor": "deny_tensor",
        "unknown_op": "unlisted",
        "exp": "deny",
        "narrow": "schema",
        "huge": "weight_range",
        "mm": "allow",
        "half": "already_low",
        "double": "float64",
    }
    assert "test schema does not admit float16" in context.decisions["narrow"].reason
    assert "1e+06" in context.decisions["huge"].reason


def test_paint_deny_spreads_only_on_paths_ending_at_deny_or_infer():
    # TensorFlow's case: deny -> infer -> clear -> infer -> clear -> allow -> infer
    graph = chain("Exp", "Add", "Relu", "Add", "Relu", "MatMul", "Add", weights=False)
    context = run(graph)
    precisions = {n: str(d.precision) for n, d in context.decisions.items()}
    assert [precisions[n] for n in graph.nodes] == [
        "float32",
        "float32",
        "float32",
        "float32",
        "float16",
        "float16",
        "float32",
    ]
    assert context.decisions["add1"].rule is Rule.DENY_SPREAD
    assert context.decisions["relu4"].via == "matmul5"


def test_paint_infer_between_allow_ops_goes_low():
    context = run(chain("MatMul", "Add", "MatMul"))
    assert context.decisions["add1"].precision is Precision.FLOAT16
    assert context.decisions["add1"].via == "matmul2"


def test_casts_one_per_tensor_and_dtype_shared_by_readers():
    b = GraphBuilder()
    x = b.input("x", fixed=True)
    for i in range(3):
        b.op(f"mm{i}", "MatMul", [x, b.weight(f"w{i}")])
    b.output("mm0", "mm1", "mm2")
    context = run(b.graph)
    (cast,) = context.script.casts
    assert (cast.tensor, cast.dst, cast.consumers) == ("x", "float16", ["mm0", "mm1", "mm2"])
    assert "x" not in context.script.retype, "a fixed input is never retyped"
    assert {w.name for w in context.script.weights} == {"w0", "w1", "w2"}
    assert all(w.in_place and w.bytes_after == w.bytes_before // 2 for w in context.script.weights)


def test_casts_input_retyped_when_every_reader_is_low():
    context = run(chain("MatMul", "Relu"))
    assert context.script.retype["x"] == "float16"
    assert not context.script.casts


def test_casts_overflowing_weight_is_kept_and_recorded():
    b = GraphBuilder()
    values = np.full((4, 4), 0.5, np.float32)
    values[0, :3] = 1e6
    b.op("mm", "MatMul", [b.input("x"), b.weight("w", values)])
    context = run(b.output("mm"))
    assert context.decisions["mm"].rule is Rule.WEIGHT_RANGE
    (kept,) = context.kept_weights
    assert (kept.name, kept.out_of_range, kept.consumers) == ("w", 3, ["mm"])
    assert not context.script.weights


def test_classify_decides_each_reader_of_a_weight_by_the_weights_it_reads():
    # Nodes of one op type share their decision, and a weight found to fit is not measured
    # again; neither may hide an overflowing weight read beside a fitting one, nor one read
    # at a slot that does not follow the computation type until a later node reads it at one.
    b = GraphBuilder()
    huge = np.full((4, 4), 0.5, np.float32)
    huge[0, 0] = 1e6
    x, fine, big = b.input("x"), b.weight("fine"), b.weight("big", huge)
    b.op("mm0", "MatMul", [x, fine])
    b.op("mm1", "MatMul", ["mm0", fine])
    b.op("mm2", "MatMul", ["mm1", big], follow=[0])  # big read where its type does not matter
    b.op("mm3", "MatMul", ["mm2", fine])
    b.op("mm4", "MatMul", ["mm3", big])
    b.op("mm5", "Gemm", ["mm4", fine, big])
    context = run(b.output("mm5"))
    assert [str(context.decisions[f"mm{i}"].rule) for i in range(6)] == [
        "allow",
        "allow",
        "allow",
        "allow",
        "weight_range",
        "weight_range",
    ]
    assert "'big'" in context.decisions["mm5"].reason
    (kept,) = context.kept_weights
    assert (kept.name, kept.consumers) == ("big", ["mm4", "mm5"])


class MarkEverythingDeny(Pass):
    """Keeps every node float32 (a pass the built-in pipelines do not have)."""

    name = "test_mark"
    requires = frozenset({Fact.CLASSIFIED})

    def run(self, context: PassContext) -> PassResult:
        for name, decision in context.decisions.items():
            context.decisions[name] = type(decision)(
                op=decision.op, precision=Precision.FLOAT32, rule=Rule.DENY, reason="test"
            )
        return PassResult(modified=True)


def test_a_pass_runs_where_its_pipeline_lists_it():
    passes = [ClassifyPass, MarkEverythingDeny, PaintPass, CastsPass]
    manager = PassManager(passes, check=True)
    assert manager.names == ["classify", "test_mark", "paint", "casts"]
    context = PassContext(chain("MatMul", "Relu"), Policy.create("float16", spread="tensorflow"))
    manager.run(context)
    assert all(d.precision is Precision.FLOAT32 for d in context.decisions.values())
    assert context.script.casts == []  # nothing low: nothing to cast


def test_the_manager_refuses_a_pipeline_whose_order_breaks_a_requirement():
    """Checked when the manager is built, naming the pass: a pass before the facts it needs
    (on any branch of a choice), a pass listed twice."""
    with pytest.raises(InternalError, match="pass 'casts' needs decided, which no pass before"):
        PassManager([ClassifyPass, CastsPass])
    with pytest.raises(InternalError, match="pass 'test_mark' needs classified"):
        PassManager([MarkEverythingDeny, ClassifyPass])
    with pytest.raises(InternalError, match="pass 'classify' is in the pipeline twice"):
        PassManager([ClassifyPass, MarkEverythingDeny, ClassifyPass])
    half = Choice("half", "a test", lambda c: "a", {"a": (ClassifyPass, PaintPass), "b": ()})
    with pytest.raises(InternalError, match="pass 'casts' needs decided"):
        PassManager([half, CastsPass])  # branch "b" decides nothing
    both = Choice("both", "a test", lambda c: "a", {"a": (PaintPass,), "b": (PromotePass,)})
    assert PassManager([ClassifyPass, both, CastsPass]).names == [
        "classify",
        "paint",
        "promote",
        "casts",
    ]


def test_a_fact_a_pass_did_not_establish_is_an_error_naming_the_pass_that_needs_it():
    class DecidesNothingHere(PaintPass):
        name = "never"

        def applies(self, context: PassContext) -> bool:
            return False

    context = PassContext(chain("MatMul"), Policy.create("float16", spread="tensorflow"))
    with pytest.raises(InternalError, match="pass 'casts' needs decided, which no earlier"):
        PassManager([ClassifyPass, DecidesNothingHere, CastsPass], check=True).run(context)


def test_a_pass_that_gives_a_fact_it_did_not_establish_is_named():
    """``gives`` is a postcondition: classified means every node has a decision."""

    class ClassifiesOneLess(ClassifyPass):
        name = "classifies_one_less"

        def run(self, context: PassContext) -> PassResult:
            result = super().run(context)
            del context.decisions["relu1"]
            return result

    context = PassContext(chain("MatMul", "Relu"), Policy.create("float16"))
    with pytest.raises(InternalError, match="after pass 'classifies_one_less': node 'relu1'"):
        PassManager([ClassifiesOneLess], check=True).run(context)


def test_a_choice_runs_the_branch_it_picks_and_refuses_one_it_lacks():
    by_spread = Choice(
        "decide", "the spread", lambda c: c.policy.spread, {"tensorflow": (PaintPass,)}
    )
    manager = PassManager([ClassifyPass, by_spread, CastsPass], check=True)
    context = PassContext(chain("MatMul"), Policy.create("float16", spread="tensorflow"))
    assert manager.run(context).decisions["matmul0"].precision is Precision.FLOAT16
    context = PassContext(chain("MatMul"), Policy.create("float16", spread="cost"))
    with pytest.raises(InternalError, match="step 'decide': no branch for the spread 'cost'"):
        manager.run(context)


def test_a_pass_that_knows_one_dialect_is_skipped_on_another():
    ran: list[str] = []

    class OnnxOnly(Pass):
        name = "onnx_only"
        dialect = "onnx"

        def run(self, context: PassContext) -> PassResult:
            ran.append(context.policy.dialect)
            return PassResult(False)

    for dialect in ("onnx", "fx_cuda"):
        PassManager([OnnxOnly]).run(PassContext(chain("Relu"), Policy.create(dialect=dialect)))
    assert ran == ["onnx"]


def test_invariant_checks_name_the_pass_that_broke_a_rule():
    class LowerADenySeed(Pass):
        name = "breaks_deny"
        requires = frozenset({Fact.DECIDED})

        def run(self, context: PassContext) -> PassResult:
            decision = context.decisions["exp0"]
            context.decisions["exp0"] = type(decision)(
                op="Exp", precision=Precision.FLOAT16, rule=Rule.DENY, reason="broken"
            )
            return PassResult(True)

    passes = [ClassifyPass, PaintPass, LowerADenySeed, CastsPass]
    context = PassContext(chain("Exp"), Policy.create("float16", spread="tensorflow"))
    with pytest.raises(InternalError, match="after pass 'breaks_deny': deny seed 'exp0'"):
        PassManager(passes, check=True).run(context)


def test_invariant_checks_catch_a_graph_out_of_order():
    graph = chain("MatMul", "Relu")
    graph.nodes = dict(reversed(list(graph.nodes.items())))
    with pytest.raises(InternalError, match="reads 'matmul0' before anything produces it"):
        PassManager(MODEL, check=True).run(PassContext(graph, Policy.create("float16")))


def test_reviewed_decisions_are_applied_and_a_drifted_graph_refused():
    first = run(chain("MatMul", "Relu", "Exp"), Policy.create("float16", deny=["Relu"]))
    reviewed = first.plan()
    again = run(chain("MatMul", "Relu", "Exp"), reviewed=reviewed)
    assert again.decisions["relu1"].rule is Rule.DENY, "the plan's decision, not the default"
    changed = chain("MatMul", "Relu", "Exp")
    changed.nodes["exp2"].op = "Log"
    with pytest.raises(GraphampError, match="node 'exp2' is Log in the model but Exp"):
        run(changed, reviewed=reviewed)
    with pytest.raises(GraphampError, match="the plan's node 'exp2' is not in the model"):
        run(chain("MatMul", "Relu"), reviewed=reviewed)
