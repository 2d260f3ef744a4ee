"""A training step as one graph: loss scaling semantics, GradScaler parity, accumulation,
optimizers, convergence."""

from __future__ import annotations

import copy
import operator
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import graphamp
from graphamp.errors import GraphampError
from graphamp.fx import DynamicLossScaling, StaticLossScaling, train_step
from graphamp.fx.dialect.lowering import select_on_host, unscale_and_check
from graphamp.fx.training import bindings, eager, in_place
from graphamp.fx.training.foreach import each_in_place, updates_unless
from tests.fx.test_fx import NormsAfterConv


def paddle_state(scale: float, good: int, bad: int) -> dict[str, torch.Tensor]:
    return {
        "scale": torch.tensor(scale),
        "good": torch.tensor(good, dtype=torch.int32),
        "bad": torch.tensor(bad, dtype=torch.int32),
    }


PADDLE = DynamicLossScaling(
    init_loss_scaling=2048,
    incr_every_n_steps=1000,
    decr_every_n_nan_or_inf=2,
    incr_ratio=2.0,
    decr_ratio=0.8,
)


def test_paddle_update_loss_scaling_without_overflow():
    state = PADDLE.update(paddle_state(2048, 999, 1), torch.tensor(False))
    assert float(state["scale"]) == 4096 and int(state["good"]) == 0 and int(state["bad"]) == 0


def test_paddle_update_loss_scaling_with_overflow():
    state = PADDLE.update(paddle_state(2048, 999, 1), torch.tensor(True))
    assert float(state["scale"]) == pytest.approx(1638.4)
    assert int(state["good"]) == 0 and int(state["bad"]) == 0


def test_scale_floor_and_finite_growth():
    floored = PADDLE.update(paddle_state(1.1, 0, 1), torch.tensor(True))
    assert float(floored["scale"]) == 1.0  # max(1.1 * 0.8, 1)
    huge = DynamicLossScaling(incr_every_n_steps=1).update(
        paddle_state(3e38, 0, 0), torch.tensor(False)
    )
    assert float(huge["scale"]) == pytest.approx(3e38)  # the grown scale was not finite: kept


def test_bad_scaling_options_are_refused():
    with pytest.raises(GraphampError, match="incr_ratio"):
        DynamicLossScaling(incr_ratio=1.0)
    with pytest.raises(GraphampError, match="decr_ratio"):
        DynamicLossScaling(decr_ratio=1.5)


