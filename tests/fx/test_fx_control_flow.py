"""torch.cond, torch.while_loop and torch.map: their bodies converted like the rest of the graph.

Tiny modules (graphamp.models.torch_control_flow) captured with torch.export: the ops inside a
branch or a loop body are decided by the same lists as the main graph, the values crossing a
boundary keep one type (a cond's branches return one type per output; a loop-carried value has
one type at entry, in the body and at exit), and the converted module exports again
(torch.export checks those types). Errors are measured against the float32 module and against
torch.autocast on the same inputs.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import graphamp.fx as gfx
from graphamp.errors import BodyWarning, GraphampError
from graphamp.models.torch_control_flow import CondNet, Gate, MapNet, NestedNet, RnnNet
from graphamp.plans import report

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def inputs(seed: int = 0, shape: tuple[int, ...] = (4, 16)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert torch.isfinite(got).all()
    return float((got.float() - want).abs().max())


def convert(model: nn.Module, x: torch.Tensor, dtype: str = "bfloat16", **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no native bfloat16/float16 matrix units here
        return gfx.convert(model, (x,), device="cpu", dtype=dtype, **options)


def autocast_error(model: nn.Module, x: torch.Tensor, dtype: str) -> float:
    with torch.no_grad(), torch.autocast("cpu", dtype=DTYPES[dtype]):
        got = model(x)
    return error(got, model(x))


def body(gm: torch.fx.GraphModule, name: str) -> torch.fx.GraphModule:
    module = gm.get_submodule(name)
    assert isinstance(module, torch.fx.GraphModule)
    return module


def casts(module: torch.fx.GraphModule) -> list[str]:
    """The dtype of every cast in ``module``'s own graph."""
    return [
        str(n.kwargs["dtype"]).removeprefix("torch.")
        for n in module.graph.nodes
        if n.target is torch.ops.aten._to_copy.default
    ]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cond_branches_are_converted_as_autocast_runs_them(dtype):
    torch.manual_seed(0)
    model = CondNet().eval()
    positive, negative = inputs(1).abs(), -inputs(2).abs()  # one input per branch
    gm, plan = convert(model, positive, dtype)
    for branch in ("true_graph_0", "false_graph_0"):
        for op, rule in (("linear", "allow"), ("matmul", "allow"), ("softmax", "clear")):
            decision = plan.nodes[f"cond/{branch}/{op}"]
            assert (str(decision.precision), str(decision.rule)) == (dtype, rule)
    assert str(plan.nodes["cond/output:0"].precision) == dtype
    assert str(plan.nodes["cond"].rule) == "control_flow"
    with torch.no_grad():
        for x in (positive, negative):
            converted = error(gm(x), model(x))
            assert 0 < converted <= 1.25 * autocast_error(model, x, dtype)
    # the input and the weights are cast once, before the cond, and passed in: no cast inside
    assert casts(gm) == [dtype] * 5
    assert casts(body(gm, "true_graph_0")) == casts(body(gm, "false_graph_0")) == []


def test_a_converted_cond_exports_again_with_one_type_per_output():
    torch.manual_seed(0)
    model, x = CondNet().eval(), inputs()
    gm, _ = convert(model, x)
    program = torch.export.export(gm, (x,))  # checks both branches return one type
    assert program.module()(x).dtype == torch.bfloat16
    assert torch.equal(program.module()(-x), gm(-x))


