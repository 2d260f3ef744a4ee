"""Whole training steps for ``tools/gpu/bench_gpu.py``: graphamp's step against float32, eager
``torch.autocast`` + ``GradScaler`` and ``torch.compile`` + autocast, on a ResNet-50 and
Hugging Face BERT-base (or their tiny twins on a machine without a GPU).

A step is what a user's loop does per batch: forward, loss, backward, optimizer update, and
under float16 the loss scaling, unscale, finite check, step guard and scale update. Every
configuration starts from the same initial weights (a deep copy) and trains on the same batch;
the step time is the median after a warm-up, with the device synchronised around each step.
"""

from __future__ import annotations

import copy
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# (model size, batch) per workload: real-world sizes on a GPU ("full") and on a CPU ("cpu":
# tools/bench/bench_speedup.py), tiny ones to check the code runs.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "full": {
        "resnet50": {"size": "full", "batch": 128, "image": 224, "classes": 1000},
        "bert-base": {
            "layers": 12,
            "hidden": 768,
            "heads": 12,
            "ffn": 3072,
            "vocab": 30522,
            "batch": 32,
            "seq": 512,
        },
    },
    "cpu": {
        "resnet50": {"size": "full", "batch": 8, "image": 224, "classes": 1000},
        # transformers.BertConfig's defaults
        "bert-base": {
            "layers": 12,
            "hidden": 768,
            "heads": 12,
            "ffn": 3072,
            "vocab": 30522,
            "batch": 8,
            "seq": 128,
            "attention": "sdpa",
        },
    },
    "tiny": {
        "resnet50": {"size": "small", "batch": 4, "image": 32, "classes": 10},
        "bert-base": {
            "layers": 2,
            "hidden": 64,
            "heads": 4,
            "ffn": 128,
            "vocab": 96,
            "batch": 4,
            "seq": 16,
        },
    },
}
WORKLOADS = tuple(SIZES["full"])


@dataclass
class Workload:
    """A model builder, its batches and its loss: everything a configuration trains."""

    name: str
    build: Callable[[int], nn.Module]  # seed -> model, on the CPU, float32
    batch: Callable[[int, torch.device], tuple[torch.Tensor, ...]]  # seed -> inputs..., target
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    samples: int  # per step, for samples/s


def _resnet(sizes: dict[str, Any]) -> Workload:
    from graphamp.models.resnet import SIZES as RESNET
    from graphamp.models.resnet import ResNet

    shape = RESNET[sizes["size"]]

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return ResNet(shape["blocks"], shape["width"], sizes["classes"])

    def batch(seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        n, side = sizes["batch"], sizes["image"]
        images = torch.randn(n, 3, side, side, generator=g)
        labels = torch.randint(0, sizes["classes"], (n,), generator=g)
        return images.to(device), labels.to(device)

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float(), labels)

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    return Workload("resnet50", build, batch, loss_fn, optimizer, sizes["batch"])


