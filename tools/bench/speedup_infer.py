"""Inference for ``tools/bench/bench_speedup.py``: the module ``graphamp.fx.convert`` makes
(bfloat16, dynamic batch, ``weights="low"``: the weights only low-type ops read stored in
bfloat16, as a model converted for serving keeps them, where the default float32 masters are
cast at every call as autocast casts them) against float32 and ``torch.autocast``, each eager
and under ``torch.compile``, at several batches; error against float32 eager.

Models: ResNet-50 (the zoo's ResNet at full size, 224x224) and Hugging Face BERT-base
(``transformers.BertModel`` with ``BertConfig``'s defaults, sequence 128: its last hidden
state); ``tiny`` twins check the code runs. Each batch's configurations run in turn for
``rounds`` rounds of ``runs`` calls (interleaved, as the training part); the figure is the
median call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

CONFIGS = (
    "float32",
    "float32, compiled",
    "autocast",
    "compile + autocast",
    "graphamp",
    "graphamp, compiled",
)
ROUNDS = 3
SEQ = 128


def build(name: str, scale: str) -> tuple[nn.Module, Callable[[int], dict[str, torch.Tensor]]]:
    """The float32 model in eval mode and a maker of its inputs at a batch size."""
    torch.manual_seed(0)
    if name == "resnet50":
        from graphamp.models.resnet import ResNet

        full = scale != "tiny"
        model = ResNet((3, 4, 6, 3), 64, 1000) if full else ResNet((1, 1, 1, 1), 8, 10)
        side = 224 if full else 32
        return model.eval(), lambda b: {"x": torch.randn(b, 3, side, side)}
    import transformers

    config = transformers.BertConfig()
    if scale == "tiny":
        config = transformers.BertConfig(
            vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128,
        )  # fmt: skip
    model = transformers.BertModel(config, add_pooling_layer=False)
    seq = SEQ if scale != "tiny" else 16
    generator = torch.Generator().manual_seed(1)
    return model.eval(), lambda b: {
        "input_ids": torch.randint(1, config.vocab_size, (b, seq), generator=generator)
    }


def main_output(output: Any) -> torch.Tensor:
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    return output[0] if isinstance(output, tuple | list) else output


def runners(
    model: nn.Module, converted: nn.Module, compiled: bool
) -> dict[str, Callable[[dict[str, torch.Tensor]], torch.Tensor]]:
    """A call per configuration (``compiled``: the torch.compile ones too): inputs -> the
    main output, without autograd."""

    def call(module: Any, autocast: bool) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
        def run(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                return main_output(module(**inputs))

        return run

    calls = {
        "float32": call(model, False),
        "autocast": call(model, True),
        "graphamp": call(converted, False),
    }
    if compiled:
        compiled_model = torch.compile(model)
        calls["float32, compiled"] = call(compiled_model, False)
        calls["compile + autocast"] = call(compiled_model, True)
        calls["graphamp, compiled"] = call(torch.compile(converted), False)
    return calls


def error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |y - y32| / max |y32|."""
    return float((value.float() - reference).abs().max() / reference.abs().max())


def run(
    models: list[str], scale: str, batches: list[int], runs: int, warmup: int, compiled: bool
) -> tuple[str, dict]:
    import graphamp.fx as gfx

    lines = [
        "| model | batch | configuration | median ms | vs float32 | vs float32 compiled "
        "| vs autocast (eager or compiled alike) | error vs float32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    bars = ["| model | batch | bar | figure | target | met |", "|---|---|---|---|---|---|"]
    results: dict = {}
    for name in models:
        model, make = build(name, scale)
        example = make(max(2, min(batches)))  # a batch of 1 would fix the batch size
        converted, _ = gfx.convert(model, example_kwargs=example, dtype="bfloat16", weights="low")
        calls = runners(model, converted, compiled)
        results[name] = {}
        for batch in batches:
            inputs = make(batch)
            reference = calls["float32"](inputs).float()
            errors = {key: error(call(inputs), reference) for key, call in calls.items()}
            for call in calls.values():  # compiles for this batch, then warms up
                for _ in range(warmup):
                    call(inputs)
            times: dict[str, list[float]] = {key: [] for key in calls}
            for _ in range(ROUNDS):
                for key, call in calls.items():
                    for _ in range(runs):
                        start = time.perf_counter()
                        call(inputs)
                        times[key].append(time.perf_counter() - start)
            medians = {key: statistics.median(t) for key, t in times.items()}
            for key, seconds in medians.items():
                autocast = "compile + autocast" if "compiled" in key else "autocast"
                versus_autocast = (
                    f"{medians[autocast] / seconds:.2f}x" if key.startswith("graphamp") else ""
                )
                floor = medians.get("float32, compiled")
                lines.append(
                    f"| {name} | {batch} | {key} | {seconds * 1e3:.2f} | "
                    f"{medians['float32'] / seconds:.2f}x | "
                    f"{f'{floor / seconds:.2f}x' if floor else '-'} | {versus_autocast} | "
                    f"{errors[key]:.2e} |"
                )
            bars += [f"| {name} | {batch} | {row} |" for row in infer_bars(batch, medians, errors)]
            results[name][batch] = {"seconds": times, "errors": errors}
    return "\n".join(lines) + "\n\n" + "\n".join(bars), results


def infer_bars(batch: int, medians: dict[str, float], errors: dict[str, float]) -> list[str]:
    """The issue's inference bars at one batch: at least 1.5x float32 from batch 8 up, at
    least 1.0x autocast, the error equal to autocast's (to two significant digits)."""
    rows = []
    for ours, floor, theirs in (
        ("graphamp", "float32", "autocast"),
        ("graphamp, compiled", "float32, compiled", "compile + autocast"),
    ):
        if ours not in medians:
            continue
        checks = [(f"{ours} vs {theirs}", medians[theirs] / medians[ours], 1.0)]
        if batch >= 8:
            checks.insert(0, (f"{ours} vs {floor}", medians[floor] / medians[ours], 1.5))
        for text, figure, target in checks:
            met = "met" if figure >= target else "NOT met"
            rows.append(f"{text} | {figure:.2f}x | {target:.2f}x | {met}")
        same = f"{errors[ours]:.1e}" == f"{errors[theirs]:.1e}"
        rows.append(
            f"{ours} error vs {theirs}'s | {errors[ours]:.2e} | {errors[theirs]:.2e} | "
            + ("met" if same or errors[ours] <= errors[theirs] else "NOT met")
        )
    return rows