def test_a_branch_kept_float32_by_name_makes_the_other_cast_its_result():
    torch.manual_seed(0)
    model, x = CondNet().eval(), inputs()
    gm, plan = convert(model, x, deny_names=["cond/true_graph_0/*"])
    assert str(plan.nodes["cond/true_graph_0/matmul"].rule) == "deny_name"
    assert str(plan.nodes["cond/false_graph_0/matmul"].precision) == "bfloat16"
    # the output has one type: float32, the type of the branch kept float32
    assert str(plan.nodes["cond/output:0"].precision) == "float32"
    assert casts(body(gm, "false_graph_0"))[-1] == "float32"
    assert casts(body(gm, "true_graph_0")) == []
    torch.export.export(gm, (x,))
    assert gm(x).dtype == gm(-x).dtype == torch.float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_while_loop_carries_its_state_low_with_one_cast_before_the_loop(dtype):
    torch.manual_seed(0)
    model, h = RnnNet().eval(), inputs()
    gm, plan = convert(model, h, dtype)
    carried = plan.nodes["while_loop/carried:1"]
    assert str(carried.precision) == dtype
    assert "one Cast before the loop" in carried.reason
    assert str(plan.nodes["while_loop/while_loop_body_graph_0/matmul"].precision) == dtype
    # the state and the weight are cast once, outside; nothing is cast per iteration
    assert casts(gm) == [dtype, dtype]
    assert casts(body(gm, "while_loop_body_graph_0")) == []
    torch.export.export(gm, (h,))
    with torch.no_grad():
        assert error(gm(h), model(h)) > 0
    # torch.autocast cannot run this loop at all: its body returns another type than it got
    refused = pytest.raises(Exception, match="same metadata")
    with refused, torch.autocast("cpu", dtype=DTYPES[dtype]):
        model(h)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_while_loop_autocast_can_run_converts_within_its_error(dtype):
    torch.manual_seed(0)
    model, h = RnnNet(bias=True).eval(), inputs()
    gm, plan = convert(model, h, dtype)
    # the bias add promotes the state to float32, as under autocast: float32 throughout; the
    # body casts it for the matmul and the matmul's result for the float32 add, as autocast
    assert str(plan.nodes["while_loop/carried:1"].precision) == "float32"
    assert str(plan.nodes["while_loop/while_loop_body_graph_0/matmul"].precision) == dtype
    assert casts(body(gm, "while_loop_body_graph_0")) == [dtype, "float32"]
    torch.export.export(gm, (h,))
    with torch.no_grad():
        assert 0 < error(gm(h), model(h)) <= 1.25 * autocast_error(model, h, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_map_casts_the_batch_once_and_converts_its_body(dtype):
    torch.manual_seed(0)
    model, xs = MapNet().eval(), inputs(shape=(3, 4, 16))
    gm, plan = convert(model, xs, dtype)
    assert str(plan.nodes["map_impl/body_graph_0/linear"].precision) == dtype
    assert str(plan.nodes["map_impl/slice:0"].precision) == dtype
    assert str(plan.nodes["map_impl/output:0"].precision) == dtype
    assert casts(gm) == [dtype] * 3 and casts(body(gm, "body_graph_0")) == []
    with torch.no_grad():
        got = gm(xs)
        assert got.shape == (3, 4, 16)
        assert 0 < error(got, model(xs)) <= 1.25 * autocast_error(model, xs, dtype)


def test_a_cond_nested_in_a_while_loop_is_converted_with_its_casts_outside_both():
    torch.manual_seed(0)
    model, h = NestedNet().eval(), inputs()
    gm, plan = convert(model, h)
    inner = "while_loop/while_loop_body_graph_0/cond"  # (a body's ops have no module path)
    assert str(plan.nodes[f"{inner}/true_graph_0/linear"].precision) == "bfloat16"
    assert str(plan.nodes[f"{inner}/false_graph_0/relu"].precision) == "bfloat16"
    assert str(plan.nodes[f"{inner}/output:0"].precision) == "bfloat16"
    assert str(plan.nodes["while_loop/carried:1"].precision) == "bfloat16"
    loop_body = body(gm, "while_loop_body_graph_0")
    # gate.a's weight and bias are cast in the outermost graph and passed through both calls
    assert casts(gm) == ["bfloat16"] * 4
    # the comparison that picks the branch reads the low sum as it is (gt is clear: a
    # comparison is exact in any type, and eager autocast runs it in its input's): no cast
    assert casts(loop_body) == []
    compare = plan.nodes["while_loop/while_loop_body_graph_0/gt"]
    assert (str(compare.rule), str(compare.precision)) == ("clear", "bfloat16")
    assert casts(body(loop_body, "true_graph_0")) == []
    torch.export.export(gm, (h,))
    with torch.no_grad():
        assert 0 < error(gm(h), model(h)) < 0.05


@pytest.mark.slow
def test_converting_a_converted_module_again_changes_nothing():
    torch.manual_seed(0)
    for model, x in ((CondNet(), inputs()), (RnnNet(), inputs()), (NestedNet(), inputs())):
        gm, _ = convert(model.eval(), x)
        again, plan = convert(gm, x)
        assert plan.casts == [] and plan.weights == []
        assert casts(again) == casts(gm)


def test_weights_stored_low_inside_bodies():
    torch.manual_seed(0)
    model, x = CondNet().eval(), inputs()
    gm, _ = convert(model, x, weights="low")
    assert gm.a.weight.dtype == gm.b.bias.dtype == torch.bfloat16
    assert casts(gm) == ["bfloat16"]  # the input only
    with torch.no_grad():
        assert 0 < error(gm(x), model(x)) <= 1.25 * autocast_error(model, x, "bfloat16")


def test_explain_and_diff_name_body_nodes_by_their_path():
    torch.manual_seed(0)
    model, x = CondNet().eval(), inputs()
    _, plan = convert(model, x)
    _, denied = convert(model, x, deny_names=["cond/false_graph_0/softmax"])
    text = report.explain(plan, "cond/true_graph_0/softmax")
    assert "<- cond/true_graph_0/matmul (matmul): bfloat16, rule allow" in text
    text = report.explain(denied, "cond/output:0")
    assert text.startswith("cond/output:0 (cond): float32")
    assert "<- cond/false_graph_0/softmax (softmax): float32, rule deny_name" in text
    changed = plan.diff(denied).to_dict()
    assert [c["node"] for c in changed["nodes_changed"]] == [
        "cond/false_graph_0/softmax",
        "cond/output:0",
    ]
    # the output is float32 now: the other branch casts its result
    added = {(c["tensor"], c["to"]) for c in changed["casts_added"]}
    assert ("cond/true_graph_0/softmax", "float32") in added


def test_a_higher_order_op_graphamp_does_not_enter_is_kept_whole_with_a_warning():
    from torch._higher_order_ops.scan import scan

    class ScanNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 16) / 4)

        def forward(self, xs: torch.Tensor) -> torch.Tensor:
            def f(c: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                c = torch.tanh(c @ self.w + x)
                return c, c.clone()

            return scan(f, torch.zeros(4, 16), xs)[1]

    model, xs = ScanNet().eval(), inputs(shape=(3, 4, 16))
    with pytest.warns(BodyWarning, match="'scan'"):
        gm, plan = gfx.convert(model, (xs,), device="cpu", dtype="float16")
    decision = plan.nodes["scan"]
    assert (str(decision.precision), str(decision.rule)) == ("float32", "control_flow")
    with torch.no_grad():
        assert error(gm(xs), model(xs)) == 0


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "dtype", "kind"),
    [
        (CondNet, "float16", "SGD"),
        (CondNet, "bfloat16", "SGD"),
        (RnnNet, "bfloat16", "SGD"),
        (RnnNet, "bfloat16", "Adam"),  # the eager step's Adam passes on symbolic shapes
        (MapNet, "bfloat16", "SGD"),
    ],
)
def test_train_step_through_bodies_matches_the_converted_forward_trained_eagerly(make, dtype, kind):
    # torch.func.grad cannot enter a cond, while_loop or map in torch 2.13: the step is traced
    # with torch.autograd.grad under Python functionalization (a while_loop's with symbolic
    # shapes); float16 has dynamic loss scaling in the graph
    settings = {"SGD": {"lr": 0.1, "momentum": 0.9}, "Adam": {"lr": 1e-2}}[kind]
    torch.manual_seed(0)
    model = make()
    x = inputs(shape=(3, 4, 16)) if make is MapNet else inputs()
    target = torch.randn_like(model(x))
    reference = make()
    reference.load_state_dict(model.state_dict())
    optimizer_type = getattr(torch.optim, kind)
    step = gfx.train_step(model, mse, optimizer_type(model.parameters(), **settings), dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = [float(step(x, target)) for _ in range(3)]
    gm, _ = convert(reference, x, dtype)
    optimizer = optimizer_type(gm.parameters(), **settings)
    expected = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = mse(gm(x).float(), target)
        loss.backward()
        optimizer.step()
        expected.append(float(loss))
    assert losses == pytest.approx(expected, rel=1e-6)
    assert losses[-1] < losses[0]
    trained, wanted = step.state_dict(), dict(gm.named_parameters())
    assert max(float((trained[k] - wanted[k]).abs().max()) for k in trained) < 1e-6
    low = [n for n, d in step.plan.nodes.items() if "/" in n and str(d.precision) == dtype]
    assert any(n.endswith("/matmul") or n.endswith("/linear") for n in low)


@pytest.mark.slow
def test_train_step_explains_a_body_node():
    torch.manual_seed(0)
    model, x = CondNet(), inputs()
    step = gfx.train_step(model, mse, torch.optim.SGD(model.parameters(), lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(x, torch.zeros(4, 16))
    assert step.explain("cond/false_graph_0/softmax").startswith(
        "cond/false_graph_0/softmax (softmax): bfloat16, rule clear"
    )


@torch.library.custom_op("graphamp_tests::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@doubled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_step_torch_cannot_differentiate_through_a_cond_is_one_error_naming_it():
    class NoBackward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(
                x.sum() > 0, lambda x: doubled(self.lin(x)), lambda x: self.lin(x), (x,)
            )

    model, x = NoBackward(), inputs()
    step = gfx.train_step(model, mse, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(GraphampError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(x, torch.zeros(4, 16))
    message = str(caught.value)
    assert "\n" not in message
    assert "torch.ops.higher_order.cond" in message and "no autograd formula" in message


@pytest.mark.compile
@pytest.mark.slow
def test_a_compiled_step_through_a_while_loop_runs_as_the_eager_one():
    torch.manual_seed(0)
    model, x = RnnNet(), inputs()
    target = torch.randn(4, 16)
    reference = RnnNet()
    reference.load_state_dict(model.state_dict())
    eager_step = gfx.train_step(reference, mse, torch.optim.SGD(reference.parameters(), lr=0.1))
    step = gfx.train_step(model, mse, torch.optim.SGD(model.parameters(), lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step.compile(x, target)  # the backward reads the iteration count: a captured scalar
        losses = [float(step(x, target)) for _ in range(2)]
        expected = [float(eager_step(x, target)) for _ in range(2)]
    assert losses == pytest.approx(expected, rel=1e-5)


class Growing(nn.Module):
    """A loop whose state grows past float16's range (x300 per iteration), after a cond whose
    first branch scales past it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.eye(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cond(x.sum() > 0, lambda x: (x @ self.w) * 1e5, lambda x: x @ self.w, (x,))

        def more(i: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return i < 3

        def step(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, (h @ self.w) * 300.0

        return torch.while_loop(more, step, (torch.zeros((), dtype=torch.int64), x / 1e5))[1]


@pytest.mark.slow
def test_calibration_reaches_body_nodes_in_every_iteration():
    model, x = Growing().eval(), inputs().abs()
    _, plan = convert(model, x, "float16")
    assert str(plan.nodes["cond/true_graph_0/mul"].precision) == "float16"
    _, plan = convert(model, x, "float16", calibrate=[(x,)])
    decision = plan.nodes["cond/true_graph_0/mul"]
    assert str(decision.rule) == "range" and "cond/true_graph_0/mul" in decision.reason
    # the state passes 65504 / 2 in the third iteration: the multiply that makes it and the
    # carried value (recorded over every iteration) stay float32
    assert str(plan.nodes["while_loop/while_loop_body_graph_0/mul"].rule) == "range"
    assert str(plan.nodes["while_loop/carried:1"].precision) == "float32"
    # the branch the batch did not take has no data: decided by its lists
    assert str(plan.nodes["cond/false_graph_0/matmul"].precision) == "float16"


@pytest.mark.slow
def test_train_step_through_a_cond_updates_batch_norm_statistics_as_eager_pytorch():
    # the forward's in-place buffer updates, functionalized, are copied back once per step
    class NormThenCond(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.BatchNorm1d(16)
            self.cond = CondNet()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.cond(self.norm(x))

    torch.manual_seed(0)
    model, x, target = NormThenCond(), inputs(shape=(8, 16)) + 0.5, torch.randn(8, 16)
    reference = NormThenCond()
    reference.load_state_dict(model.state_dict())
    step = gfx.train_step(model, mse, torch.optim.SGD(model.parameters(), lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        losses = [float(step(x, target)) for _ in range(3)]
    step.copy_to()
    gm, _ = convert(reference, x)
    optimizer = torch.optim.SGD(gm.parameters(), lr=0.1)
    expected = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = mse(gm(x).float(), target)
        loss.backward()
        optimizer.step()
        expected.append(float(loss))
    assert losses == pytest.approx(expected, rel=1e-6)
    assert int(model.norm.num_batches_tracked) == 3
    assert torch.allclose(model.norm.running_mean, gm.norm.running_mean, atol=1e-7)
    assert float(model.norm.running_mean.abs().max()) > 0.1


class CondThenMatmul(nn.Module):
    """A loop body whose cond's output only a matmul reads."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.gate = Gate()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        def more(i: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return i < 3

        def step(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, torch.tanh(self.gate(h) @ self.w)

        return torch.while_loop(more, step, (torch.zeros((), dtype=torch.int64), h))[1]


def test_a_cond_output_inside_a_loop_keeps_the_promoted_type_of_its_branches():
    # promote's rule 5 lowers values entering a loop body, not values made inside it: the
    # inner cond's output stays float32 (its false branch is kept float32 by name) although
    # only a bfloat16 matmul reads it
    torch.manual_seed(0)
    model, h = CondThenMatmul().eval(), inputs()
    inner = "while_loop/while_loop_body_graph_0/cond"
    gm, plan = convert(model, h, deny_names=[f"{inner}/false_graph_0/*"])
    output = plan.nodes[f"{inner}/output:0"]
    assert str(output.precision) == "float32"
    assert output.reason.startswith("cond output 0, reading")
    assert str(plan.nodes["while_loop/while_loop_body_graph_0/matmul"].precision) == "bfloat16"
    torch.export.export(gm, (h,))
