"""Where a GPU's step time goes, estimated on a CPU: every kernel-level op one training step
dispatches, with the bytes it reads and writes and the floating-point operations it does,
and a roofline estimate of each op's time on a named GPU (issue 42: the H200's BERT-base eager
step ran 0.79x eager autocast's, and for a while no GPU was lent to profile it; it still
answers between the loans a session gets).

    python tools/bench/traffic_steps.py --model bert-base --batches 2 4 --at 32 \\
        --configs autocast graphamp --gpu h200

A step is recorded op by op with a ``TorchDispatchMode`` (what reaches the dispatcher below
autograd and autocast: one op is one kernel launch on a GPU, views launch none) at each of
``--batches`` and extrapolated to ``--at`` per op, linearly in the batch (every activation
is; parameters, gradients and optimizer state are not: the fit keeps both). An op's time on
the GPU is the larger of its bytes over the memory bandwidth and its FLOPs over the matrix
units' throughput (``--bandwidth``, ``--tflops``: sustained figures, not the data sheet's),
and at least ``--min-us`` (a kernel's launch-to-end floor). The estimate has no caches, no
overlap and no host time (this session measured graphamp's host time at 0.90x eager
autocast's): read its ratios and its op-by-op differences, not its milliseconds.

The configurations run the GPU workload (``tools/gpu/gpu_train.py``'s full sizes: HF BERT-base,
its eager attention, sequence 512, AdamW, batch 32; or ResNet-50 at 224 px, SGD, batch 128)
in float16 with CUDA's op lists on CPU tensors:
- ``autocast``: eager ``torch.autocast`` + ``GradScaler`` + the optimizer with ``foreach``
  (CUDA's default). The CPU's autocast lists differ from CUDA's where this workload meets
  them; the CUDA behaviour is put in their place for the run (:func:`cuda_autocast_lists`):
  ``layer_norm`` in float32 and ``softmax`` of a float16 input to float32 as one kernel
  (CUDA's ``_softmax(half_to_float=True)`` and its backward, recorded as such).
- ``graphamp``: ``graphamp.fx.train_step`` with ``Policy(dialect="fx_cuda")``, eager.
In both, the kernels CUDA picks where a CPU picks others are put in place (:func:`cuda_kernels`:
dropout's fused kernel; graphamp's step built as for a CUDA device). Float16 matrix products
are computed in float32 and rounded (the CPU emulates float16 ones tens of times slower), and
CUDA's fused float16 softmax kernels as the two ops they fuse; each is recorded as the op it
stands for.

The same recording estimates each configuration's peak memory, as CUDA's allocator counts it
(``torch.cuda.max_memory_allocated``: the bytes of the storages alive, blocks' rounding
aside): the storages alive at each op's end (its outputs made, what it read not yet freed),
tracked by weak references, from those the last step left alive (parameters, optimizer state,
gradients until the step frees them) to those the step makes; its largest sum, fitted linearly
in the batch like the ops, with what it holds by the op that made each storage. The emulation's
float32 temporaries (a float16 matrix product computed wide) are not the step's and are not
counted. ``--configs float32`` adds the float32 step (its peak is the bar's denominator, issue
42: at most 0.75x).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import operator
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "gpu"), str(ROOT / "tools" / "bench")]

import benchlib  # noqa: E402
import gpu_train  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import get_proxy_mode  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402

aten = torch.ops.aten

# sustained memory bandwidth (TB/s) and float16 dense matrix throughput (TFLOP/s) per GPU:
# about 75% of the data sheet's HBM figure and 60% of its dense tensor-core figure, what large
# elementwise kernels and BERT-sized GEMMs reach
GPUS: dict[str, tuple[float, float]] = {"h200": (3.6, 600.0), "h100": (2.5, 500.0)}

# matrix products whose float16 form the CPU emulates slowly: run in float32, rounded
_MATRIX = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
    aten.convolution_backward.default,
}
# allocation without a write: no traffic
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default}


class Op(NamedTuple):
    """One dispatched op of a step: its name, bytes read and written, FLOPs."""

    name: str
    read: int
    written: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.read + self.written


def _nbytes(t: torch.Tensor) -> int:
    """Bytes an op touches reading or writing ``t``: its elements, or its storage's when it is
    an expanded view (a broadcast reads each stored element once)."""
    if t.device.type == "meta":
        return 0
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _returns_view(func: torch._ops.OpOverload) -> bool:
    """A view op (its outputs alias an input without writing it): no kernel, no bytes."""
    returns = func._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


class Storage(NamedTuple):
    """A storage the recorder saw: a weak reference to it, its bytes, the op that made it."""

    ref: StorageWeakRef
    nbytes: int
    made_by: str


class Recorder(TorchDispatchMode):
    """Records every op below autograd: bytes read (tensor arguments), written (outputs; for
    an op that writes an argument in place, that argument) and FLOPs (torch's flop counter's
    formulas); views and allocations are left out. With ``held`` (the storages a last step's
    recorder saw), also the bytes alive after each op and their peak (:class:`Memory`)."""

    def __init__(self, held: dict[int, Storage] | None = None) -> None:
        super().__init__()
        self.ops: list[Op] = []
        self.memory = held is not None
        # every storage seen, by its C++ address; the alive ones are the step's memory
        self.storages: dict[int, Storage] = {
            key: each for key, each in (held or {}).items() if not each.ref.expired()
        }
        self.peak = sum(each.nbytes for each in self.storages.values())
        self.at_peak = _by_maker(self.storages)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        if get_proxy_mode() is not None or not all(map(_real, inputs)):
            # a capture (graphamp traces its step with make_fx on fake tensors): not a kernel
            # of the step, and what it calls becomes the step's graph, so it is left as it is
            return func(*args, **kwargs)
        out = _run(func, args, kwargs)
        name = str(func.overloadpacket).removeprefix("aten.")
        if self.memory:
            self._count(name, inputs, _tensors(out))
        if func in _ALLOCATIONS or _returns_view(func):
            return out
        written_args = [
            a
            for a, spec in zip(args, func._schema.arguments, strict=False)
            if isinstance(a, torch.Tensor)
            and spec.alias_info is not None
            and spec.alias_info.is_write
        ]
        outputs = written_args or [t for t in _tensors(out) if not any(_same(t, i) for i in inputs)]
        flops = 0
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
        if func is aten._to_copy.default and inputs:
            name += f" {_short(inputs[0].dtype)}->{_short(_tensors(out)[0].dtype)}"
        self.ops.append(Op(name, sum(map(_nbytes, inputs)), sum(map(_nbytes, outputs)), flops))
        return out

    def _count(self, name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        """Track the storages the op ``name`` read (first seen: held from before the step) and
        made; drop the freed; keep the peak and what it held."""
        for tensors, made_by in ((inputs, "held"), (outputs, name)):
            for t in tensors:
                if t.device.type == "meta":
                    continue
                storage = t.untyped_storage()
                seen = self.storages.get(storage._cdata)
                if seen is None:
                    label = f"{made_by} {_short(t.dtype)}"
                    self.storages[storage._cdata] = Storage(
                        StorageWeakRef(storage), storage.nbytes(), label
                    )
                elif seen.nbytes != storage.nbytes():  # resized since (an out= into empty(0))
                    self.storages[storage._cdata] = seen._replace(nbytes=storage.nbytes())
        alive = {k: each for k, each in self.storages.items() if not each.ref.expired()}
        self.storages = alive
        total = sum(each.nbytes for each in alive.values())
        if total > self.peak:
            self.peak, self.at_peak = total, _by_maker(alive)


def _by_maker(storages: dict[int, Storage]) -> dict[str, int]:
    """Bytes by the op that made them."""
    held: dict[str, int] = collections.Counter()
    for each in storages.values():
        held[each.made_by] += each.nbytes
    return dict(held)


def _real(t: torch.Tensor) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


def _run(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``func`` on its arguments; a float16 matrix product or convolution computed in float32
    and rounded, and CUDA's float16 -> float32 softmax kernels (``half_to_float``, and the
    backward's ``input_dtype=float16``), which a CPU lacks, as the two ops they fuse."""
    if func in _MATRIX and any(
        isinstance(a, torch.Tensor) and a.dtype == torch.float16 for a in args
    ):
        wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        return tree_map(
            lambda t: t.half() if isinstance(t, torch.Tensor) else t, func(*wide, **kwargs)
        )
    if func is aten._softmax.default and args[2] and args[0].dtype == torch.float16:
        return torch._softmax(args[0].float(), args[1], False)
    if (
        func is aten._softmax_backward_data.default
        and args[3] == torch.float16
        and args[0].dtype == torch.float32
    ):
        return torch._softmax_backward_data(*args[:3], torch.float32).half()
    return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_autocast_lists() -> Iterator[None]:
    """CPU autocast with CUDA's behaviour for the ops the workloads meet where the two
    differ: ``layer_norm`` in float32 (CUDA's fp32 list), ``softmax`` to float32 (its
    fp32_set_opt_dtype list; a float16 input is one fused kernel on CUDA), ``dropout`` as
    CUDA's one fused ``native_dropout`` kernel."""
    library = torch.library.Library("aten", "IMPL")

    def layer_norm(x, shape, weight=None, bias=None, eps=1e-5, cudnn=True):  # type: ignore[no-untyped-def]
        wide = [
            t.float() if t is not None and t.is_floating_point() else t for t in (x, weight, bias)
        ]
        with torch.autocast("cpu", enabled=False):
            return torch.layer_norm(wide[0], shape, wide[1], wide[2], eps, cudnn)

    def softmax(x, dim, dtype=None):  # type: ignore[no-untyped-def]
        with torch.autocast("cpu", enabled=False):
            if dtype is None and x.dtype == torch.float16:  # CUDA's one fused kernel
                return torch._softmax(x, dim, True)
            return torch.softmax(x, dim, dtype=dtype or torch.float32)

    with _quiet_override():
        library.impl("layer_norm", layer_norm, "AutocastCPU")
        library.impl("softmax.int", softmax, "AutocastCPU")
    try:
        yield
    finally:
        library._destroy()


