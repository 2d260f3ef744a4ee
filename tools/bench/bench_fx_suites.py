"""The PyTorch models as users have them, for ``tools/bench/bench_fx.py --suite``:

``models``: Hugging Face BERT, LLaMA, Mistral, T5 and ViT with their default configs (caches
on; fewer, narrower layers) and a ResNet-50-shaped CNN, each converted once by
``graphamp.fx.convert`` (dynamic batch, the default), saved with ``graphamp.fx.save`` and read
back with ``graphamp.fx.load``; at three batch sizes, the error against float32 (max |error| /
max |y| of the main output) and the eager forward time of torch.autocast, the converted module
and the loaded program, side by side in one process (medians after a warm-up).

``compile``: ``torch.compile(model, backend=graphamp.fx.backend(...))`` in a plain training
loop with ``torch.amp.GradScaler`` against ``torch.compile(model)`` under ``torch.autocast``
(step time; the configurations trained in lockstep, so that load on the machine falls on all
of them alike), and the loss curves of 200 steps against eager autocast + GradScaler in
bfloat16 and float16 on a small CNN and a small Hugging Face BERT, with the spread autocast's
own curve shows when every weight moves by one float32 ulp (the float-rounding yardstick).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from benchlib import median_time
from torch import nn

Inputs = Callable[[int], dict[str, torch.Tensor]]


def hf_models(width: int, layers: int, seq: int) -> dict[str, tuple[nn.Module, Inputs]]:
    """The Hugging Face models with their configs' defaults but ``layers`` of ``width``."""
    import transformers

    torch.manual_seed(0)
    heads = max(1, width // 64)
    common = {"hidden_size": width, "num_attention_heads": heads, "intermediate_size": 4 * width}
    vocab = {"vocab_size": 1000}
    decoder = {**common, "num_hidden_layers": layers, "num_key_value_heads": heads, **vocab}

    def ids(b: int, n: int = seq) -> torch.Tensor:
        return torch.randint(1, 1000, (b, n), generator=torch.Generator().manual_seed(b))

    models: dict[str, tuple[nn.Module, Inputs]] = {
        "bert": (
            transformers.BertModel(
                transformers.BertConfig(**common, num_hidden_layers=layers, **vocab)
            ),
            lambda b: {"input_ids": ids(b)},
        ),
        "llama": (
            transformers.LlamaModel(transformers.LlamaConfig(**decoder)),
            lambda b: {"input_ids": ids(b)},
        ),
        "mistral": (
            transformers.MistralModel(transformers.MistralConfig(**decoder)),
            lambda b: {"input_ids": ids(b)},
        ),
        "t5": (
            transformers.T5Model(
                transformers.T5Config(
                    d_model=width,
                    d_kv=64,
                    d_ff=4 * width,
                    num_layers=layers,
                    num_heads=heads,
                    **vocab,
                )
            ),
            lambda b: {"input_ids": ids(b), "decoder_input_ids": ids(b, seq // 4)},
        ),
        "vit": (
            transformers.ViTModel(
                transformers.ViTConfig(**common, num_hidden_layers=layers, image_size=224),
                add_pooling_layer=False,
            ),
            lambda b: {"pixel_values": torch.randn(b, 3, 224, 224)},
        ),
    }
    return {name: (model.eval(), inputs) for name, (model, inputs) in models.items()}


def resnet50_shaped(image: int) -> tuple[nn.Module, Inputs]:
    """graphamp's ResNet at ResNet-50's shape (bottleneck blocks 3, 4, 6, 3; width 64)."""
    from graphamp.models.resnet import ResNet

    torch.manual_seed(0)
    model = ResNet((3, 4, 6, 3), 64, 1000).eval()
    return model, lambda b: {"x": torch.randn(b, 3, image, image)}


def main_output(output: Any) -> torch.Tensor:
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0] if isinstance(output, tuple | list) else output


def error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.float() - reference).abs().max() / reference.abs().max())


