"""graphamp.fx.training.foreach: runs of one in-place update called as one foreach op, with the
values of the nodes one by one, and only where the members are independent."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx import train_step
from graphamp.fx.dialect.lowering import select_on_host
from graphamp.fx.training import foreach, in_place


def grouped_targets(module: fx.GraphModule) -> list[str]:
    """The foreach op of each grouped node, in graph order."""
    plain = (foreach.each_in_place, foreach.each_result)
    return [
        str(node.args[0] if node.target in plain else node.args[1])
        for node in module.graph.nodes
        if node.target in (*plain, foreach.updates_unless)
    ]


def inputs(count: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,), (2, 2, 2), (1,)]
    return [torch.randn(shapes[i % 4], generator=generator) for i in range(count)]


def test_a_run_of_momentum_updates_is_one_foreach_add_with_the_same_values():
    def momentum(*tensors: torch.Tensor) -> list[torch.Tensor]:
        grads, buffers = tensors[:4], tensors[4:]
        doubled = [g * 2.0 for g in grads]  # new buffers: the ops below write into them
        scaled = [d * 3.0 for d in doubled]
        return [torch.add(s, b, alpha=0.9) for s, b in zip(scaled, buffers, strict=True)]

    arguments = inputs(8)
    module = make_fx(momentum)(*arguments)
    expected = module(*arguments)
    in_place.in_place(module)
    assert foreach.grouped(module) == 3  # the four new products, the four mul_, the four add
    assert grouped_targets(module) == [
        "aten._foreach_mul.Scalar",
        "aten._foreach_mul_.Scalar",
        "aten._foreach_add_.List",
    ]
    got = module(*arguments)
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want, have)
    foreach.ungrouped(module)
    assert grouped_targets(module) == []
    for want, have in zip(expected, module(*arguments), strict=True):
        assert torch.equal(want, have)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_low_precision_run_multiplied_by_a_number_stays_per_tensor(dtype):
    """torch's CPU _foreach_mul_.Scalar rounds the number to a bfloat16/float16 list's type
    first (0.9 becomes 0.8984375 in bfloat16), where mul_ multiplies by it in float32: such a
    run keeps its per-tensor ops, and the values their bits; its adds are still grouped."""

    def momentum(*tensors: torch.Tensor) -> list[torch.Tensor]:
        grads, buffers = tensors[:4], tensors[4:]
        kept = [b * 1.0 for b in buffers]  # new buffers: the ops below write into them
        scaled = [k * 0.9 for k in kept]
        return [torch.add(s, g) for s, g in zip(scaled, grads, strict=True)]

    arguments = [t.to(dtype) for t in inputs(8)]
    module = make_fx(momentum)(*arguments)
    expected = module(*arguments)
    in_place.in_place(module)
    assert foreach.grouped(module) == 1
    assert grouped_targets(module) == ["aten._foreach_add_.List"]
    for want, have in zip(expected, module(*arguments), strict=True):
        assert torch.equal(want.view(torch.int16), have.view(torch.int16))
    grouped = [b.clone() for b in arguments[4:]]
    torch._foreach_mul_(grouped, 0.9)  # what grouping would have computed: other bits
    assert not all(torch.equal(g, b * 0.9) for g, b in zip(grouped, arguments[4:], strict=True))


def test_a_tensor_every_member_reads_is_passed_once():
    """An unscale: every gradient times one inverse scale (foreach's Tensor overload, which
    a GPU runs on its fast path), not a list repeating it."""

    def unscale(inverse: torch.Tensor, *grads: torch.Tensor) -> list[torch.Tensor]:
        copies = [g * 1.0 for g in grads]  # new buffers, written below
        return [c * inverse for c in copies]

    arguments = [torch.tensor(0.25), *inputs(3)]
    module = make_fx(unscale)(*arguments)
    expected = module(*arguments)
    in_place.in_place(module)
    foreach.grouped(module)
    assert "aten._foreach_mul_.Tensor" in grouped_targets(module)
    for want, have in zip(expected, module(*arguments), strict=True):
        assert torch.equal(want, have)


def test_a_shared_tensor_that_is_not_0_dim_is_passed_as_a_list():
    """Two products by one gate (a gated MLP: ``p * s``, ``q * s``): the foreach op's
    Tensor overload takes only a 0-dim tensor ("scalar tensor expected to be 0 dim"), so
    the gate is repeated in a list."""

    def gated(gate: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> list[torch.Tensor]:
        return [p * gate, q * gate]

    generator = torch.Generator().manual_seed(1)
    arguments = [torch.randn(8, 16, generator=generator) for _ in range(3)]
    module = make_fx(gated)(*arguments)
    expected = module(*arguments)
    assert foreach.grouped(module) == 1
    assert grouped_targets(module) == ["aten._foreach_mul.List"]
    for want, have in zip(expected, module(*arguments), strict=True):
        assert torch.equal(want, have)


def test_a_step_through_a_gated_module_runs_as_autocast_computes_it():
    """End to end (found on Gemma-3's MLP): the eager step groups the forward's two
    products by one gate and its first call used to fail."""

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(16, 16)
            self.proj = nn.Linear(16, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = torch.sigmoid(self.gate(x))
            p, q = self.proj(x).chunk(2, -1)
            return p * s + q * s

    torch.manual_seed(0)
    model = Gated()
    reference = Gated()
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(8, 16), torch.randn(8, 16)
    step = train_step(model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1),
                      dtype="bfloat16")  # fmt: skip
    loss = step(x, target)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = nn.functional.mse_loss(reference(x), target)
    assert torch.isfinite(loss)
    assert abs(loss.item() - expected.item()) <= 1e-2 * abs(expected.item())


def dependent_graph(hazard: str) -> fx.GraphModule:
    """Two in-place adds in a row on buffers of the graph: independent, or the second
    reading what the first wrote (``"reads-written"``) or writing what the first read
    (``"writes-read"``)."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    mul, add_ = torch.ops.aten.mul.Tensor, torch.ops.aten.add_.Tensor
    a = graph.call_function(mul, (x, 2.0))
    b = graph.call_function(mul, (y, 3.0))
    c = graph.call_function(mul, (y, 5.0))
    first = graph.call_function(add_, (a, b if hazard == "writes-read" else y))
    second_reads = first if hazard == "reads-written" else x
    second = graph.call_function(add_, (b if hazard == "writes-read" else c, second_reads))
    graph.output((first, second))
    for node in graph.nodes:
        if node.op != "output":
            node.meta["val"] = torch.empty(3)
    return fx.GraphModule(nn.Module(), graph)


@pytest.mark.parametrize("hazard", ["none", "reads-written", "writes-read"])
def test_members_that_read_each_others_writes_stay_apart(hazard):
    module = dependent_graph(hazard)
    x, y = torch.randn(3), torch.randn(3)
    expected = module(x, y)
    made = foreach.grouped(module)
    adds = [t for t in grouped_targets(module) if "add" in t]
    assert adds == ([] if hazard != "none" else ["aten._foreach_add_.List"]), (hazard, made)
    for want, have in zip(expected, module(x, y), strict=True):
        assert torch.equal(want, have)


def guarded_sgd_graph(count: int) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """``count`` parameters updated by ``addcmul(p, g, lr, value=-1)`` and kept by a step
    guard, as a traced SGD step has them."""
    graph = fx.Graph()
    found_inf, lr = graph.placeholder("found_inf"), graph.placeholder("lr")
    params = [graph.placeholder(f"p{i}") for i in range(count)]
    grads = [graph.placeholder(f"g{i}") for i in range(count)]
    new = [
        graph.call_function(torch.ops.aten.addcmul.default, (p, g, lr), {"value": -1})
        for p, g in zip(params, grads, strict=True)
    ]
    pairs = [n for p, u in zip(params, new, strict=True) for n in (p, u)]
    select = graph.call_function(select_on_host, (found_inf, *pairs))
    graph.output([graph.call_function(operator.getitem, (select, i)) for i in range(count)])
    first = inputs(count, seed=1)
    values = [*first, *(v * 0.5 + 1.0 for v in inputs(count, seed=2))]  # grads shaped alike
    for node, value in zip([*params, *grads, *new], [*values, *values[:count]], strict=True):
        node.meta["val"] = value
    lr.meta["val"], found_inf.meta["val"] = torch.tensor(0.1), torch.tensor(False)
    return fx.GraphModule(nn.Module(), graph), values


def test_guarded_parameter_updates_are_one_foreach_call_that_a_skipped_step_leaves_alone():
    module, values = guarded_sgd_graph(3)
    lr = torch.tensor(0.1)
    expected = module(torch.tensor(False), lr, *(v.clone() for v in values))
    assert in_place.guarded_updates(module) == 3
    assert foreach.grouped(module) == 1
    assert grouped_targets(module) == ["aten._foreach_addcmul_.Scalar"]
    params = [v.clone() for v in values[:3]]
    kept = module(torch.tensor(True), lr, *params, *values[3:])
    assert all(k is p and torch.equal(p, v) for k, p, v in zip(kept, params, values, strict=False))
    taken = module(torch.tensor(False), lr, *params, *values[3:])
    for want, have, param in zip(expected, taken, params, strict=True):
        assert have is param and torch.equal(want, have)  # written in place, same values
    # torch.compile's form: nodes one by one, then functional again
    in_place.functional(foreach.ungrouped(module))
    params = [v.clone() for v in values[:3]]
    taken = module(torch.tensor(False), lr, *params, *values[3:])
    for want, have, param, value in zip(expected, taken, params, values, strict=False):
        assert torch.equal(want, have) and torch.equal(param, value)


def test_guarded_updates_off_the_host_compute_out_of_place():
    """Where found_inf lives on a device, the grouped update returns new tensors for the
    guard to choose from, as update_unless does; shown with a flag on the meta device."""
    targets = [torch.ones(2), torch.ones(3)]
    flag = torch.tensor(True, device="meta")
    add_, add = torch.ops.aten._foreach_add_.List, torch.ops.aten._foreach_add.List
    result = foreach.updates_unless(flag, add_, add, targets, targets, alpha=1.0)
    # the flag is never read on the host (a meta tensor has no value to read)
    assert all(r is not t and torch.equal(r, 2 * t) for r, t in zip(result, targets, strict=True))
    assert all(torch.equal(t, torch.ones_like(t)) for t in targets)


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_a_training_step_calls_its_optimizer_tail_as_foreach_ops(kind):
    """SGD with momentum and Adam in a traced step: the per-parameter updates become a
    few foreach calls, and the parameters after three steps equal, bit for bit, those of a
    step whose graph calls them one by one (test_training compares the formulas with
    torch.optim's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    twin = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    twin.load_state_dict(model.state_dict())

    def optimizer(parameters):  # type: ignore[no-untyped-def]
        if kind == "SGD":
            return torch.optim.SGD(parameters, lr=0.05, momentum=0.9, weight_decay=1e-2)
        return torch.optim.Adam(parameters, lr=1e-2, weight_decay=1e-2)

    step = train_step(model, nn.functional.mse_loss, optimizer(model.parameters()))
    plain = train_step(twin, nn.functional.mse_loss, optimizer(twin.parameters()))
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    step(x, y)
    plain(x, y)
    foreach.ungrouped(plain.graph)  # type: ignore[arg-type]
    assert grouped_targets(plain.graph) == []  # type: ignore[arg-type]
    targets = grouped_targets(step.graph)  # type: ignore[arg-type]
    alone = [n for n in step.graph.graph.nodes if n.target is in_place.update_unless]
    assert len(targets) >= 2 and len(alone) <= 1, (targets, alone)  # the step count's own
    # Adam's square roots of its second moments, new tensors: one foreach call, not one each
    roots = [
        n
        for n in step.graph.graph.nodes  # type: ignore[union-attr]
        if "sqrt" in str(getattr(n.target, "__name__", n.target))
        and getattr(n.meta.get("val"), "ndim", 0) > 0
    ]
    assert roots == [], roots
    if kind == "Adam":
        assert "aten._foreach_sqrt.default" in targets, targets
    for _ in range(2):
        step(x, y)
        plain(x, y)
    for name, value in step.params.items():
        assert torch.equal(value, plain.params[name]), name


def test_a_commutative_run_keeps_each_products_layout():
    """``grad * scale`` and ``grad * x`` with ``grad`` permuted (a channels-last gradient) and
    the others contiguous: called as one foreach mul with the list first, each product would
    be laid out after the contiguous operand and the sum after it would add in another order
    (ConvNeXt's layer scale: its gradient off by units in the last place). Such a run stays
    per tensor, and the values are the traced ones bit for bit."""

    def step(base: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        grad = base.permute(0, 2, 3, 1)
        products = grad * scale, grad * x  # one run: consecutive, independent
        return [product.sum([0, 1, 2]) for product in products]

    generator = torch.Generator().manual_seed(0)
    arguments = [
        torch.randn(2, 128, 2, 2, generator=generator),
        torch.randn(128, generator=generator),
        torch.randn(2, 2, 2, 128, generator=generator),
    ]
    module = make_fx(step)(*arguments)
    expected = module(*arguments)
    assert foreach.grouped(module) == 0
    for want, have in zip(expected, module(*arguments), strict=True):
        assert torch.equal(want, have)

    # the same products of contiguous operands are grouped, their layouts alike either way
    def contiguous(base: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        grad = base.view(2, 2, 2, 128)
        products = grad * scale, grad * x
        return [product.sum([0, 1, 2]) for product in products]

    module = make_fx(contiguous)(*arguments)
    expected = module(*arguments)
    assert foreach.grouped(module) == 1
    for want, have in zip(expected, module(*arguments), strict=True):
        assert torch.equal(want, have)
