"""What a training step holds between calls: the model's float32 parameters once (the step
trains the model's own tensors in place), the optimizer and loss-scaling state beside them, and
with ``keep_model`` a second copy of the parameters that reaches the model only through
``copy_to``. Bytes are counted over the tensor storages reachable from the step and the
model, each storage once."""

from __future__ import annotations

import gc
import types
import weakref
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from graphamp.errors import GraphampError
from graphamp.fx import train_step
from tests.hf_models import VOCAB, hf_model

# Followed no further: code and classes reach every module's globals, not the step's state.
_OPAQUE = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type, types.MethodType)


def reachable_bytes(*roots: Any) -> int:
    """The bytes of the CPU storages of every tensor reachable from ``roots`` (through
    objects, containers and modules, not through code, classes or modules), each once."""
    seen_objects: set[int] = set()
    storages: dict[int, int] = {}
    pending = list(roots)
    while pending:
        obj = pending.pop()
        if id(obj) in seen_objects or isinstance(obj, _OPAQUE):
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            try:  # fake and functional tensors of a capture have no memory of their own
                storage = obj.untyped_storage()
                pointer = storage.data_ptr() if storage.device.type == "cpu" else 0
            except (RuntimeError, NotImplementedError):
                continue
            if pointer:
                storages[pointer] = storage.nbytes()
            continue
        pending.extend(gc.get_referents(obj))
    return sum(storages.values())


def nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def expected_bytes(step: Any, model: nn.Module) -> int:
    """One float32 copy of the parameters and buffers, the optimizer and loss-scaling state,
    and the learning rates the step passes its graphs."""
    state = [*step.opt_state.values(), *step.state.values(), *step._rate_tensors]
    return nbytes([*model.parameters(), *model.buffers(), *state])


# Besides: the example batch the forward pass was converted on (16 x 32 float32) and the
# scalar constants in the graphs' metadata; less than a copy of any model's parameters here.
SLACK = 16 * 32 * 4 + 256


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 8))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 32, generator=generator), torch.randn(16, 8, generator=generator)


def trained(keep_model: bool, steps: int = 3, compiled: bool = False) -> tuple[Any, nn.Module]:
    model = net().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = train_step(
        model, nn.functional.mse_loss, optimizer, dtype="bfloat16", keep_model=keep_model
    )
    if compiled:
        step.compile(*batch(0))
    for seed in range(steps):
        step(*batch(seed))
    return step, model


@pytest.mark.parametrize("keep_model", [False, True])
def test_the_step_holds_the_parameters_once_unless_keep_model(keep_model):
    step, model = trained(keep_model)
    params = nbytes(model.parameters())
    # AdamW: two float32 moments per parameter and a step count; what the passes added.
    assert nbytes(step.opt_state.values()) >= 2 * params
    copies = params + nbytes(model.buffers()) if keep_model else 0
    assert expected_bytes(step, model) + copies <= reachable_bytes(step, model)
    assert reachable_bytes(step, model) <= expected_bytes(step, model) + copies + SLACK


def test_the_step_trains_the_models_own_tensors():
    """The model holds the trained parameters and batch-norm statistics after every call:
    the very tensors the step updates, changed from the initial ones."""
    model = net().train()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    step, model = trained(keep_model=False)
    for name, param in model.named_parameters():
        assert step.params[name].data_ptr() == param.data_ptr(), name
        assert not torch.equal(param.detach(), initial[name]), name
    for name, buffer in model.named_buffers():
        assert step.buffers[name].data_ptr() == buffer.data_ptr(), name
    assert not torch.equal(model[1].running_mean, initial["1.running_mean"])


def test_keep_model_leaves_the_model_until_copy_to():
    model = net().train()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    step, model = trained(keep_model=True)
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())
    step.copy_to()
    for name, value in {**step.params, **step.buffers}.items():
        assert torch.equal(model.state_dict()[name], value), name
    assert not torch.equal(model[0].weight.detach(), initial["0.weight"])


def test_an_update_that_makes_a_new_tensor_is_copied_into_the_model():
    """A graph that cannot write a parameter in place (here the functional graph, as
    ``torch.compile`` is handed it, run eagerly) still leaves the trained values in the
    model's own tensors, and the step holds those, not the new ones."""
    from graphamp.fx.training import eager

    step, model = trained(keep_model=False, steps=1)
    eager.for_compile(step.graph)
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    moved = {n: p.detach().clone() for n, p in model.named_parameters()}
    step(*batch(7))
    for name, param in model.named_parameters():
        assert param.data_ptr() == before[name] == step.params[name].data_ptr(), name
        assert not torch.equal(param.detach(), moved[name]), name
    held = reachable_bytes(step, model)
    assert expected_bytes(step, model) <= held <= expected_bytes(step, model) + SLACK


def test_a_compiled_step_trains_the_models_own_tensors():
    step, model = trained(keep_model=False, steps=2, compiled=True)
    for name, param in model.named_parameters():
        assert step.params[name].data_ptr() == param.data_ptr(), name
    step_count = float(step.opt_state["step"])
    assert step_count == 2.0


