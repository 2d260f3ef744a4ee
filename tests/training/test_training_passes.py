"""The training passes (the ``step`` pipeline) on a step graph built in code, and on a real
training step: the nodes they add are in the plan and explained like any other decision."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import graphamp
import graphamp.fx
from graphamp.cli import main
from graphamp.core.graph import NodeKind, Role
from graphamp.core.vocab import Rule
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import STEP
from graphamp.policy.policy import Policy
from tests.opgraphs import GraphBuilder


def step_graph():  # type: ignore[no-untyped-def]
    """loss = f(w, x) * seed; grad = g(seed, ...); new_w = w - grad * lr."""
    b = GraphBuilder()
    w, x = b.input("w", fixed=True), b.input("x", fixed=True)
    loss = b.op("loss", "MatMul", [w, x])
    seed = b.op("seed", "ones_like", [loss])
    b.op("scaled", "mul", [loss, seed])
    grad = b.op("grad", "mul", [seed, x])
    new_w = b.op("new_w", "sub", [w, grad])
    graph = b.output(loss, new_w)
    roles = {loss: Role.LOSS, seed: Role.GRAD_SEED, grad: Role.GRADIENT, new_w: Role.UPDATE}
    for name, role in roles.items():
        graph.tensors[name].role = role
    graph.tensors[new_w].replaces = w
    return graph


def run_step(scaling):  # type: ignore[no-untyped-def]
    context = PassContext(step_graph(), Policy.create("float16"), Options(loss_scaling=scaling))
    return PassManager(STEP, check=True).run(context)


def test_dynamic_scaling_adds_every_node_in_order_with_its_reason():
    context = run_step(graphamp.DynamicLossScaling())
    graph, script = context.graph, context.script
    added = ["loss_scale", "unscale", "finite_check", "step_guard", "skip_count", "scale_update"]
    assert script.new_nodes == added
    kinds = {graph.nodes[name].kind for name in added}
    assert kinds == {NodeKind(name) for name in added}
    assert {str(context.decisions[n].rule) for n in added} == set(added)
    # backward reads the scaled seed; the optimizer reads the unscaled gradient
    assert graph.nodes["grad"].inputs[0] == "loss_scale.seed"
    assert graph.nodes["scaled"].inputs[1] == "loss_scale.seed"
    assert graph.nodes["new_w"].inputs[1] == "grad.unscaled"
    assert graph.nodes["finite_check"].inputs == ["grad.unscaled"]
    assert script.replace_outputs == {"new_w": "new_w.guarded"}
    assert list(script.new_inputs) == [
        "loss_scale.scale",
        "skipped_steps",
        "loss_scale.good",
        "loss_scale.bad",
    ]
    assert script.new_inputs["loss_scale.scale"] == 2.0**15
    assert graph.first_out_of_order() is None


def test_static_scaling_has_no_scale_update_and_bfloat16_only_the_guard():
    static = run_step(graphamp.StaticLossScaling(1024.0))
    assert "scale_update" not in static.script.new_nodes
    assert static.script.new_inputs["loss_scale.scale"] == 1024.0
    none = run_step(None)
    assert none.script.new_nodes == ["finite_check", "step_guard", "skip_count"]
    assert none.graph.nodes["finite_check"].inputs == ["grad"]


def test_a_training_step_plan_shows_and_explains_its_training_nodes(tmp_path, capsys):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphamp.SlowPrecisionWarning)
        step = graphamp.fx.train_step(model, nn.functional.mse_loss, optimizer, dtype="float16")
        step(torch.randn(4, 8), torch.randn(4, 4))
    plan = step.plan
    assert plan.nodes["loss_scale"].rule is Rule.LOSS_SCALE
    assert plan.nodes["step_guard"].rule is Rule.STEP_GUARD
    assert any(d.rule is Rule.ALLOW for d in plan.nodes.values()), "the forward's decisions too"
    assert "multiplied by the loss scale" in step.explain("loss_scale")
    path = tmp_path / "step.plan.json"
    plan.save(path)
    assert main(["explain", str(path), "unscale"]) == 0
    assert "1 / loss scale" in capsys.readouterr().out


def test_loss_scaling_reaches_the_gradients_float16_would_flush():
    """A loss so small that its float16 gradients flush to zero without scaling: with the
    (default dynamic) loss scale the backward seed is scaled and the optimizer reads the
    unscaled gradients, so the parameters move by the float32 step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x, y = torch.randn(4, 8), torch.randn(4, 1)

    def tiny_loss(out, target):  # type: ignore[no-untyped-def]
        return nn.functional.mse_loss(out, target) * 1e-9

    def moved(scaling):  # type: ignore[no-untyped-def]
        net = copy.deepcopy(model)
        opt = torch.optim.SGD(net.parameters(), lr=1e6)
        step = graphamp.fx.train_step(net, tiny_loss, opt, dtype="float16", loss_scaling=scaling)
        step(x, y)
        return {n: step.params[n] - p.detach() for n, p in model.named_parameters()}

    reference = copy.deepcopy(model)
    tiny_loss(reference(x), y).backward()
    expected = {n: -1e6 * p.grad for n, p in reference.named_parameters()}
    scaled = moved(graphamp.DynamicLossScaling())
    unscaled = moved(None)
    assert all(torch.equal(d, torch.zeros_like(d)) for d in unscaled.values())
    for name, delta in scaled.items():
        assert (delta - expected[name]).abs().max() <= 5e-2 * expected[name].abs().max(), name


def test_accumulation_under_the_default_dynamic_scaling():
    """float16's default (dynamic) scaling with accumulate=2: the accumulating micro-step
    scales its seed but has no finite check and no scale update (a scale update needs a
    finite check, and the accumulating micro-step has none)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = graphamp.fx.train_step(model, nn.functional.mse_loss, opt, dtype="float16", accumulate=2)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    initial = model[0].weight.detach().clone()
    step(x, y)
    step(x, y)
    added = {k for k, d in step.plan.nodes.items() if str(d.rule) == "scale_update"}
    assert added == {"scale_update"}
    assert "scale_update" not in step.captured["accumulate"].graph.nodes
    assert "loss_scale" in step.captured["accumulate"].graph.nodes
    assert int(step.skipped_steps) == 0
    assert not torch.equal(step.params["0.weight"], initial)
