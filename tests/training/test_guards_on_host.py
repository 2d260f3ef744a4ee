"""graphamp.fx.training.in_place.guards_read_once: a step on a GPU reads the finite check on
the host once, and its guards then update in place and choose on the host, as on a CPU. The
pass is for CUDA steps; here it is switched on for a CPU step, where the values must be the
same as the step without it, skipped steps included."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import graphamp
from graphamp.fx import train_step
from graphamp.fx.dialect import lowering
from graphamp.fx.training import eager, in_place


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    out = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(5)]
    out[2] = (out[2][0] * 6e4, out[2][1])  # float16 gradients overflow: this step is skipped
    return out


def trained(monkeypatch: pytest.MonkeyPatch, read_once: bool) -> tuple[object, list[float]]:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    step = train_step(
        net,
        nn.functional.mse_loss,
        optimizer,
        dtype="float16",
        loss_scaling=graphamp.DynamicLossScaling.torch_defaults(),
    )
    with monkeypatch.context() as patch:
        patch.setattr(eager, "on_cuda", lambda module: read_once)  # as on a GPU
        losses = [float(step(*batch)) for batch in batches()]
    return step, losses


def test_the_guards_read_the_check_once_on_the_host_with_the_same_values(monkeypatch):
    step, losses = trained(monkeypatch, read_once=True)
    plain, plain_losses = trained(monkeypatch, read_once=False)
    graph = step._graphs[step._signature].update.graph
    reads = [n for n in graph.nodes if n.target is lowering.read_on_host]
    assert len(reads) == 1  # one read, where the check makes its result
    guards = [n for n in graph.nodes if n.args and n.args[0] is reads[0]]
    assert any(n.target is lowering.select_on_host for n in guards) and len(guards) > 1
    plain_graph = plain._graphs[plain._signature].update.graph
    assert not [n for n in plain_graph.nodes if n.target is lowering.read_on_host]
    torch.testing.assert_close(
        torch.tensor(losses), torch.tensor(plain_losses), rtol=0, atol=0, equal_nan=True
    )
    assert int(step.skipped_steps) == int(plain.skipped_steps) == 1
    assert torch.equal(step.loss_scale, plain.loss_scale)
    for a, b in zip(step.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_compiled_step_gets_the_tensor_back(monkeypatch):
    step, _ = trained(monkeypatch, read_once=True)
    module = copy.deepcopy(step._graphs[step._signature].update)
    in_place.guards_read_on_device(module)
    assert not [n for n in module.graph.nodes if n.target is lowering.read_on_host]
    selects = [n for n in module.graph.nodes if n.target is lowering.select_on_host]
    assert selects and all(isinstance(n.args[0].meta.get("val"), torch.Tensor) for n in selects)