def test_tied_weights_are_held_once():
    """GPT-2's language-model head shares the token embedding: one tensor, trained once."""
    model = hf_model("gpt2", lm_head=True).train()
    assert model.lm_head.weight is model.transformer.wte.weight

    def lm_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output[0].flatten(0, 1).float(), target.flatten())

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = train_step(model, lm_loss, optimizer, dtype="bfloat16")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (2, 12), generator=generator)
    step(ids, ids.roll(-1, dims=1))
    step(ids, ids.roll(-1, dims=1))
    held = reachable_bytes(step, model)
    assert expected_bytes(step, model) <= held <= expected_bytes(step, model) + SLACK
    assert nbytes(model.parameters()) > SLACK
    assert model.lm_head.weight is model.transformer.wte.weight


def test_a_resumed_optimizers_moments_are_held_once():
    """An optimizer with state (a resumed run): the step trains its moments in place rather
    than beside copies of them."""
    model = net().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batch(0)
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    moments = nbytes(t for s in optimizer.state.values() for t in s.values())
    step = train_step(model, nn.functional.mse_loss, optimizer, dtype="bfloat16")
    step(*batch(1))
    step(*batch(2))
    weight = model[0].weight
    assert (
        optimizer.state[weight]["exp_avg"].data_ptr()
        == step.opt_state["exp_avg:0.weight"].data_ptr()
    )
    held = reachable_bytes(step, model)  # the optimizer and its state are reachable from step
    assert moments > SLACK
    assert expected_bytes(step, model) <= held <= expected_bytes(step, model) + SLACK


def test_a_sharded_step_refuses_keep_model():
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GraphampError, match="keep_model"):
        train_step(model, nn.functional.mse_loss, optimizer, mesh=object(), keep_model=True)


class AllocationPeak(TorchDispatchMode):
    """The most bytes held at once, by dtype, in the storages that ops make while the mode is
    on: each storage counted from the op that made it until it is freed (a weak reference).
    What a device allocator's peak would show, less what was held before."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, torch.dtype]] = {}
        self.peak = 0
        self.peak_by_dtype: dict[torch.dtype, int] = {}

    def _freed(self, pointer: int) -> None:
        self.live.pop(pointer, None)

    def __torch_dispatch__(
        self, func: Any, _types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        for tensor in pytree.tree_leaves(result):
            if not isinstance(tensor, torch.Tensor):
                continue
            try:  # fake and functional tensors of a capture hold no memory
                storage = tensor.untyped_storage()
                pointer = storage.data_ptr()
            except (RuntimeError, NotImplementedError):
                continue
            if pointer and pointer not in self.live:
                self.live[pointer] = (storage.nbytes(), tensor.dtype)
                weakref.finalize(storage, self._freed, pointer)
                held = sum(n for n, _ in self.live.values())
                if held > self.peak:
                    self.peak = held
                    self.peak_by_dtype = {}
                    for n, dtype in self.live.values():
                        self.peak_by_dtype[dtype] = self.peak_by_dtype.get(dtype, 0) + n
        return result


def conv_net() -> nn.Module:
    """Convolutions and batch norms whose activations outweigh their parameters, as a
    ResNet's do at a real batch."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for inputs in (3, 8, 8):
        layers += [nn.Conv2d(inputs, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def images(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, 48, 48, generator=generator), torch.randint(0, 10, (4,))


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.float(), target)


def float16_step(model: nn.Module) -> Any:
    """graphamp's float16 step on a GPU's policy (CUDA autocast's lists), loss scaling on."""
    from graphamp import DynamicLossScaling
    from graphamp.policy.policy import Policy

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    policy = Policy.create(dialect="fx_cuda", dtype="float16")
    scaling = DynamicLossScaling.torch_defaults()
    return train_step(model, cross_entropy, optimizer, policy=policy, loss_scaling=scaling)


def peak_of(run: Any, *args: Any) -> AllocationPeak:
    gc.collect()
    with AllocationPeak() as peak:
        run(*args)
    return peak


@pytest.mark.filterwarnings("ignore::graphamp.SlowPrecisionWarning")
def test_capturing_a_step_allocates_no_step_of_its_own():
    """The first call captures the step (traced on fake tensors) and runs it: its peak is the
    step's own, plus the optimizer state it creates (momentum, one float32 copy of the
    parameters) and a passing copy of the parameters. Traced on real tensors, the capture
    held a whole step's values of its own, twice the step's peak here: a GPU's peak over a
    first call (its warm-up) was then float32's."""
    model = conv_net().train()
    step = float16_step(model)
    first = peak_of(step, *images(0)).peak
    steady = peak_of(step, *images(1)).peak
    params = nbytes(model.parameters())
    assert steady > 20 * params  # the activations weigh, as a real model's do
    assert first <= steady + 2 * params + SLACK


@pytest.mark.filterwarnings("ignore::graphamp.SlowPrecisionWarning")
def test_a_float16_step_holds_its_activations_in_float16():
    """The values a float16 step of convolutions and batch norms keeps for its backward are
    float16: its peak is at most autocast + GradScaler's on the same model and batch, and
    float32 is a sliver of it (batch norm runs in its input's type, as under autocast, not
    in float32 beside float16 copies)."""
    model = conv_net().train()
    step = float16_step(model)
    step(*images(0))
    ours = peak_of(step, *images(1))

    theirs_model = conv_net().train()
    optimizer = torch.optim.SGD(theirs_model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")

    def autocast_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = cross_entropy(theirs_model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    autocast_step(*images(0))
    theirs = peak_of(autocast_step, *images(1))
    assert ours.peak <= theirs.peak
    assert ours.peak_by_dtype.get(torch.float16, 0) >= 0.9 * ours.peak
