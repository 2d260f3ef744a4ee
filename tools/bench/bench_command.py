"""Whole ``graphamp`` commands as users run them, against the floor of reading and writing the
model, in one run: wall time and peak memory of each process.

    python tools/bench/bench_command.py                        # zoo BERT and GPT (full size), FX
    BERT python tools/bench/bench_command.py --section onnx --models bert --runs 5
    python tools/bench/bench_command.py --section fx --json fx.json

ONNX: each model is exported once into ``--dir`` (``graphamp.models.export_onnx(name, path,
"full")``: weights inside the file, as every model under 2 GB keeps them). Then one warm-up
round and ``--runs`` timed rounds; a round runs every command once, in turn, each a fresh
process whose wall time and peak resident memory (GNU time's ``%M``, the kernel's high-water
mark) are recorded:

* floor: ``python -c "import onnx; onnx.save(onnx.load(IN), OUT)"``: Python, onnx, and reading
  and writing the file, nothing else;
* ``graphamp convert IN -o OUT`` (the runtime check on, as by default), and the same with
  ``--no-runtime-check``, with ``--plan PLAN`` and with ``--verify``;
* with ``--compare``: onnxruntime's float16 converter and onnxconverter-common's (load, convert
  with ``keep_io_types=True``, save);
* ``graphamp --help`` and ``graphamp convert --help``.

Times are medians over the rounds; a ratio is the median of each round's ratio (to the floor of
the same round, which shares its load). The runtime check's cost is the median of each round's
``convert`` less ``convert --no-runtime-check``. Peak memory is the largest over the rounds,
also given against the input's plus the output's size.

FX: Hugging Face BERT-base (``transformers.BertConfig()``'s defaults, random weights, one
sequence of 128 tokens) in one process: ``torch.export.export`` alone, and
``graphamp.fx.convert`` (which captures with it), each by default and with the other's shapes
(convert makes the batch dimension dynamic by default, export nothing), one warm-up each, then
``--runs`` rounds taking turns; medians and the ratios.

The machine (``lscpu`` model and flags) and the load average are printed with the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import machine, run_child

ROOT = Path(__file__).resolve().parents[2]
FLOOR = "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"
TOOL = """
import sys, onnx
source, target, tool = sys.argv[1:]
model = onnx.load(source)
if tool == "onnxconverter-common":
    from onnxconverter_common import float16
    converted = float16.convert_float_to_float16(model, keep_io_types=True)
else:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    converted = convert_float_to_float16(model, keep_io_types=True)
onnx.save(converted, target)
"""


def graphamp() -> list[str]:
    """The ``graphamp`` command of this environment (its console script, as users run it)."""
    script = Path(sys.executable).parent / "graphamp"
    return [str(script)] if script.exists() else [sys.executable, "-m", "graphamp.cli"]


def onnx_commands(source: Path, folder: Path, compare: bool) -> dict[str, tuple[list[str], Path]]:
    """Each timed command of the ONNX section and the model file it writes."""
    stem = source.stem
    out = folder / f"{stem}.out.onnx"
    convert = [*graphamp(), "convert", str(source), "-o", str(out)]
    commands = {
        "floor (onnx load + save)": (
            [sys.executable, "-c", FLOOR, str(source), str(folder / f"{stem}.floor.onnx")],
            folder / f"{stem}.floor.onnx",
        ),
        "graphamp convert": (convert, out),
        "convert --no-runtime-check": ([*convert, "--no-runtime-check"], out),
        "convert --plan": ([*convert, "--plan", str(folder / f"{stem}.plan.json")], out),
        "convert --verify": ([*convert, "--verify"], out),
    }
    if compare:
        for tool in ("onnxruntime float16", "onnxconverter-common"):
            target = folder / f"{stem}.{tool.split()[0]}.onnx"
            commands[tool] = ([sys.executable, "-c", TOOL, str(source), str(target), tool], target)
    commands["graphamp --help"] = ([*graphamp(), "--help"], source)
    commands["graphamp convert --help"] = ([*graphamp(), "convert", "--help"], source)
    return commands


def bench_onnx(name: str, args: argparse.Namespace) -> dict[str, object]:
    from graphamp.models import export_onnx

    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.onnx"
    if not source.exists():
        print(f"... exporting {name} (full size)", file=sys.stderr)
        export_onnx(name, source, "full")
    commands = onnx_commands(source, folder, args.compare)
    rounds: list[dict[str, dict[str, float]]] = []
    for index in range(args.runs + 1):  # round 0 is the warm-up
        steps = {label: run_child(command) for label, (command, _) in commands.items()}
        if index:
            rounds.append(steps)
        print(f"... {name}: round {index} done (0 is the warm-up)", file=sys.stderr)
    sizes = {label: out.stat().st_size for label, (_, out) in commands.items()}
    return {"model": name, "input_bytes": source.stat().st_size, "sizes": sizes, "rounds": rounds}


def onnx_table(result: dict[str, object]) -> str:
    rounds: list[dict[str, dict[str, float]]] = result["rounds"]  # type: ignore[assignment]
    sizes: dict[str, int] = result["sizes"]  # type: ignore[assignment]
    source = int(result["input_bytes"])
    floor = "floor (onnx load + save)"
    lines = [
        f"{result['model']} ({source / 2**20:.0f} MiB, weights in the file); medians of "
        f"{len(rounds)} rounds after a warm-up",
        "",
        "| command | time s | vs floor | CPU s | CPU vs floor | peak RSS MiB | peak / (in + out) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in rounds[0]:
        seconds = statistics.median(r[label]["seconds"] for r in rounds)
        ratio = statistics.median(r[label]["seconds"] / r[floor]["seconds"] for r in rounds)
        cpu = statistics.median(r[label]["cpu"] for r in rounds)
        cpu_ratio = statistics.median(r[label]["cpu"] / r[floor]["cpu"] for r in rounds)
        peak = max(r[label]["peak_rss"] for r in rounds)
        help_only = label.endswith("--help")
        share = "-" if help_only else f"{peak / (source + sizes[label]):.2f}"
        versus = "-" if label == floor else f"{ratio:.2f}x"
        cpu_versus = "-" if label == floor else f"{cpu_ratio:.2f}x"
        lines.append(
            f"| {label} | {seconds:.2f} | {versus} | {cpu:.2f} | {cpu_versus} "
            f"| {peak / 2**20:.0f} | {share} |"
        )
    lines.append("")
    for measure, unit in (("seconds", "wall"), ("cpu", "CPU")):
        check = [
            r["graphamp convert"][measure] - r["convert --no-runtime-check"][measure]
            for r in rounds
        ]
        share = statistics.median(
            c / r["graphamp convert"][measure] for c, r in zip(check, rounds, strict=True)
        )
        lines.append(
            f"runtime check ({unit}): {statistics.median(check):.2f} s, {share:.0%} of the "
            f"command (each round: {' '.join(f'{c:.2f}' for c in check)})"
        )
    return "\n".join(lines)


def bench_fx(args: argparse.Namespace) -> dict[str, object]:
    import warnings

    import torch
    import transformers
    from torch.export import Dim

    import graphamp.fx as gfx

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).eval()
    ids = torch.randint(1, 30000, (1, 128), generator=torch.Generator().manual_seed(0))
    # graphamp.fx.convert's default makes the batch dimension dynamic (Dim.AUTO) where the
    # model allows it; torch.export's makes nothing dynamic: each is timed both ways.
    batch = {"input_ids": {0: Dim.AUTO}}
    calls = {
        "torch.export.export": lambda: torch.export.export(model, (ids,)),
        "torch.export.export, batch Dim.AUTO": lambda: torch.export.export(
            model, (ids,), dynamic_shapes=batch
        ),
        "graphamp.fx.convert": lambda: gfx.convert(model, (ids,), device="cpu"),
        "graphamp.fx.convert, dynamic_shapes='static'": lambda: gfx.convert(
            model, (ids,), device="cpu", dynamic_shapes="static"
        ),
    }
    times: dict[str, list[float]] = {label: [] for label in calls}
    cpu: dict[str, list[float]] = {label: [] for label in calls}
    for call in calls.values():  # warm-up: imports, caches
        call()
    for _ in range(args.runs):
        for label, call in calls.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            times[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    return {"times": times, "cpu": cpu}


def fx_table(result: dict[str, object]) -> str:
    times: dict[str, list[float]] = result["times"]  # type: ignore[assignment]
    cpu: dict[str, list[float]] = result["cpu"]  # type: ignore[assignment]
    labels = list(times)
    lines = [
        f"HF BERT-base (random weights), 1 x 128 tokens; medians of "
        f"{len(times[labels[0]])} rounds after a warm-up",
        "",
        "| call | time s | each round | CPU s |",
        "|---|---|---|---|",
    ]
    for label, values in times.items():
        spread = " ".join(f"{v:.2f}" for v in values)
        lines.append(
            f"| {label} | {statistics.median(values):.2f} | {spread} "
            f"| {statistics.median(cpu[label]):.2f} |"
        )

    def ratio(measure: dict[str, list[float]], convert: str, export: str) -> float:
        pairs = zip(measure[convert], measure[export], strict=True)
        return statistics.median(c / e for c, e in pairs)

    for measure, unit in ((times, "wall"), (cpu, "CPU")):
        lines += [
            "",
            f"convert / export ({unit}): {ratio(measure, labels[2], labels[0]):.2f}x (both by "
            f"default), {ratio(measure, labels[2], labels[1]):.2f}x (both with a dynamic batch), "
            f"{ratio(measure, labels[3], labels[0]):.2f}x (both static); medians of each "
            "round's ratio",
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", choices=("onnx", "fx", "both"), default="both")
    parser.add_argument("--models", default="bert,gpt", help="zoo models (full size)")
    parser.add_argument("--runs", type=int, default=5, help="timed rounds after the warm-up")
    parser.add_argument("--dir", default=str(ROOT / "bench-out" / "command"), help="work folder")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also time the float16 converters of onnxruntime and onnxconverter-common",
    )
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    results: dict[str, object] = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "load_before": os.getloadavg(),
    }
    tables = []
    if args.section in ("onnx", "both"):
        onnx_results = [bench_onnx(name, args) for name in args.models.split(",")]
        results["onnx"] = onnx_results
        tables += [onnx_table(result) for result in onnx_results]
    if args.section in ("fx", "both"):
        results["fx"] = bench_fx(args)
        tables.append(fx_table(results["fx"]))  # type: ignore[arg-type]
    results["load_after"] = os.getloadavg()
    print(f"{results['machine']}; {results['date']}")
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    for table in tables:
        print()
        print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