def _bert(sizes: dict[str, Any]) -> Workload:
    import transformers

    config = transformers.BertConfig(
        vocab_size=sizes["vocab"],
        hidden_size=sizes["hidden"],
        num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"],
        intermediate_size=sizes["ffn"],
        max_position_embeddings=max(512, sizes["seq"]),
        # the same attention graph in every configuration (on the CPU, the default: sdpa)
        attn_implementation=sizes.get("attention", "eager"),
    )

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return transformers.BertForMaskedLM(config)

    def batch(seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        shape = (sizes["batch"], sizes["seq"])
        ids = torch.randint(1, sizes["vocab"], shape, generator=g)
        labels = torch.randint(1, sizes["vocab"], shape, generator=g)
        return ids.to(device), labels.to(device)

    def loss_fn(output: Any, labels: torch.Tensor) -> torch.Tensor:
        # masked-language-model pre-training's loss, on every position
        logits = output[0].float()
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())

    def optimizer(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    return Workload("bert-base", build, batch, loss_fn, optimizer, sizes["batch"])


def workload(name: str, scale: str, **overrides: Any) -> Workload:
    """``name`` at ``scale``'s sizes, with ``overrides`` (batch, seq, image...) in their place."""
    sizes = {**SIZES[scale][name], **overrides}
    return _resnet(sizes) if name == "resnet50" else _bert(sizes)


@dataclass(frozen=True)
class Mode:
    """One way to train: ``kind`` is float32, autocast, compile+autocast, graphamp (its
    ``train_step``) or backend (``torch.compile(backend=graphamp.fx.backend(...))`` in the
    user's loop)."""

    kind: str
    dtype: str | None = None  # float16, bfloat16 (None: float32)
    tf32: bool = False
    compiled: bool = False  # float32's loop or graphamp's step under torch.compile
    recompute_casts: bool | None = None  # graphamp's train_step(recompute_casts=...)

    @property
    def label(self) -> str:
        if self.kind == "float32":
            return (
                "float32"
                + (", TF32 on" if self.tf32 else "")
                + (", compiled" if self.compiled else "")
            )
        scaler = " + GradScaler" if self.dtype == "float16" else ""
        if self.kind == "autocast":
            return f"eager autocast {self.dtype}{scaler}"
        if self.kind == "compile+autocast":
            return f"torch.compile + autocast {self.dtype}{scaler}"
        if self.kind == "backend":
            return f"graphamp backend {self.dtype}{scaler}"
        return (
            f"graphamp train_step {self.dtype}"
            + {None: "", True: ", casts recomputed", False: ", casts held"}[self.recompute_casts]
            + (", compiled" if self.compiled else "")
        )


def modes(dtypes: tuple[str, ...], compile_modes: bool, extra: bool = False) -> list[Mode]:
    """float32 and TF32, then per type eager autocast and graphamp's eager step and, with
    ``compile_modes``, compile + autocast and graphamp's compiled step; ``extra`` adds float32
    compiled and the graphamp backend in the user's loop (two compilations more)."""
    chosen = [Mode("float32"), Mode("float32", tf32=True)]
    if compile_modes and extra:
        chosen.append(Mode("float32", compiled=True))
    for dtype in dtypes:
        chosen.append(Mode("autocast", dtype))
        if compile_modes:
            chosen.append(Mode("compile+autocast", dtype))
        chosen.append(Mode("graphamp", dtype))
        if compile_modes:
            chosen.append(Mode("graphamp", dtype, compiled=True))
            if extra:
                chosen.append(Mode("backend", dtype))
    return chosen


@contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 for float32 matrix products and convolutions, restored afterwards. Off is float32
    as written; on is what PyTorch's cuDNN convolutions default to."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def step_function(
    mode: Mode, work: Workload, model: nn.Module, device: torch.device
) -> Callable[..., torch.Tensor]:
    """A callable that runs one training step on a batch and returns the loss."""
    optimizer = work.optimizer(model)
    if mode.kind == "graphamp":
        import graphamp
        from graphamp.fx import train_step

        scaling = graphamp.DynamicLossScaling.torch_defaults() if mode.dtype == "float16" else None
        step = train_step(
            model,
            work.loss_fn,
            optimizer,
            dtype=mode.dtype,
            loss_scaling=scaling,
            recompute_casts=mode.recompute_casts,
        )
        if not mode.compiled:
            return step
        compiled: dict[str, bool] = {}

        def compiled_step(*batch: torch.Tensor) -> torch.Tensor:
            if not compiled:
                step.compile(*batch)
                compiled["done"] = True
            return step(*batch)

        return compiled_step
    dtype = getattr(torch, mode.dtype) if mode.dtype else None
    if mode.kind == "backend":
        from graphamp.fx import backend

        forward: Callable[..., Any] = torch.compile(model, backend=backend(dtype=mode.dtype))
    elif mode.kind == "compile+autocast" or mode.compiled:
        forward = torch.compile(model)
    else:
        forward = model
    autocast = dtype is not None and mode.kind != "backend"
    scaler = torch.amp.GradScaler(device.type) if mode.dtype == "float16" else None

    def eager_step(*batch: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=autocast):
            loss = work.loss_fn(forward(*batch[:-1]), batch[-1])
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.detach()

    return eager_step