def forward(module: Any, autocast: bool, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        return main_output(module(**inputs))


def bench_models(names: list[str], batches: list[int], args: Any) -> None:
    import graphamp.fx as gfx

    models = hf_models(args.hf_width, args.hf_layers, args.hf_seq)
    models["resnet50"] = resnet50_shaped(args.image)
    print(
        f"models: Hugging Face {args.hf_layers} layers x {args.hf_width}, {args.hf_seq} tokens "
        f"(T5's decoder {args.hf_seq // 4}), ViT at 224 px; ResNet-50-shaped CNN at "
        f"{args.image} px; bfloat16; one conversion on a batch of {batches[1]}, run at each batch"
    )
    print()
    print(
        "| model | batch | error autocast | error graphamp | loaded = converted | "
        "float32 ms | autocast ms | graphamp ms | loaded .pt2 ms | graphamp vs autocast |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        model, make = models[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            converted, _ = gfx.convert(model, example_kwargs=make(batches[1]))
            seconds = time.perf_counter() - start
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / f"{name}.pt2"
                gfx.save(converted, path)
                loaded, _ = gfx.load(path)
        for batch in batches:
            inputs = make(batch)

            configs = {"float32": (model, False), "autocast": (model, True)}
            configs.update({"graphamp": (converted, False), "loaded": (loaded, False)})
            times = {
                label: median_time(lambda c=config, i=inputs: forward(*c, i), args.runs)[0]
                for label, config in configs.items()
            }
            reference = forward(model, False, inputs).float()
            ours, back = forward(converted, False, inputs), forward(loaded, False, inputs)
            theirs = forward(model, True, inputs)
            print(
                f"| {name} | {batch} | {error(theirs, reference):.2e} | "
                f"{error(ours, reference):.2e} | {torch.equal(ours, back)} | "
                + " | ".join(f"{times[k] * 1e3:.1f}" for k in configs)
                + f" | {times['autocast'] / times['graphamp']:.2f}x |",
                flush=True,
            )
        print(f"<!-- {name}: convert {seconds:.1f} s -->")


# -- the torch.compile backend --------------------------------------------------------------


class SmallCNN(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1, stride=2),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).mean((2, 3)))


