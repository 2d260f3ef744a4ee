"""Figures for control-flow bodies: Optimum's seq2seq exports converted as folders.

    python tools/bench/bench_optimum.py [--models t5,bart] [--out bench-out/optimum]
    python tools/bench/bench_control_flow.py --only optimum     # the same, as a section there

For each model (T5 and BART, built from small configs with random weights, trained a few
seconds on a counting task: tools/bench/optimum_models.py), exported by Optimum with its cache
(encoder, decoder, decoder with past, merged decoder), then converted by
``graphamp convert DIR -o OUTDIR`` (and once more with ``--no-fuse``):

* every MatMul/Gemm of every file, and how many compute in float16 (the merged decoder's
  inside its If included);
* the Casts of the merged decoder against those of decoder_model + decoder_with_past_model;
* max error relative to max |y| of each decoder's outputs against its float32 file, under the
  faithful evaluator (graphamp's float16 emulation on onnxruntime's CPU provider), on inputs
  the float32 encoder and decoder produce: the merged decoder's no-cache branch against
  decoder_model, its cache branch against decoder_with_past_model (target: ratio <= 1.25);
* ORTModelForSeq2SeqLM (use_cache=True) greedy-generating 16 tokens for 4 prompts on the
  float32 folder and on the converted folder's faithful copy, with the merged decoder and
  with decoder_model + decoder_with_past_model, and the float32 run's smallest margins.

Optimum runs in its own environment (tools/optimum_env.sh). The markdown goes to stdout and
to OUT/optimum.md, every figure to OUT/optimum.json. The only timing is graphamp's conversion
of each folder (informational).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "bench")]

from benchlib import machine  # noqa: E402

from graphamp.cli import main as graphamp  # noqa: E402
from graphamp.dialects.registry import for_file  # noqa: E402
from graphamp.numerics import verify  # noqa: E402
from tests.optimum_exports import (  # noqa: E402
    SEQ2SEQ_FILES,
    casts,
    emulated_folder,
    export,
    generate,
    matrix_ops,
    optimum_python,
)

F16 = onnx.TensorProto.FLOAT16
BATCH, PROMPT, DECODED = 4, 8, 4  # prompts, their length, decoder tokens before the cached step


def optimum_figures(kind: str, work: Path, python: Path) -> dict:
    """The figures of the module docstring for one seq2seq ``kind``."""
    folder = export(python, kind, work / f"{kind}-onnx")
    figures: dict = {"model": kind}
    for variant, flags in (("default", []), ("--no-fuse", ["--no-fuse"])):
        out = work / f"{kind}-fp16{flags[0] if flags else ''}"
        start = time.perf_counter()
        status = graphamp(["convert", str(folder), "-o", str(out), *flags])
        if status != 0:
            raise SystemExit(f"graphamp convert {folder} {' '.join(flags)}: exit {status}")
        figures[variant] = {
            "seconds": round(time.perf_counter() - start, 2),
            "matrix_ops": _matrix_ops(out),
            "casts": {name: casts(out / name) for name in SEQ2SEQ_FILES},
            "casts_float32": {name: casts(folder / name) for name in SEQ2SEQ_FILES},
            "errors": decoder_errors(folder, out),
        }
    out = work / f"{kind}-fp16"
    faithful = emulated_folder(out, work / f"{kind}-fp16-emulated")
    runs = generate(python, folder, f"{folder}#unmerged", faithful, f"{faithful}#unmerged")
    figures["generation"] = {
        "float32_merged": runs[0],
        "float32_unmerged": runs[1],
        "float16_merged_same_tokens": runs[2]["tokens"] == runs[0]["tokens"],
        "float16_unmerged_same_tokens": runs[3]["tokens"] == runs[1]["tokens"],
        "float16_merged": runs[2]["tokens"],
        "float16_unmerged": runs[3]["tokens"],
    }
    return figures


def _matrix_ops(out: Path) -> dict[str, list[int]]:
    """File -> [MatMul/Gemm in float16, MatMul/Gemm in all], every graph of the file."""
    found = {}
    for name in SEQ2SEQ_FILES:
        ops = matrix_ops(out / name)
        found[name] = [sum(dtype == F16 for _, _, dtype in ops), len(ops)]
    return found


def decoder_errors(folder: Path, out: Path) -> dict[str, dict[str, float]]:
    """Max relative error (logits, and the worst output) of each converted decoder against its
    float32 file, faithful evaluator, on inputs the float32 models produce."""
    no_cache, with_cache = decoder_feeds(folder)
    # the merged decoder's first step reads an empty past (what Optimum feeds it), shaped as
    # the past the cached step reads
    empty = {
        name: np.zeros_like(with_cache[name][:, :, :0])
        for name in _inputs(folder / "decoder_model_merged.onnx")
        if name.startswith("past_key_values")
    }
    cases = {
        "decoder_model": ("decoder_model.onnx", no_cache),
        "merged, no cache": (
            "decoder_model_merged.onnx",
            {**no_cache, **empty, "use_cache_branch": np.array([False])},
        ),
        "decoder_with_past_model": ("decoder_with_past_model.onnx", with_cache),
        "merged, cache": (
            "decoder_model_merged.onnx",
            {**with_cache, "use_cache_branch": np.array([True])},
        ),
    }
    errors = {}
    for case, (name, feeds) in cases.items():
        dialect = for_file(folder / name)
        report = verify.verify(
            folder / name, out / name, _only(feeds, folder / name), rtol=1.0, dialect=dialect
        )
        by_name = {o.name: o.max_rel_error for o in report.outputs}
        errors[case] = {"logits": by_name["logits"], "worst": max(by_name.values())}
    return errors


def decoder_feeds(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inputs of decoder_model and of decoder_with_past_model as generation makes them: the
    float32 encoder's states for prompts of the learnt task, DECODED teacher-forced tokens,
    then one cached step with the float32 decoder's present key/values as its past."""
    config = json.loads((folder / "config.json").read_text())
    rng = np.random.default_rng(0)
    starts = rng.integers(4, config["vocab_size"], BATCH)
    prompts = np.repeat(starts[:, None], PROMPT, axis=1).astype(np.int64)
    mask = np.ones_like(prompts)
    encoder = _session(folder / "encoder_model.onnx")
    (states,) = encoder.run(None, {"input_ids": prompts, "attention_mask": mask})
    counted = 4 + (starts[:, None] - 4 + np.arange(1, DECODED)) % (config["vocab_size"] - 4)
    start = np.full((BATCH, 1), config["decoder_start_token_id"], np.int64)
    tokens = np.concatenate([start, counted], axis=1).astype(np.int64)
    no_cache = {
        "input_ids": tokens,
        "encoder_hidden_states": states,
        "encoder_attention_mask": mask,
    }
    decoder = _session(folder / "decoder_model.onnx")
    names = [o.name for o in decoder.get_outputs()]
    ran = decoder.run(None, _only(no_cache, folder / "decoder_model.onnx"))
    outputs = dict(zip(names, ran, strict=True))
    with_cache = {
        "input_ids": outputs["logits"][:, -1:].argmax(-1).astype(np.int64),
        "encoder_attention_mask": mask,
        "encoder_hidden_states": states,
    }
    for name, value in outputs.items():
        if name.startswith("present."):
            with_cache[name.replace("present.", "past_key_values.")] = value
    return no_cache, with_cache


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _inputs(path: Path) -> dict[str, list[int | None]]:
    proto = onnx.load(str(path), load_external_data=False)
    return {
        value.name: [d.dim_value or None for d in value.type.tensor_type.shape.dim]
        for value in proto.graph.input
    }