@dataclass
class Timing:
    mode: Mode
    seconds: float  # median step
    peak_bytes: int | None  # the device allocator's peak over the timed steps (GPU only)
    samples_per_s: float
    all_seconds: list[float] = field(default_factory=list)
    # the peak over the warm-up: graphamp's capture, torch.compile's compilation (GPU only)
    warmup_peak_bytes: int | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def time_mode(
    mode: Mode, work: Workload, base: nn.Module, device: torch.device, steps: int, warmup: int
) -> Timing:
    """Median step time of ``mode`` on one batch, after ``warmup`` steps (capture and
    compilation happen there), and the allocator's peak over the timed steps and over the
    warm-up apart: a step's memory is what each step needs, which a warm-up that captures
    or compiles would hide (and may exceed) in one figure."""
    _release(device)
    model = copy.deepcopy(base).to(device).train()
    batch = work.batch(0, device)
    with tf32(mode.tf32):
        run = step_function(mode, work, model, device)
        for _ in range(warmup):
            run(*batch)
        _sync(device)
        warmup_peak = _reset_peak(device)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            run(*batch)
            _sync(device)
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    seconds = statistics.median(times)
    del run, model
    _release(device)
    return Timing(mode, seconds, peak, work.samples / seconds, times, warmup_peak)


def _reset_peak(device: torch.device) -> int | None:
    """The device allocator's peak so far, its count then started again from what is held
    now (None off a GPU)."""
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return peak


@dataclass
class Curve:
    """One training run's losses, step by step, and what its step skipped."""

    losses: list[float]
    # steps graphamp's step guard skipped (a non-finite gradient); None for a loop that
    # reports none (autocast: GradScaler's skips are not counted here)
    skipped: int | None
    seconds: float  # wall clock of the run, the capture in its first step included

    @property
    def non_finite(self) -> int:
        """How many of the losses are NaN or infinite."""
        return sum(not math.isfinite(loss) for loss in self.losses)


def loss_curve(
    mode: Mode, work: Workload, seed: int, device: torch.device, steps: int, batches: int = 8
) -> list[float]:
    """The loss at each of ``steps`` steps from the initial weights of ``seed``, cycling over
    ``batches`` batches drawn from ``seed`` (a small set the model can fit, so the loss falls)."""
    return training_run(mode, work, seed, device, steps, batches).losses


def training_run(
    mode: Mode,
    work: Workload,
    seed: int,
    device: torch.device,
    steps: int,
    batches: int = 8,
    progress: Callable[[int, float], None] | None = None,
) -> Curve:
    """:func:`loss_curve`'s run, with the steps graphamp's step skipped and the time it took;
    ``progress(steps done, seconds so far)`` is called after every step."""
    start = time.perf_counter()
    model = work.build(seed).to(device).train()
    data = [work.batch(seed * 1000 + i, device) for i in range(batches)]
    run = step_function(mode, work, model, device)
    losses = []
    for i in range(steps):
        losses.append(float(run(*data[i % batches])))
        if progress is not None:
            progress(i + 1, time.perf_counter() - start)
    skipped = getattr(run, "skipped_steps", None)  # a TrainStep's count (a tensor)
    curve = Curve(losses, None if skipped is None else int(skipped), 0.0)
    del run, model
    _release(device)
    curve.seconds = time.perf_counter() - start
    return curve


def windows(curve: list[float], width: int) -> list[float]:
    """Means over consecutive windows of ``width`` steps (a step's loss is noisy)."""
    return [statistics.fmean(curve[i : i + width]) for i in range(0, len(curve), width)]