def small_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batches(count: int, poison: set[int], seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for index in range(count):
        x = torch.randn(8, 16, generator=generator)
        if index in poison:
            x[0, 0] = float("inf")  # forces non-finite gradients at this step
        out.append((x, torch.randn(8, 4, generator=generator)))
    return out


@pytest.mark.parametrize("growth_interval", [2000, 3])
def test_same_scales_and_skips_as_autocast_with_grad_scaler(growth_interval):
    data = batches(24, poison={4, 5, 11, 17})
    reference = small_net()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    scaling = DynamicLossScaling(
        **{**DynamicLossScaling.torch_defaults().__dict__, "incr_every_n_steps": growth_interval}
    )
    step = train_step(
        model,
        nn.functional.mse_loss,
        torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
        dtype="float16",
        loss_scaling=scaling,
    )
    ours, theirs = [], []
    for x, y in data:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(reference(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        theirs.append(scaler.get_scale())
        step(x, y)
        ours.append(float(step.loss_scale))
    assert ours == theirs
    assert int(step.skipped_steps) == 4
    if growth_interval == 3:
        assert max(ours) > 2.0**16  # the scale grew back between overflows
    for name, param in reference.named_parameters():
        ours_param = step.params[name]
        assert torch.isfinite(ours_param).all()
        assert (ours_param - param.detach()).abs().max() <= 2e-2 * param.abs().max(), name


def test_skipped_step_leaves_parameters_and_momentum_unchanged():
    model = small_net()
    step = train_step(
        model,
        nn.functional.mse_loss,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        dtype="float16",
    )
    (x, y), (bad_x, _) = batches(2, poison={1})
    step(x, y)
    params = {k: v.clone() for k, v in step.params.items()}
    momentum = {k: v.clone() for k, v in step.opt_state.items()}
    step(bad_x, y)
    assert int(step.skipped_steps) == 1
    assert all(torch.equal(params[k], step.params[k]) for k in params)
    assert all(torch.equal(momentum[k], step.opt_state[k]) for k in momentum)
    assert float(step.loss_scale) == 2.0**15  # Paddle defaults: one bad step is not enough


@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
def test_optimizer_updates_match_torch_optim_in_float32_terms(kind):
    """With bfloat16 compute the updates follow torch.optim's formulas: compare with torch.optim
    run on the gradients our own graph produced (same precision)."""
    data = batches(5, poison=set())
    reference, model = small_net(), small_net()
    make = {
        "SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
        "Adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3),
        "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2),
    }[kind]
    optimizer = make(reference.parameters())
    step = train_step(model, nn.functional.mse_loss, make(model.parameters()), dtype="bfloat16")
    for x, y in data:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(reference(x).float(), y)
        loss.backward()
        optimizer.step()
        step(x, y)
    for name, param in reference.named_parameters():
        assert (step.params[name] - param.detach()).abs().max() <= 3e-2 * param.abs().max(), name


def test_accumulation_equals_the_large_batch():
    ((x, y),) = batches(1, poison=set())
    x, y = torch.cat([x, x.flip(0)]), torch.cat([y, y.flip(0)])
    big, small = small_net(), small_net()
    one = train_step(
        big,
        nn.functional.mse_loss,
        torch.optim.SGD(big.parameters(), lr=0.1),
        dtype="float16",
        loss_scaling=StaticLossScaling(1024.0),
    )
    two = train_step(
        small,
        nn.functional.mse_loss,
        torch.optim.SGD(small.parameters(), lr=0.1),
        dtype="float16",
        loss_scaling=StaticLossScaling(1024.0),
        accumulate=2,
    )
    initial = {k: p.detach().clone() for k, p in small.named_parameters()}
    one(x, y)
    two(x[:8], y[:8])
    assert all(torch.equal(two.params[k], initial[k]) for k in initial), (
        "the first micro-batch must not update"
    )
    two(x[8:], y[8:])
    for name in one.params:
        assert (one.params[name] - two.params[name]).abs().max() <= 1e-2 * one.params[
            name
        ].abs().max()

    # Scaling happens once per effective batch: only the update graph selects and rescales.
    def count(graph, op):  # type: ignore[no-untyped-def]
        calls = [bindings.overload(n) for n in graph.graph.nodes]
        return sum(1 for target in calls if getattr(target, "_opname", "") == op)

    def selected(graph):  # type: ignore[no-untyped-def]
        """Values the step guard selects (on the host in an eager CPU step)."""
        guards = [n for n in graph.graph.nodes if n.target is select_on_host]
        return sum(len(n.users) for n in guards) + count(graph, "where")

    assert selected(two.accumulate_graph) == 0
    assert count(two.accumulate_graph, "reciprocal") == 0
    assert count(two.graph, "reciprocal") == 1  # unscale once
    # one finite check over all gradients, unscaling them as it checks (GradScaler's kernel)
    checks = [n for n in two.graph.graph.nodes if n.target is unscale_and_check]
    assert len(checks) == 1 and len(checks[0].args) == 1 + len(two.params)
    inverse = checks[0].args[0]
    assert not [n for n in inverse.users if n is not checks[0]]  # no separate unscale left
    assert not any(n.target is unscale_and_check for n in two.accumulate_graph.graph.nodes)
    assert selected(two.graph) == len(two.params) + 1  # params, step (no momentum)


def test_state_goes_back_to_the_model_kept():
    """With keep_model the step trains copies: the model changes only through copy_to."""
    model = small_net()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = train_step(model, nn.functional.mse_loss, optimizer, keep_model=True)
    for x, y in batches(3, poison=set()):
        step(x, y)
    assert all(torch.equal(before[k], v) for k, v in model.named_parameters()), (
        "model changed early"
    )
    step.copy_to()
    assert all(torch.equal(step.params[k], v.detach()) for k, v in model.named_parameters())


def test_train_step_refuses_what_it_cannot_do():
    model = small_net()
    with pytest.raises(GraphampError, match="RMSprop"):
        train_step(model, nn.functional.mse_loss, torch.optim.RMSprop(model.parameters()))
    with pytest.raises(GraphampError, match="accumulate"):
        train_step(
            model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1), accumulate=0
        )
    for wrong in ("yes", 1, 0.0):  # 1 == True and 0.0 == False: a type, not a value, decides
        with pytest.raises(GraphampError, match="recompute_casts: True, False or None"):
            train_step(
                model,
                nn.functional.mse_loss,
                torch.optim.SGD(model.parameters(), lr=0.1),
                recompute_casts=wrong,
            )


@pytest.mark.slow
def test_batch_norm_statistics_update_as_in_pytorch():
    """Running statistics follow eager autocast, are updated on skipped steps too (as eager
    PyTorch does) and, with keep_model, reach the model only through copy_to."""
    from graphamp.models.mnist import MnistCNN

    torch.manual_seed(0)
    model = MnistCNN().train()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9)
    step = train_step(
        model,
        nn.functional.nll_loss,
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        dtype="bfloat16",
        keep_model=True,
    )
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(4, 1, 28, 28, generator=generator)
        y = torch.randint(0, 10, (4,), generator=generator)
        step(x, y)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.nll_loss(reference(x).float(), y)
        loss.backward()
        optimizer.step()
    for name, buffer in reference.named_buffers():
        assert torch.allclose(step.buffers[name].float(), buffer.float(), rtol=1e-3, atol=1e-3), (
            name
        )
    assert float(model.features[1].running_mean.abs().sum()) == 0.0
    step.copy_to()
    assert torch.equal(model.features[1].running_mean, step.buffers["features.1.running_mean"])


class TinyCNN(nn.Module):
    """An MNIST-style CNN (conv, pooling, fc) without batch norm: no buffers in train_step yet."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(16 * 2 * 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def synthetic_digits(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """8x8 images of four learnable classes: a bright quadrant plus noise."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (count,), generator=generator)
    images = torch.randn(count, 1, 8, 8, generator=generator) * 0.5
    for index, label in enumerate(labels.tolist()):
        row, col = divmod(label, 2)
        images[index, 0, row * 4 : (row + 1) * 4, col * 4 : (col + 1) * 4] += 1.0
    return images, labels


def accuracy(dtype: str | None) -> float:
    torch.manual_seed(0)
    model = TinyCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train_x, train_y = synthetic_digits(512, seed=1)
    test_x, test_y = synthetic_digits(400, seed=2)
    if dtype is None:
        for _epoch in range(3):
            for start in range(0, 512, 32):
                optimizer.zero_grad()
                nn.functional.cross_entropy(
                    model(train_x[start : start + 32]), train_y[start : start + 32]
                ).backward()
                optimizer.step()
    else:
        step = train_step(model, nn.functional.cross_entropy, optimizer, dtype=dtype)
        for _epoch in range(3):
            for start in range(0, 512, 32):
                step(train_x[start : start + 32], train_y[start : start + 32])
        step.copy_to()
    model.eval()
    with torch.no_grad():
        return float((model(test_x).argmax(1) == test_y).float().mean()) * 100


@pytest.mark.slow
def test_convergence_matches_float32_within_half_a_point():
    reference = accuracy(None)
    assert reference > 90
    assert abs(accuracy("bfloat16") - reference) <= 0.5
    assert abs(accuracy("float16") - reference) <= 0.5  # float16 with dynamic loss scaling


@pytest.mark.compile
@pytest.mark.slow
def test_compiled_step_matches_the_eager_step():
    data = batches(4, poison={2})
    eager_model, compiled_model = small_net(), small_net()
    eager = train_step(
        eager_model,
        nn.functional.mse_loss,
        torch.optim.SGD(eager_model.parameters(), lr=0.05, momentum=0.9),
        dtype="float16",
    )
    compiled = train_step(
        compiled_model,
        nn.functional.mse_loss,
        torch.optim.SGD(compiled_model.parameters(), lr=0.05, momentum=0.9),
        dtype="float16",
    ).compile(*data[0])  # inductor: the finite check must survive its folding
    held = {**compiled.params, **compiled.opt_state}
    storage = {name: value.data_ptr() for name, value in held.items()}
    for x, y in data:
        eager(x, y)
        compiled(x, y)
    assert int(compiled.skipped_steps) == int(eager.skipped_steps) == 1
    assert float(compiled.loss_scale) == float(eager.loss_scale)
    for name in eager.params:
        assert torch.allclose(compiled.params[name], eager.params[name], rtol=1e-5, atol=1e-6)
    # the compiled graph writes its new state into the state's own memory (write_back)
    held = {**compiled.params, **compiled.opt_state}
    assert {name: value.data_ptr() for name, value in held.items()} == storage


OPTIMIZER_CASES = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-momentum-dampening-maximize": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2, maximize=True
    ),
    "sgd-nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-weight-decay-amsgrad": lambda p: torch.optim.Adam(
        p, lr=1e-2, weight_decay=1e-2, amsgrad=True
    ),
    "adam-maximize": lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.8, 0.9), maximize=True),
    "adam-decoupled": lambda p: torch.optim.Adam(
        p, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True
    ),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw-amsgrad-maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, maximize=True),
}
PARAMETER_TYPES = (torch.float32, torch.bfloat16, torch.float16)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: the same type, and the same bits (+0 is not -0, a NaN is itself)."""
    bits = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(bits), b.view(bits))


def odd_net(dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """Two layers whose parameters' sizes are no multiple of a vector width (481, 37, 185,
    5): a kernel's scalar tail computes some of every tensor."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(13, 37), nn.ReLU(), nn.Linear(37, 5)).to(dtype)