def small_bert(width: int) -> nn.Module:
    import transformers

    config = transformers.BertConfig(
        hidden_size=width,
        num_hidden_layers=2,
        num_attention_heads=max(1, width // 32),
        intermediate_size=4 * width,
        vocab_size=1000,
        num_labels=4,
        hidden_dropout_prob=0.0,  # compiled graphs draw dropout masks from other streams
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(config)


def batches_for(kind: str, steps: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    if kind == "cnn":
        return [
            (
                torch.randn(size, 3, 32, 32, generator=generator),
                torch.randint(0, 10, (size,), generator=generator),
            )
            for _ in range(steps)
        ]
    return [
        (
            torch.randint(1, 1000, (size, 64), generator=generator),
            torch.randint(0, 4, (size,), generator=generator),
        )
        for _ in range(steps)
    ]


def training(
    kind: str,
    dtype: torch.dtype,
    how: str,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    args: Any,
) -> Iterator[tuple[float, float]]:
    """(loss, step seconds) of each step of SGD with momentum and GradScaler (enabled for
    float16), one step per ``next``. ``how``: "eager autocast", "perturbed" (every weight one ulp
    off), "compile + autocast", "graphamp backend"."""
    import graphamp.fx as gfx

    torch.manual_seed(0)
    model = SmallCNN() if kind == "cnn" else small_bert(args.compile_width)
    model.train()
    if how == "perturbed":
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1 + 2**-23)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    run: Any = model
    if how.startswith("compile + autocast"):
        run = torch.compile(model)
    elif how == "graphamp backend":
        run = torch.compile(model, backend=gfx.backend(dtype=str(dtype).removeprefix("torch.")))
    autocast = how != "graphamp backend"
    for x, y in batches:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            output = run(x)
        logits = output if kind == "cnn" else output.logits
        loss = nn.functional.cross_entropy(logits.float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        loss_value = loss.item()
        yield loss_value, time.perf_counter() - start


def train_side_by_side(
    kind: str, dtype: torch.dtype, steps: int, args: Any
) -> dict[str, tuple[list[float], list[float]]]:
    """(losses, step seconds) of every configuration in ``HOWS``, trained in lockstep: step i of
    each before step i + 1 of any, in an order rotated every step. Run one after another, the
    configurations took minutes each on a shared 2-core machine, and load that came or went in
    between (OpenMP's two threads slow down manyfold when one core is taken) fell on one
    configuration and not the next: the same CNN step measured 4.5 ms in one run and 24 ms in
    another. In lockstep such load falls on all of them alike."""
    batches = batches_for(kind, steps, args.compile_batch)
    runs = {how: training(kind, dtype, how, batches, args) for how in HOWS}
    results: dict[str, tuple[list[float], list[float]]] = {how: ([], []) for how in HOWS}
    for step in range(steps):
        turn = step % len(HOWS)
        for how in HOWS[turn:] + HOWS[:turn]:
            loss, seconds = next(runs[how])
            results[how][0].append(loss)
            results[how][1].append(seconds)
    return results


# "compile + autocast, again": the same run once more, whose curve parts from the first only by
# inductor's run-to-run differences (its embedding backward adds with atomics on 2 threads)
HOWS = (
    "eager autocast",
    "perturbed",
    "compile + autocast",
    "compile + autocast, again",
    "graphamp backend",
)


def gap(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference of two loss curves."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


def bench_compile(args: Any) -> None:
    torch._dynamo.config.cache_size_limit = 64  # every configuration compiles the same code
    print(
        f"compile: small CNN (2 conv + BN, 32 px) and Hugging Face BERT (2 layers x "
        f"{args.compile_width}, 64 tokens), batch {args.compile_batch}; SGD momentum 0.9, "
        f"GradScaler; {args.steps} steps, the five configurations in lockstep (step i of each "
        "before step i + 1 of any, order rotated each step); step time = median after the "
        "first 5 steps"
    )
    print()
    print(
        "| model | dtype | eager autocast step ms | compile + autocast step ms | graphamp "
        "backend step ms | backend vs compile + autocast | first step s (compile, backend) | "
        "loss gap: backend vs eager | loss gap: compile + autocast vs eager | "
        "loss gap: one-ulp weights | loss gap: compile + autocast vs itself |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    curves = {}
    for kind in ("cnn", "bert"):
        for dtype in (torch.bfloat16, torch.float16):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs = train_side_by_side(kind, dtype, args.steps, args)
            gaps = {how: gap(runs[how][0], runs["eager autocast"][0]) for how in HOWS}

            step = {how: statistics.median(s[5:]) * 1e3 for how, (_, s) in runs.items()}
            print(
                f"| {kind} | {str(dtype)[6:]} | {step['eager autocast']:.1f} | "
                f"{step['compile + autocast']:.1f} | {step['graphamp backend']:.1f} | "
                f"{step['compile + autocast'] / step['graphamp backend']:.2f}x | "
                f"{runs['compile + autocast'][1][0]:.0f}, {runs['graphamp backend'][1][0]:.0f} | "
                f"{gaps['graphamp backend']:.1e} | {gaps['compile + autocast']:.1e} | "
                f"{gaps['perturbed']:.1e} | "
                f"{gap(runs['compile + autocast, again'][0], runs['compile + autocast'][0]):.1e} |",
                flush=True,
            )
            curves[(kind, str(dtype)[6:])] = runs
    print()
    print("Loss curves (every 25 steps): eager autocast + GradScaler / graphamp backend")
    print()
    for (kind, dtype), runs in curves.items():
        ours, reference = runs["graphamp backend"][0], runs["eager autocast"][0]
        points = range(0, args.steps, 25)
        pairs = ", ".join(f"{reference[i]:.4f}/{ours[i]:.4f}" for i in points)
        print(f"- {kind} {dtype}: {pairs}")