def _only(feeds: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """The feeds the model at ``path`` takes."""
    return {name: feeds[name] for name in _inputs(path)}


def markdown(results: list[dict]) -> str:
    lines = [
        "| model | flags | MatMul/Gemm in float16 (enc, dec, dec+past, merged) | Casts merged "
        "/ dec + dec+past (float32 export) | max rel error of logits: dec / merged no-cache "
        "(ratio) | dec+past / merged cache (ratio) | convert s |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for variant in ("default", "--no-fuse"):
            figures = result[variant]
            ops = ", ".join(f"{low}/{every}" for low, every in figures["matrix_ops"].values())
            c, c32 = figures["casts"], figures["casts_float32"]
            pair = c["decoder_model.onnx"] + c["decoder_with_past_model.onnx"]
            pair32 = c32["decoder_model.onnx"] + c32["decoder_with_past_model.onnx"]
            e = figures["errors"]
            lines.append(
                f"| {result['model']} | {variant} | {ops} | "
                f"{c['decoder_model_merged.onnx']} / {pair} "
                f"({c32['decoder_model_merged.onnx']} / {pair32}) | "
                f"{_ratio(e['decoder_model'], e['merged, no cache'])} | "
                f"{_ratio(e['decoder_with_past_model'], e['merged, cache'])} | "
                f"{figures['seconds']} |"
            )
    lines += [
        "",
        "| model | decoders | same 16 tokens x 4 prompts as float32 | float32 min margin "
        "(relative) |",
        "|---|---|---|---|",
    ]
    for result in results:
        g = result["generation"]
        for mode in ("merged", "unmerged"):
            run = g[f"float32_{mode}"]
            lines.append(
                f"| {result['model']} | {mode} | {g[f'float16_{mode}_same_tokens']} | "
                f"{run['min_margin']:.3g} ({run['min_relative_margin']:.3g}) |"
            )
    return "\n".join(lines) + "\n"


def _ratio(unmerged: dict[str, float], merged: dict[str, float]) -> str:
    ratio = merged["logits"] / unmerged["logits"] if unmerged["logits"] else float("inf")
    return f"{unmerged['logits']:.3g} / {merged['logits']:.3g} ({ratio:.2f}x)"


def section(models: str = "t5,bart", out: Path = ROOT / "bench-out" / "optimum") -> str:
    """Every figure for ``models``, as markdown (also written to ``out``)."""
    python = optimum_python()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-optimum-") as tmp:
        for kind in models.split(","):
            results.append(optimum_figures(kind.strip(), Path(tmp), python))
    out.mkdir(parents=True, exist_ok=True)
    (out / "optimum.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (out / "optimum.md").write_text(table)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="t5,bart", help="comma-separated: t5, bart")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "optimum")
    args = parser.parse_args()
    print(machine())
    print(f"date: {date.today()}")
    print(section(args.models, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