@contextlib.contextmanager
def cuda_kernels() -> Iterator[None]:
    """The kernels CUDA picks where a CPU picks others, for every configuration: ``dropout``
    as one ``native_dropout`` kernel writing the output and a boolean mask
    (``is_fused_kernel_acceptable``; the CPU's is ``bernoulli_``, ``div_`` and ``mul``, and
    so is a step graph traced on a CPU), and graphamp's eager step built as for a CUDA device
    (its fused softmax kernels, its update as foreach ops over all parameters, the finite
    check read on the host once; a flag not read there is decided on the device, as a GPU
    would: updates out of place, the step guard a ``torch.where``)."""
    from graphamp.fx.dialect import lowering
    from graphamp.fx.training import eager, locality, step_size

    library = torch.library.Library("aten", "IMPL")

    def dropout(x, p, train):  # type: ignore[no-untyped-def]
        if train and 0 < p < 1 and x.numel() > 0:
            return torch.native_dropout(x, p, train)[0]
        return x if not train or p == 0 else x * torch.zeros_like(x)

    from graphamp.fx.training.step import TrainStep

    converted = TrainStep._converted

    def converted_as_on_cuda(self: TrainStep, batch: Sequence[torch.Tensor]) -> Any:
        # the step's trace decomposes a captured ``aten.dropout`` through PyTorch's C++
        # composite, which picks the fused kernel for CUDA tensors only: picked here instead
        forward, plan = converted(self, batch)
        graph = forward.graph
        for node in list(graph.nodes):
            if node.target is aten.dropout.default:
                with graph.inserting_before(node):
                    fused = graph.call_function(aten.native_dropout.default, node.args)
                    first = graph.call_function(operator.getitem, (fused, 0))
                node.replace_all_uses_with(first)
                graph.erase_node(node)
        forward.recompile()
        return forward, plan

    with _quiet_override():
        library.impl("dropout", dropout, "CompositeImplicitAutograd")
    TrainStep._converted = converted_as_on_cuda  # type: ignore[method-assign]
    # graphamp's eager passes that look at the device: as for CUDA tensors
    patches = [
        (eager, "on_cuda", lambda module: True),  # the fused softmax kernels, one host read
        (locality, "_on_cpu", lambda node: False),  # the update as foreach ops, not by parameter
        (step_size, "_adam_descent", lambda node: None),  # Adam's last formula as traced
        # a flag is read on the host where the step reads it there (a Python bool), else on
        # the device: updates out of place, the guard a torch.where
        (lowering, "reads_on_host", lambda flag: isinstance(flag, bool)),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, patched in patches:
        setattr(owner, name, patched)
    try:
        yield
    finally:
        TrainStep._converted = converted  # type: ignore[method-assign]
        for owner, name, original in saved:
            setattr(owner, name, original)
        library._destroy()


@contextlib.contextmanager
def _quiet_override() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


CONFIGS = ("float32", "autocast", "graphamp")


def steps(
    work: gpu_train.Workload, base: torch.nn.Module, configs: Sequence[str] = CONFIGS[1:]
) -> dict[str, Callable[..., Any]]:
    """``configs``' step functions, in that order, each on its own copy of ``base``."""
    import graphamp
    from graphamp.fx import train_step
    from graphamp.policy.policy import Policy

    def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = copy.deepcopy(base).train()
        optimizer = work.optimizer(model)
        for group in optimizer.param_groups:
            group["foreach"] = True  # CUDA's default; the CPU's is a loop per parameter
        return model, optimizer

    def float32() -> Callable[..., Any]:
        model, optimizer = model_and_optimizer()

        def step(*batch: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            loss = work.loss_fn(model(*batch[:-1]), batch[-1])
            loss.backward()
            optimizer.step()
            return loss.detach()

        return step

    def autocast() -> Callable[..., Any]:
        model, optimizer = model_and_optimizer()
        scaler = torch.amp.GradScaler("cpu")

        def step(*batch: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            with cuda_autocast_lists(), torch.autocast("cpu", dtype=torch.float16):
                loss = work.loss_fn(model(*batch[:-1]), batch[-1])
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            return loss.detach()

        return step

    def graphamp_step() -> Callable[..., Any]:
        model = copy.deepcopy(base).train()
        policy = Policy.create(dialect="fx_cuda", dtype="float16")
        return train_step(
            model,
            work.loss_fn,
            work.optimizer(model),
            policy=policy,
            loss_scaling=graphamp.DynamicLossScaling.torch_defaults(),
        )

    builders = {"float32": float32, "autocast": autocast, "graphamp": graphamp_step}
    return {config: builders[config]() for config in configs}


class Memory(NamedTuple):
    """A step's peak bytes alive and what they were, by the op that made each storage."""

    peak: int
    held: dict[str, int]


def record(step: Callable[..., Any], batch: Sequence[torch.Tensor]) -> tuple[list[Op], Memory]:
    """The ops of one step on ``batch`` and its peak memory, after one step not kept (capture,
    lazy state) under a recorder too: for its float32 matrix products, and for the storages
    the kept step starts with (what the first left alive)."""
    held: dict[int, Storage] = {}
    for _ in range(2):
        with Recorder(held) as recorder:
            step(*batch)
        held = recorder.storages
    return recorder.ops, Memory(recorder.peak, recorder.at_peak)


def _linear_fit(b0: int, b1: int, at: int) -> Callable[[int, int], int]:
    """A count at batch ``at`` from its values at batches ``b0`` and ``b1``, on their line
    (never below zero)."""

    def fit(u: int, v: int) -> int:
        return max(0, round(u + (v - u) * (at - b0) / (b1 - b0)))

    return fit


def extrapolate_memory(runs: dict[int, Memory], at: int) -> Memory:
    """The peak and what it holds at batch ``at``, each fitted linearly from the recorded
    batches (a label missing at one batch holds nothing there)."""
    (b0, first), (b1, second) = sorted(runs.items())[:2]
    fit = _linear_fit(b0, b1, at)
    labels = {*first.held, *second.held}
    held = {k: fit(first.held.get(k, 0), second.held.get(k, 0)) for k in labels}
    return Memory(fit(first.peak, second.peak), held)


def memory_report(memory: dict[str, Memory], top: int) -> None:
    """Each configuration's estimated peak, against float32's and autocast's where recorded,
    and what the last configuration's peak holds beside autocast's (else the first's)."""
    mib, gib = 2.0**20, 2.0**30
    print("\nestimated peak memory (storages alive, as torch.cuda.max_memory_allocated counts)")
    for config, figures in memory.items():
        ratios = [
            f"{figures.peak / memory[base].peak:.3f}x {base}"
            for base in ("float32", "autocast")
            if base in memory and base != config and memory[base].peak
        ]
        print(
            f"  {config:<10} {figures.peak / mib:10.1f} MiB ({figures.peak / gib:.2f} GiB)  "
            f"{', '.join(ratios)}"
        )
    names = list(memory)
    if len(names) < 2:
        return
    last = names[-1]
    first = "autocast" if "autocast" in names[:-1] else names[0]
    labels = {*memory[first].held, *memory[last].held}
    order = sorted(
        labels, key=lambda k: -max(memory[first].held.get(k, 0), memory[last].held.get(k, 0))
    )
    print(f"\nheld at the peak, by the op that made it (MiB): {first} | {last}")
    for label in order[:top]:
        a, b = memory[first].held.get(label, 0) / mib, memory[last].held.get(label, 0) / mib
        print(f"  {label:<34} {a:10.1f} | {b:10.1f}")


def extrapolate(runs: dict[int, list[Op]], at: int) -> list[Op]:
    """Each op's bytes and FLOPs at batch ``at``, fitted linearly from the recorded batches
    (the same ops in the same order at each)."""
    (b0, first), (b1, second) = sorted(runs.items())[:2]
    if [o.name for o in first] != [o.name for o in second]:
        raise SystemExit(f"the step dispatched different ops at batch {b0} and {b1}")
    fit = _linear_fit(b0, b1, at)
    return [
        Op(a.name, fit(a.read, b.read), fit(a.written, b.written), fit(a.flops, b.flops))
        for a, b in zip(first, second, strict=True)
    ]


def seconds(op: Op, bandwidth: float, tflops: float, floor_us: float) -> float:
    return max(op.bytes / (bandwidth * 1e12), op.flops / (tflops * 1e12), floor_us * 1e-6)


def report(
    ops: dict[str, list[Op]], bandwidth: float, tflops: float, floor_us: float, top: int
) -> None:
    names = list(ops)
    per: dict[str, dict[str, list[float]]] = {}  # op name -> config -> [calls, GB, GFLOP, ms]
    for config, recorded in ops.items():
        for op in recorded:
            row = per.setdefault(op.name, {c: [0.0, 0.0, 0.0, 0.0] for c in names})[config]
            row[0] += 1
            row[1] += op.bytes / 1e9
            row[2] += op.flops / 1e9
            row[3] += seconds(op, bandwidth, tflops, floor_us) * 1e3
    totals = {c: [sum(per[n][c][i] for n in per) for i in range(4)] for c in names}
    print(
        f"estimate: max(bytes / {bandwidth} TB/s, FLOPs / {tflops} TFLOP/s, {floor_us} us) per op"
    )
    head = " | ".join(f"{c}: calls, GB, ms" for c in names)
    print(f"\n{'op':<34} | {head} | ms difference")
    first = names[0]
    order = sorted(per, key=lambda n: -abs(per[n][names[-1]][3] - per[n][first][3]))
    for name in order[:top]:
        cells = " | ".join(
            f"{int(per[name][c][0]):>5} {per[name][c][1]:>8.2f} {per[name][c][3]:>8.2f}"
            for c in names
        )
        print(f"{name:<34} | {cells} | {per[name][names[-1]][3] - per[name][first][3]:+.2f}")
    print("\ntotals")
    for c in names:
        calls, gb, gflop, ms = totals[c]
        print(
            f"  {c:<10} {int(calls):>6} kernels, {gb:9.2f} GB, {gflop / 1e3:8.2f} TFLOP, "
            f"estimate {ms:8.2f} ms"
        )
    if len(names) > 1:
        speed = totals[first][3] / totals[names[-1]][3]
        print(f"  estimated speed {names[-1]} / {first}: {speed:.3f}x")


def record_batch(
    model: str,
    scale: str,
    batch_size: int,
    overrides: dict[str, Any],
    recorded: dict[str, dict[int, list[Op]]],
    memory: dict[str, dict[int, Memory]],
    configs: Sequence[str] = CONFIGS[1:],
) -> None:
    """Each configuration's ops and peak memory at ``batch_size``, into ``recorded`` and
    ``memory``."""
    work = gpu_train.workload(model, scale, batch=batch_size, **overrides)
    base = work.build(0)
    batch = work.batch(0, torch.device("cpu"))
    for config, step in steps(work, base, configs).items():
        recorded[config][batch_size], memory[config][batch_size] = record(step, batch)
        print(
            f"recorded {config} at batch {batch_size}: {len(recorded[config][batch_size])} ops",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        choices=("bert-base", "resnet50"),
        default="bert-base",
        help="the workload (default bert-base: HF BERT-base with its eager attention)",
    )
    parser.add_argument(
        "--scale",
        choices=tuple(gpu_train.SIZES),
        default="full",
        help="gpu_train.py's sizes (default: full, the GPU's)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        nargs=2,
        default=(2, 4),
        help="the two batch sizes recorded (default 2 4)",
    )
    parser.add_argument(
        "--at",
        type=int,
        default=None,
        help="the batch the estimate is for (default: the workload's)",
    )
    parser.add_argument("--seq", type=int, default=None, help="BERT's sequence length")
    parser.add_argument(
        "--gpu",
        choices=tuple(GPUS),
        default="h200",
        help="the GPU priced: its sustained bandwidth and float16 throughput (default h200)",
    )
    parser.add_argument("--bandwidth", type=float, default=None, help="TB/s (default: the GPU's)")
    parser.add_argument("--tflops", type=float, default=None, help="TFLOP/s (default: the GPU's)")
    parser.add_argument(
        "--min-us",
        type=float,
        default=2.0,
        help="the least time a kernel takes, microseconds (default 2)",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=CONFIGS,
        default=list(CONFIGS[1:]),
        help="the configurations, in the order the tables compare them: the last against the "
        "first (default autocast graphamp; float32 adds the float32 step, the memory bar's "
        "denominator)",
    )
    parser.add_argument("--top", type=int, default=30, help="ops listed (default 30)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads for the recording runs"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(benchlib.machine())
    overrides = {"seq": args.seq} if args.seq else {}
    at = args.at or gpu_train.SIZES[args.scale][args.model]["batch"]
    recorded: dict[str, dict[int, list[Op]]] = collections.defaultdict(dict)
    memory: dict[str, dict[int, Memory]] = collections.defaultdict(dict)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cuda_kernels())
        for batch_size in args.batches:
            record_batch(
                args.model, args.scale, batch_size, overrides, recorded, memory, args.configs
            )
    bandwidth, tflops = GPUS[args.gpu]
    print(
        f"\n{args.model} ({args.scale} sizes{', seq ' + str(args.seq) if args.seq else ''}), "
        f"batch {at}, {', '.join(args.configs)} (float16 where mixed), GPU model {args.gpu}"
    )
    report(
        {c: extrapolate(runs, at) for c, runs in recorded.items()},
        args.bandwidth or bandwidth,
        args.tflops or tflops,
        args.min_us,
        args.top,
    )
    memory_report({c: extrapolate_memory(runs, at) for c, runs in memory.items()}, args.top)


if __name__ == "__main__":
    main()