@pytest.mark.parametrize("dtype", PARAMETER_TYPES, ids=str)
@pytest.mark.parametrize("case", sorted(OPTIMIZER_CASES))
def test_optimizer_formulas_equal_torch_optim(case, dtype):
    """The graph's update is torch.optim's arithmetic (its single-tensor path, a CPU's
    default) on parameters of each float type: same gradients in, the same parameters and
    state out bit for bit, over steps where amsgrad's maximum and momentum matter."""
    from graphamp.fx.training.optim import initial_state, optimizer_groups, update

    model = odd_net(dtype)
    optimizer = OPTIMIZER_CASES[case](model.parameters())
    groups = optimizer_groups(optimizer, model)
    kind = type(optimizer).__name__
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = initial_state(kind, groups, params)
    lrs = [torch.tensor(float(g["lr"]), dtype=torch.float64) for g in optimizer.param_groups]
    generator = torch.Generator().manual_seed(3)
    for step in range(4):
        # Large then small gradients, so amsgrad's running maximum differs from exp_avg_sq.
        size = 1.0 if step < 2 else 0.01
        grads = {
            n: (torch.randn(p.shape, generator=generator) * size).to(dtype)
            for n, p in params.items()
        }
        for name, param in model.named_parameters():
            param.grad = grads[name].clone()
        optimizer.step()
        params, state = update(kind, groups, lrs, params, grads, state)
    for name, param in model.named_parameters():
        assert same_bits(params[name], param.detach()), name
        own = optimizer.state[param]
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"):
            if own.get(key) is not None:
                ours = state[f"{'momentum' if key == 'momentum_buffer' else key}:{name}"]
                assert same_bits(ours, own[key]), (name, key)


