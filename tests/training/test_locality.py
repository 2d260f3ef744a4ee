"""graphamp.fx.training.locality: an eager CPU step's optimizer tail runs parameter by
parameter (small ones chunked into foreach calls), with the values of the traced order, and
a write never crosses a reader of the memory it writes."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import fx, nn
from torch.utils._python_dispatch import TorchDispatchMode

from graphamp.fx import train_step
from graphamp.fx.dialect.lowering import any_non_finite
from graphamp.fx.training import locality
from graphamp.fx.training.in_place import update_unless
from tests.training.twins import assert_same_state_and_compile_form

WIDE = 512  # a 512 x 512 float32 weight is 1 MiB: its update is a chunk of its own


class OpLog(TorchDispatchMode):
    """Each aten op called, with the storages of the tensors it reads or writes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, set[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        storages: set[int] = set()
        for value in [*args, *(kwargs or {}).values()]:
            for tensor in value if isinstance(value, list | tuple) else [value]:
                if isinstance(tensor, torch.Tensor):
                    storages.add(tensor.untyped_storage().data_ptr())
        self.calls.append((str(func), storages))
        return func(*args, **(kwargs or {}))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, WIDE), nn.ReLU(), nn.Linear(WIDE, 4)
    )


def optimizer(kind: str, module: nn.Module) -> torch.optim.Optimizer:
    if kind == "SGD":
        return torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-2)
    return torch.optim.AdamW(module.parameters(), lr=1e-3, weight_decay=1e-2)


@pytest.mark.parametrize("kind", ["SGD", "AdamW"])
def test_each_large_parameter_updates_start_to_finish_before_the_next(kind, monkeypatch):
    """Traced op by op over all parameters, the tail is reordered: every op that touches a
    1 MiB weight or its optimizer state runs before any op of the next such weight, the
    small tensors (biases, the 512 x 4 head) still share foreach calls, and the parameters
    after three steps equal, bit for bit, those of a step whose tail keeps the traced order."""
    x, y = torch.randn(4, WIDE), torch.randn(4, 4)
    ours = model()
    step = train_step(ours, nn.functional.mse_loss, optimizer(kind, ours), dtype="bfloat16")
    step(x, y)
    log = OpLog()
    with log:
        step(x, y)
    large = [name for name, p in ours.named_parameters() if p.numel() == WIDE * WIDE]
    assert len(large) == 2
    memory = {
        name: {step.params[name].untyped_storage().data_ptr()}
        | {
            v.untyped_storage().data_ptr()
            for k, v in step.opt_state.items()
            if k.endswith(f":{name}")
        }
        for name in large
    }
    checked = [i for i, (op, _) in enumerate(log.calls) if "non_finite_check" in op]
    assert checked, log.calls
    owners = [
        [name for name in large if storages & memory[name]]
        for _, storages in log.calls[checked[-1] + 1 :]
    ]
    sequence = [names[0] for names in owners if len(names) == 1]
    assert all(len(names) <= 1 for names in owners), owners  # no call spans both weights
    assert len(sequence) >= 2 * (2 if kind == "SGD" else 4), sequence
    changes = sum(a != b for a, b in itertools.pairwise(sequence))
    assert changes == 1, sequence  # the first weight's update, then the second's
    assert any(op.startswith("aten._foreach_") for op, _ in log.calls[checked[-1] + 1 :])

    monkeypatch.setattr(locality, "by_parameter", lambda module, *args: 0)
    twin = model()
    traced_order = train_step(twin, nn.functional.mse_loss, optimizer(kind, twin), dtype="bfloat16")
    for _ in range(3):
        traced_order(x, y)
    step(x, y)
    # torch.compile's form has the traced order back: the same ops in the same order as the
    # form of the step that never reordered
    assert_same_state_and_compile_form(step, traced_order)


def tail_graph(device: str = "cpu") -> fx.GraphModule:
    """After a finite check: ``y1`` (Y's update, first), ``w`` (X written in place), ``y2``
    (Y's again) and ``total``, a 0-d sum that reads X itself after the write."""
    graph = fx.Graph()
    g1, g2, x, y = (graph.placeholder(name) for name in ("g1", "g2", "x", "y"))
    aten = torch.ops.aten
    check = graph.call_function(any_non_finite, (g1, g2))
    y1 = graph.call_function(aten.mul.Tensor, (y, g2))
    w = graph.call_function(update_unless, (check, aten.add_.Tensor, aten.add.Tensor, x, g1))
    y2 = graph.call_function(aten.add.Tensor, (y1, y))
    total = graph.call_function(aten.sum.default, (x,))
    graph.output((y2, w, total))
    for node in (g1, g2, x, y, y1, w, y2):
        node.meta["val"] = torch.empty(3, device=device)
    check.meta["val"] = torch.tensor(False, device=device)
    total.meta["val"] = torch.tensor(0.0, device=device)
    return fx.GraphModule(nn.Module(), graph)


def tail_order(module: fx.GraphModule) -> list[str]:
    return [n.name for n in module.graph.nodes if n.op == "call_function"][1:]


def test_a_write_keeps_its_place_against_a_later_reader_of_its_memory():
    """The 0-d sum belongs to no chunk and would run first; it reads X, which the update
    before it writes, so it stays after the write (and Y's two ops come together)."""
    module = tail_graph()
    assert tail_order(module) == ["mul_tensor", "update_unless", "add_tensor", "sum_default"]
    g1, g2, x, y = (torch.randn(3) for _ in range(4))
    expected = module(g1, g2, x.clone(), y)
    assert locality.by_parameter(module, chunk_bytes=1) == 2
    assert tail_order(module) == ["mul_tensor", "add_tensor", "update_unless", "sum_default"]
    got = module(g1, g2, x.clone(), y)
    for want, have in zip(expected, got, strict=True):
        assert torch.equal(want, have)
    assert torch.equal(got[2], (x + g1).sum())


def test_a_tail_off_the_cpu_keeps_its_order():
    """On a GPU a foreach op is one kernel over all tensors: the traced order is the fast
    one there (shown with tensors on the meta device)."""
    module = tail_graph("meta")
    assert locality.by_parameter(module, chunk_bytes=1) == 0
    assert tail_order(module) == ["mul_tensor", "update_unless", "add_tensor", "sum_default"]