def _bands(curves: list[list[float]]) -> list[tuple[float, float]]:
    """Each window's min-max band over ``curves`` (their windows), widened by the float
    rounding of the baseline's own values: at least 1e-3 of the larger magnitude."""
    bands = []
    for values in zip(*curves, strict=True):
        low, high = min(values), max(values)
        slack = 1e-3 * max(abs(low), abs(high))
        bands.append((low - slack, high + slack))
    return bands


def within_spread(
    ours: list[list[float]], theirs: list[list[float]], width: int = 10
) -> tuple[int, int]:
    """(windows where every curve of ``ours`` lies inside the min-max band of ``theirs``,
    windows in all): the seed-to-seed spread of the baseline is the tolerance."""
    ours_w = [windows(c, width) for c in ours]
    bands = _bands([windows(c, width) for c in theirs])
    inside = sum(all(low <= c[i] <= high for c in ours_w) for i, (low, high) in enumerate(bands))
    return inside, len(bands)


def held_out_inside(
    ours: list[list[float]], theirs: list[list[float]], width: int = 10
) -> tuple[float, float, int] | None:
    """(share of windows where a curve of ``ours`` lies inside the min-max band of
    ``len(theirs) - 1`` of ``theirs``, the same share for each of ``theirs`` against the band
    of the others, windows a curve): :func:`within_spread`'s question asked fairly.
    ``within_spread`` wants every curve of ours inside a band of all of theirs, which even a
    second set of runs of the same configuration meets in few windows (with 8 seeds each the
    chance that all 8 lie inside the other 8's range is 8*7 / (16*15), 23%, in every window);
    here each of theirs, held out, is the yardstick: ours are within the run-to-run spread
    where their share is not below it. Each of ours is measured against every choice of
    ``len(theirs) - 1`` runs (the mean); None with fewer than 3 of theirs (a band of one run
    is a line)."""
    if len(theirs) < 3:
        return None
    ours_w = [windows(c, width) for c in ours]
    theirs_w = [windows(c, width) for c in theirs]
    # the bands of all of theirs but the j-th, for each j
    held_out = [_bands(theirs_w[:j] + theirs_w[j + 1 :]) for j in range(len(theirs_w))]

    def inside(curve: list[float], bands: list[tuple[float, float]]) -> int:
        return sum(low <= value <= high for value, (low, high) in zip(curve, bands, strict=True))

    count = len(held_out[0])
    theirs_share = statistics.fmean(inside(c, held_out[j]) for j, c in enumerate(theirs_w))
    ours_share = statistics.fmean(inside(c, bands) for c in ours_w for bands in held_out)
    return ours_share / count, theirs_share / count, count


def profile(
    mode: Mode, work: Workload, base: nn.Module, device: torch.device, steps: int = 3
) -> str:
    """The ops that cost ``mode``'s step the most (torch.profiler, self device time on a GPU,
    self CPU time elsewhere), and the share of its casts (``aten::_to_copy``/``copy_``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = copy.deepcopy(base).to(device).train()
    batch = work.batch(0, device)
    with tf32(mode.tf32):
        run = step_function(mode, work, model, device)
        for _ in range(3):
            run(*batch)
        _sync(device)
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with torch_profile(activities=activities) as prof:
            for _ in range(steps):
                run(*batch)
            _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    total = sum(getattr(e, key.replace("cuda", "device"), getattr(e, key, 0)) for e in events)
    casts = sum(
        getattr(e, key.replace("cuda", "device"), getattr(e, key, 0))
        for e in events
        if e.key in ("aten::_to_copy", "aten::copy_", "aten::to")
    )
    table = events.table(sort_by=key, row_limit=15)
    del run, model
    _release(device)
    share = f"{casts / total:.1%}" if total else "-"
    return f"{mode.label}: casts (_to_copy/copy_) {share} of profiled time\n{table}"