class Parallel(nn.Module):
    """Two linear layers side by side: the gradients of ``(output * target).sum()`` are the
    targets times the inputs, whatever the parameters, so with small integers in both they
    are exact in any float type, in the graph's mixed-precision backward as in eager
    PyTorch's. Only the optimizer then decides the parameters."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(13, 37).to(dtype), nn.Linear(13, 5).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], dim=-1)


def correlation(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output * target).sum()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("case", ["sgd", "sgd-momentum", "sgd-nesterov", "adam", "adamw"])
def test_train_step_on_low_precision_parameters_steps_as_torch_optim(case, dtype):
    """A model whose parameters are bfloat16/float16 (or float32, computing in bfloat16)
    trains in train_step, its parameters and optimizer state after several steps equal to
    eager PyTorch's bit for bit (the traced update, made in place and grouped into foreach
    calls, Adam's last formula one ``addcdiv`` on float32, as an eager step runs it). float16
    runs with a static loss scale: the unscaled gradients are exact. (Where eager's update is
    NaN, the NaN's payload may differ.)"""
    generator = torch.Generator().manual_seed(5)
    # Positive, so no gradient is zero: float16's Adam would divide zero by its eps, 1e-8,
    # which float16 rounds to zero.
    data = [
        (
            torch.randint(1, 4, (8, 13), generator=generator).to(dtype),
            torch.randint(1, 3, (8, 42), generator=generator).float(),
        )
        for _ in range(4)
    ]
    reference, model = Parallel(dtype), Parallel(dtype)
    optimizer = OPTIMIZER_CASES[case](reference.parameters())
    name = "float16" if dtype == torch.float16 else "bfloat16"
    scaling = StaticLossScaling(8.0) if dtype == torch.float16 else None
    step = train_step(
        model,
        correlation,
        OPTIMIZER_CASES[case](model.parameters()),
        dtype=name,
        loss_scaling=scaling,
    )
    for x, y in data:
        optimizer.zero_grad()
        correlation(reference(x), y).backward()
        optimizer.step()
        step(x, y)
    assert int(step.skipped_steps) == 0
    assert all(p.isfinite().all() for p in reference.parameters())
    step.copy_to()
    theirs = step.optimizer.state
    for (key, ours), param in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert same_bits(ours.detach(), param.detach()), key
        for slot, value in optimizer.state[param].items():
            if isinstance(value, torch.Tensor) and slot != "step":
                assert same_bits(theirs[ours][slot], value), (key, slot)


@pytest.mark.parametrize("case", ["sgd-momentum", "adamw"])
def test_accumulated_micro_batches_of_bfloat16_parameters_step_as_torch_optim(case):
    """Accumulated gradients of bfloat16 parameters are carried in float32, and their
    average steps the parameters as eager PyTorch's accumulated ``.grad`` does (exact here:
    small integers and halves)."""
    dtype = torch.bfloat16
    generator = torch.Generator().manual_seed(6)
    data = [
        (
            torch.randint(1, 4, (8, 13), generator=generator).to(dtype),
            torch.randint(1, 3, (8, 42), generator=generator).float(),
        )
        for _ in range(4)
    ]
    reference, model = Parallel(dtype), Parallel(dtype)
    make = OPTIMIZER_CASES[case]
    optimizer = make(reference.parameters())
    step = train_step(model, correlation, make(model.parameters()), dtype="bfloat16", accumulate=2)
    for index, (x, y) in enumerate(data):
        (correlation(reference(x), y) / 2).backward()
        if index % 2:
            optimizer.step()
            optimizer.zero_grad()
        step(x, y)
        assert {g.dtype for g in step.grad_acc.values()} == {torch.float32}
    for key, param in reference.named_parameters():
        assert same_bits(step.params[key], param.detach()), key


def test_groups_frozen_parameters_and_a_scheduler():
    """Per-group learning rates, a frozen layer and an LR scheduler, as torch.optim has them."""
    model = small_net()
    model[0].bias.requires_grad_(False)
    optimizer = torch.optim.SGD(
        [
            {"params": [model[0].weight], "lr": 0.1},
            {"params": [model[2].weight, model[2].bias], "lr": 0.0, "weight_decay": 0.5},
        ],
        lr=0.1,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0 if epoch < 2 else 0)
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    data = batches(4, poison=set())
    first = {k: v.detach().clone() for k, v in model.named_parameters()}
    history = []
    for x, y in data:
        step(x, y)
        scheduler.step()
        history.append({k: v.clone() for k, v in step.params.items()})
    assert not torch.equal(history[0]["0.weight"], first["0.weight"]), "group 0 must train"
    assert torch.equal(history[-1]["2.weight"], first["2.weight"]), "lr 0 group must not move"
    assert torch.equal(history[-1]["0.bias"], first["0.bias"]), "frozen parameter moved"
    assert "momentum:0.bias" not in step.opt_state
    # The scheduler set every lr to 0 after two steps: the captured graph follows it.
    assert not torch.equal(history[1]["0.weight"], history[0]["0.weight"])
    assert torch.equal(history[3]["0.weight"], history[1]["0.weight"])
    optimizer.param_groups[0]["momentum"] = 0.5
    with pytest.raises(GraphampError, match="momentum changed after the step was captured"):
        step(*data[0])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optimizer_state_goes_back_and_resumes(dtype):
    """copy_to writes torch.optim's own state (in the parameters' type, as torch.optim keeps
    it); a new step on that optimizer continues the run exactly where the first stopped."""
    data = [(x.to(dtype), y) for x, y in batches(5, poison=set())]
    straight_model = small_net().to(dtype)
    straight = train_step(
        straight_model,
        nn.functional.mse_loss,
        torch.optim.Adam(straight_model.parameters(), lr=1e-2, amsgrad=True),
        dtype="bfloat16",
    )
    for x, y in data:
        straight(x, y)

    model = small_net().to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    first = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    for x, y in data[:3]:
        first(x, y)
    first.copy_to()
    saved = optimizer.state_dict()["state"]
    assert len(saved) == 4 and float(saved[0]["step"]) == 3
    assert set(saved[0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    assert saved[0]["exp_avg"].dtype == dtype
    second = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    for x, y in data[3:]:
        second(x, y)
    for name, value in straight.params.items():
        assert same_bits(second.params[name], value), name


def test_optimizer_holding_foreign_tensors_is_refused():
    model = small_net()
    stray = nn.Parameter(torch.randn(3, 5))
    optimizer = torch.optim.SGD([*model.parameters(), stray], lr=0.1)
    with pytest.raises(GraphampError, match=r"group 0: holds a tensor of shape \(3, 5\)"):
        train_step(model, nn.functional.mse_loss, optimizer)


def test_the_host_guard_and_the_traced_guard_keep_and_update_the_same_values():
    """An eager CPU step chooses kept or updated values on the host and updates them in
    place; the graph torch.compile sees is functional and selects them with torch.where: the
    same bits, skipped steps and all."""
    data = batches(8, poison={2, 5})
    steps = []
    for traced in (False, True):
        model = small_net()
        step = train_step(
            model,
            nn.functional.mse_loss,
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            dtype="float16",
            loss_scaling=DynamicLossScaling.torch_defaults(),
        )
        step(*data[0])
        targets = {n.target for n in step.graph.graph.nodes if n.op == "call_function"}
        eager_only = {in_place.update_unless, updates_unless, unscale_and_check}
        if traced:  # what compile() hands torch.compile: functional, torch.where guards
            eager.for_compile(step.graph)
            targets = {n.target for n in step.graph.graph.nodes if n.op == "call_function"}
            assert not targets & {select_on_host, each_in_place, *eager_only}
            calls = targets - {operator.getitem}  # no binding either: overloads
            assert all(isinstance(t, torch._ops.OpOverload) for t in calls), calls
        else:  # the eager graph updates the kept tensors in place, past the guard's decision,
            # all parameters in one foreach call, and unscales the gradients inside the fused
            # finite check
            assert eager_only <= targets
        for x, y in data[1:]:
            step(x, y)
        steps.append(step)
    host, where = steps
    assert int(host.skipped_steps) == int(where.skipped_steps) == 2
    assert torch.equal(host.loss_scale, where.loss_scale)
    for name in host.params:
        assert torch.equal(host.params[name], where.params[name]), name
    for name in host.opt_state:
        assert torch.equal(host.opt_state[name], where.opt_state[name]), name


def test_a_slow_low_precision_type_is_one_warning_at_the_users_line(monkeypatch):
    """The README's training example on a CPU that emulates float16: one SlowPrecisionWarning
    (not one per internal conversion), pointing at the user's call, not into graphamp."""
    import warnings

    import graphamp.fx as gfx
    from graphamp.errors import SlowPrecisionWarning

    monkeypatch.setattr(gfx.conversion, "cpu_has_native", lambda dtype: False)
    model = small_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = train_step(model, nn.functional.mse_loss, optimizer, dtype="float16")
        for x, y in batches(3, poison=set()):
            step(x, y)
    slow = [w for w in caught if issubclass(w.category, SlowPrecisionWarning)]
    assert len(slow) == 1, [str(w.message) for w in slow]
    assert slow[0].filename == __file__, slow[0].filename


@torch.library.custom_op("graphamp_tests::gated_mm", mutates_args=())
def gated_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A custom op with its own autograd formula, as transformers' MoE experts are
    (``transformers::grouped_mm_fallback``)."""
    return x @ w


@gated_mm.register_fake
def _gated_mm_fake(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


def _gated_mm_setup(ctx, inputs, output):  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*inputs)


def _gated_mm_backward(ctx, grad):  # type: ignore[no-untyped-def]
    x, w = ctx.saved_tensors
    return grad @ w.T, x.T @ grad


gated_mm.register_autograd(_gated_mm_backward, setup_context=_gated_mm_setup)


def test_a_custom_op_with_its_own_backward_trains_as_eagerly():
    """torch.func's grad cannot enter a torch.library op's autograd formula ('an
    autograd.Function with functorch transforms ... must override setup_context'): such a
    step is differentiated by torch.autograd.grad, and its weights move as eager SGD moves
    them."""

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 4))
            self.out = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(gated_mm(x, self.w))

    torch.manual_seed(0)
    model = Experts()
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model.state_dict())
    x, target = torch.randn(4, 8), torch.randn(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    loss = step(x, target)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = nn.functional.mse_loss(reference(x), target)  # (float32: eager autocast
    expected.backward()  # hands the op's backward a bfloat16 gradient its formula refuses)
    optimizer.step()
    assert abs(loss.item() - expected.item()) <= 1e-2 * expected.item()
    for (name, mine), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=2e-3), name
        assert not torch.equal(mine, initial[name]), name


def test_a_target_or_input_that_is_a_container_of_tensors_is_one_line():
    """The step takes tensors (other values are constants it specialises on): a dict target
    failed inside the capture ('forward() takes 11 positional arguments but 12 were given')
    and the message printed its tensors' values."""
    model = nn.Linear(8, 4)
    step = train_step(model, lambda out, t: (out - t["y"]).pow(2).mean(), torch.optim.SGD(
        model.parameters(), lr=0.1))  # fmt: skip
    x = torch.randn(4, 8)
    for target, kind in (({"y": torch.randn(4, 4)}, "dict"), ((torch.randn(4, 4),), "tuple")):
        with pytest.raises(GraphampError) as caught:
            step(x, target)
        message = str(caught.value)
        assert message.startswith(f"step(*batch): the target is a {kind} holding tensors")
        assert "\n" not in message and "tensor(" not in message
    with pytest.raises(GraphampError, match="model input 0 is a list holding tensors"):
        step([x], torch.randn(4, 4))


def test_norms_reading_low_values_train_as_under_autocast():
    """A norm reading a convolution's low output runs low with its float32 weights (PyTorch's
    mixed-type norms) in the step's forward, as eager autocast runs it: the same losses, and
    the weights move as eager autocast's do."""
    torch.manual_seed(0)
    reference = NormsAfterConv()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    step = train_step(
        model,
        nn.functional.mse_loss,
        torch.optim.SGD(model.parameters(), lr=0.05),
        dtype="bfloat16",
    )
    for _ in range(3):
        x, target = torch.randn(2, 8, 6, 6), torch.randn(2, 4)
        optimizer.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # rms_norm's mixed types
            with torch.autocast("cpu", dtype=torch.bfloat16):
                expected = nn.functional.mse_loss(reference(x).float(), target)
            expected.backward()
            optimizer.step()
            loss = step(x, target)
        assert abs(float(loss) - float(expected)) <= 1e-2 * float(expected)
    norms = [d for d in step.plan.nodes.values() if "norm" in d.op]
    assert len(norms) == 3 and {d.precision for d in norms} == {"bfloat16"}
    for name, param in reference.named_parameters():
        assert (step.params[name] - param.detach()).abs().max() <= 2e-2 * param.abs().max(), name


def test_gradient_hooks_are_refused_not_skipped():
    """A pruning mask on a weight's gradient (Tensor.register_hook) or a module's full backward
    hook: the step's own backward never called them and trained as if they were not there."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0].weight.register_hook(lambda grad: grad * 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GraphampError, match=r"parameter '0\.weight' has a gradient hook"):
        train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    model[2].register_full_backward_hook(lambda module, grad_in, grad_out: None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GraphampError, match="module '2' has a backward hook"):
        train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")


class GradientReversal(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return -grad


def test_a_custom_autograd_function_is_named_in_a_backward_warning():
    """A gradient-reversal layer: the step differentiates its forward (the identity), so the
    reversal kept its sign, without a word."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(GradientReversal.apply(self.a(x)))

    model = Net()
    step = train_step(
        model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1), dtype="bfloat16"
    )
    with pytest.warns(graphamp.BackwardWarning, match=r"Function .*GradientReversal; the step"):
        step(torch.randn(8, 4), torch.randn(8, 1))


def test_a_param_group_added_after_capture_is_one_line_saying_how_to_go_on():
    """add_param_group after the first call was a bare zip() ValueError."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model[0].parameters(), lr=1e-3)
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    step(x, y)
    optimizer.add_param_group({"params": model[2].parameters()})
    with pytest.raises(GraphampError, match=r"2 parameter groups, 1 when .* step\.copy_to\(\)"):
        step(x, y)


class WithUnreachedParameters(nn.Module):
    """A layer computed but unused (a pooler no loss reads), a gate read through ``detach``,
    and the layers the loss trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.pooler, self.last = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.gate = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(x))
        self.pooler(hidden)
        return self.last(hidden * (self.gate.detach() > 0))


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
def test_parameters_no_gradient_reaches_are_left_as_torch_optim_leaves_them(kind, accumulate):
    """torch.optim skips a parameter whose .grad is None: no weight decay, no momentum, no
    state. The step gave it a zero gradient, which decay and momentum then moved."""
    make = {
        "SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1),
        "Adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
        "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    }[kind]
    model, reference = WithUnreachedParameters(), WithUnreachedParameters()
    optimizer, reference_optimizer = make(model.parameters()), make(reference.parameters())
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    step = train_step(
        model, nn.functional.mse_loss, optimizer, dtype="bfloat16", accumulate=accumulate
    )
    generator = torch.Generator().manual_seed(1)
    for micro in range(1, 3 * accumulate + 1):
        x, y = torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)
        step(x, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(reference(x).float(), y) / accumulate
        loss.backward()
        if micro % accumulate == 0:
            reference_optimizer.step()
            reference_optimizer.zero_grad()
    step.copy_to()
    for name in ("pooler.weight", "pooler.bias", "gate"):
        assert torch.equal(model.get_parameter(name), start[name]), name
        assert model.get_parameter(name) not in optimizer.state, name
    trained = {name for name, p in model.named_parameters() if p in optimizer.state}
    assert trained == {"first.weight", "first.bias", "last.weight", "last.bias"}
    for name in trained:
        ours, theirs = model.get_parameter(name), reference.get_parameter(name)
        assert not torch.equal(ours, start[name]), name
        assert (ours - theirs).abs().max() <= 1e-3 * theirs.abs().max(), name


def test_a_loss_no_parameter_reaches_is_one_line():
    model = WithUnreachedParameters()
    optimizer = torch.optim.SGD([model.pooler.weight, model.gate], lr=0.1)
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    with pytest.raises(GraphampError, match="no gradient path to any parameter the optimizer"):
        step(torch.randn(4, 8), torch.randn(4, 4))


class ReachedBySize(nn.Module):
    """A layer applied only to sequences longer than 4: which parameters the loss reaches
    depends on the batch's shape."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.long_only = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        return hidden + self.long_only(hidden) if x.shape[1] > 4 else hidden


@pytest.mark.parametrize(
    ("first", "then", "message"),
    [
        (4, 8, r"reaches 'long_only\.weight', 'long_only\.bias', which the first batch's loss"),
        (8, 4, r"does not reach 'long_only\.weight', 'long_only\.bias', which the first"),
    ],
)
def test_a_batch_reaching_other_parameters_than_the_first_is_refused(first, then, message):
    """The step trains the parameters the first batch signature's loss reaches; a later
    signature reaching others would leave one untrained (or step one with a zero gradient)
    where torch.optim steps those each batch reaches: refused in one line, the step unchanged."""
    model = ReachedBySize()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    step(torch.randn(2, first, 8), torch.randn(2, first, 8))
    with pytest.raises(GraphampError, match=message):
        step(torch.randn(2, then, 8), torch.randn(2, then, 8))
    step(torch.randn(2, first, 8), torch.randn(2, first, 8))  # the first signature still runs
    step(torch.randn(3, first, 8), torch.randn(3, first, 8))  # another reaching the same


class WithNoGradTeacher(nn.Module):
    """A teacher computed under ``torch.no_grad()`` (its parameters left in the optimizer)
    and a student the loss trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.student, self.teacher = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x)
        return self.student(x) - target


@pytest.mark.filterwarnings("ignore::graphamp.BodyWarning", "ignore::graphamp.PolicyWarning")
@pytest.mark.parametrize("kind", ["SGD", "AdamW"])
def test_a_forward_with_a_no_grad_block_trains_as_torch_optim(kind):
    """A ``no_grad`` block is a higher-order op in the captured forward; it needs no symbolic
    shapes, whose trace Adam's eager passes could not read (``unhashable type: non-nested
    SymInt``). The teacher gets no gradient, so it is left as torch.optim leaves it."""
    make = {
        "SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1),
        "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    }[kind]
    model, reference = WithNoGradTeacher(), WithNoGradTeacher()
    optimizer, reference_optimizer = make(model.parameters()), make(reference.parameters())
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    step = train_step(model, lambda out, y: (out.float() ** 2).mean(), optimizer, dtype="bfloat16")
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        step(x, torch.zeros(4, 8))
        reference_optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (reference(x).float() ** 2).mean().backward()
        reference_optimizer.step()
    step.copy_to()
    for name in ("teacher.weight", "teacher.bias"):
        assert torch.equal(model.get_parameter(name), start[name]), name
        assert model.get_parameter(name) not in optimizer.state, name
    for name in ("student.weight", "student.bias"):
        ours, theirs = model.get_parameter(name), reference.get_parameter(name)
        moved = (theirs - start[name]).abs().max()
        assert (ours - theirs).abs().max() <= 0.1 * moved, name


def test_a_parameter_the_loss_fn_reads_itself_is_one_line_not_left_untrained():
    """A learnable temperature kept on the model and read by loss_fn, not forward: eager
    autograd trains it; the step differentiates through forward only, so it is refused."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(8, 4)
            self.log_temperature = nn.Parameter(torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    model = Net()

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output / model.log_temperature.exp(), target)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = train_step(model, loss_fn, optimizer, dtype="bfloat16")
    with pytest.raises(GraphampError, match="loss_fn reads the model's parameter 'log_temp"):
        step(torch.randn(4, 8), torch.randn(4, 4))
    # read without gradient (a detached value) it is only an input: nothing to train
    model.log_temperature.requires_grad_(False)
    optimizer = torch.optim.AdamW([model.body.weight, model.body.bias], lr=1e-2)
    train_step(model, loss_fn, optimizer, dtype="bfloat16")(torch.randn(4, 8), torch.randn(4, 4))


def test_a_forward_with_value_dependent_shapes_says_what_to_write_instead():
    class Routed(nn.Module):  # tokens routed by a value test: the selection's size is the data's
        def __init__(self) -> None:
            super().__init__()
            self.expert = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            picked = torch.where(x[:, 0] > 0)[0]
            return x.index_add(0, picked, self.expert(x[picked]))

    model = Routed()
    step = train_step(
        model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1), dtype="bfloat16"
    )
    with pytest.raises(GraphampError, match=r"depends on the values.*fixed shapes"):
        step(torch.randn(6, 8), torch.randn(6, 8))
