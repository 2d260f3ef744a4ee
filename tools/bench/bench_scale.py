"""Converting a language model larger than memory: peak memory, time, and disk throughput.

Generates on disk, one weight at a time, a LLaMA-shaped decoder with random float32 weights as
external data (``tools/bench/decoder_onnx.py``), then times, each in a fresh child process whose
peak resident memory is measured (``wait4``):

* a plain copy of the data file (``cp``; ``--no-copy`` leaves it out where the disk has no
  room for a second input), and the time to read the input's data file (``cat > /dev/null``)
  plus the time to write a file the size of the output's (``dd``);
* ``graphamp convert IN -o OUT --keep-io-types`` (as a user runs it);
* with ``--compare``, onnxconverter-common's and onnxruntime's float16 converters
  (``keep_io_types=True``, load with external data, convert, save with external data).

Before every timed step the input's pages are dropped from the page cache
(``posix_fadvise(DONTNEED)``, no root needed) and everything written before is synced, so each
step reads the input from the disk as a first conversion would. The generated files are deleted
at the end (``--keep`` keeps them).

    python tools/bench/bench_scale.py --params 7b                     # 5.9e9 parameters, 22 GiB
    python tools/bench/bench_scale.py --params 1b --layers 16 --compare   # 3 GB, three tools
    python tools/bench/bench_scale.py --params tiny                   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
from benchlib import run_child
from decoder_onnx import PRESETS, DecoderConfig, with_overrides, write_decoder

TOOLS = ("graphamp", "onnxconverter-common", "ort-float16")
GiB = 1 << 30


def drop_cache(*paths: Path) -> None:
    """Flush and evict ``paths`` from the page cache, so the next read comes from the disk."""
    os.sync()
    for path in paths:
        if path.exists():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def data_of(model: Path) -> Path:
    return model.with_name(model.name + ".data")


def remove(model: Path) -> None:
    for path in (model, data_of(model)):
        path.unlink(missing_ok=True)


def graphamp_command(model: Path, out: Path) -> list[str]:
    convert = ["convert", str(model), "-o", str(out), "--keep-io-types"]
    return [sys.executable, "-m", "graphamp.cli", *convert]


def tool_command(tool: str, model: Path, out: Path) -> list[str]:
    if tool == "graphamp":
        return graphamp_command(model, out)
    return [sys.executable, __file__, "--run-tool", tool, str(model), str(out)]


def run_tool(tool: str, model: Path, out: Path) -> None:
    """One competing converter, as its users run it on a model with external data."""
    import onnx

    proto = onnx.load(str(model))  # with its external data: these tools work in memory
    # ONNX shape inference refuses a proto over 2 GB: the tools must be told to skip it.
    big = sum(len(t.raw_data) for t in proto.graph.initializer) > 2_000_000_000
    if tool == "onnxconverter-common":
        from onnxconverter_common import float16

        converted = float16.convert_float_to_float16(
            proto, keep_io_types=True, disable_shape_infer=big
        )
    else:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        converted = convert_float_to_float16(proto, keep_io_types=True, disable_shape_infer=big)
    onnx.save_model(
        converted,
        str(out),
        save_as_external_data=True,
        location=data_of(out).name,
        size_threshold=1024,
    )


def spot_check(model: Path, out: Path, names: list[str]) -> int:
    """Compare a few converted weights with numpy's rounding of the input's; mismatches."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    def stored(path: Path, name: str) -> np.ndarray:
        proto = onnx.load(str(path), load_external_data=False)
        tensor = next(t for t in proto.graph.initializer if t.name == name)
        assert uses_external_data(tensor)
        info = {e.key: e.value for e in tensor.external_data}
        dtype = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}[
            tensor.data_type
        ]
        return np.memmap(path.parent / info["location"], dtype, "r", int(info.get("offset", 0)))[
            : int(np.prod(tensor.dims))
        ]

    bad = 0
    for name in names:
        expected = np.asarray(stored(model, name)).astype(np.float16)
        bad += int(np.count_nonzero(expected.view(np.uint16) != stored(out, name).view(np.uint16)))
    return bad


def check_room(folder: Path, config: DecoderConfig) -> None:
    data = config.data_bytes()
    needed = 2 * data + GiB  # the input, then its copy or an output (one at a time), a margin
    free = shutil.disk_usage(folder).free
    print(
        f"... {config.parameters() / 1e9:.2f}e9 parameters: {data / GiB:.1f} GiB of float32; "
        f"needs {needed / GiB:.1f} GiB free in {folder} (input, then its copy or one output at "
        f"a time); {free / GiB:.1f} GiB free",
        file=sys.stderr,
    )
    if needed > free:
        raise SystemExit(f"not enough room in {folder}: {needed / GiB:.1f} GiB needed")


def bench(args: argparse.Namespace) -> dict[str, object]:
    config = with_overrides(PRESETS[args.params], layers=args.layers, kv_heads=args.kv_heads)
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    model, out, copy = folder / "decoder.onnx", folder / "decoder.fp16.onnx", folder / "copy.bin"
    reuse = args.reuse and data_of(model).is_file()
    if reuse and data_of(model).stat().st_size != config.data_bytes():
        raise SystemExit(f"{model} is not a model of these settings: leave out --reuse")
    if not reuse:
        check_room(folder, config)
    result: dict[str, object] = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "params": args.params,
        "config": config.__dict__,
        "parameters": config.parameters(),
        "data_bytes": config.data_bytes(),
        "load_before": os.getloadavg(),
    }
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        if not reuse:
            start = time.perf_counter()
            write_decoder(model, config)
            result["generate_s"] = time.perf_counter() - start
            print(f"... generated in {result['generate_s']:.1f} s", file=sys.stderr)
        for repeat in range(args.repeats):
            rounds.append(one_round(args, model, out, copy, result, first=repeat == 0))
            print(f"... round {repeat + 1} done", file=sys.stderr)
    finally:
        if not args.keep:
            remove(model)
        remove(out)
        copy.unlink(missing_ok=True)
    result["rounds"] = rounds
    result["load_after"] = os.getloadavg()
    return result


def one_round(
    args: argparse.Namespace,
    model: Path,
    out: Path,
    copy: Path,
    result: dict[str, object],
    first: bool,
) -> dict[str, dict[str, float]]:
    """Every step once, each from a cold cache: the disk's speed drifts (it is shared), so
    the steps are compared within a round."""
    data = data_of(model)
    steps: dict[str, dict[str, float]] = {}

    def step(name: str, command: list[str]) -> None:
        drop_cache(data)
        steps[name] = run_child(command)
        print(
            f"    {name}: {steps[name]['seconds']:.1f} s, "
            f"{steps[name]['peak_rss'] / 2**20:.0f} MiB",
            file=sys.stderr,
        )

    step("read input (cat)", ["cat", str(data)])
    step("read input (O_DIRECT)", ["dd", f"if={data}", "of=/dev/null", "bs=16M", "iflag=direct"])
    for tool in TOOLS if args.compare else TOOLS[:1]:
        step(tool, tool_command(tool, model, out))
        steps[tool]["out_bytes"] = data_of(out).stat().st_size + out.stat().st_size
        if tool == "graphamp" and first:
            result["spot_check_mismatches"] = spot_check(model, out, ["layers.0.q_proj", "lm_head"])
        remove(out)
    blocks = math.ceil(steps["graphamp"]["out_bytes"] / (16 << 20))
    write = ["dd", "if=/dev/zero", f"of={copy}", "bs=16M", f"count={blocks}", "oflag=direct"]
    step("write output (O_DIRECT)", write)
    copy.unlink()
    if not args.no_copy:
        step("plain copy (cp)", ["cp", "--reflink=never", str(data), str(copy)])
        copy.unlink()
    return steps


def markdown(result: dict[str, object]) -> str:
    """Median time and largest peak memory of each step over the rounds; the ratios are
    medians of each round's ratio."""
    rounds: list[dict[str, dict[str, float]]] = result["rounds"]  # type: ignore[assignment]
    data = int(result["data_bytes"])

    def disk(steps: dict[str, dict[str, float]]) -> float:
        """The fastest read of the input plus a write of the output, at the disk's speed."""
        read = min(steps["read input (cat)"]["seconds"], steps["read input (O_DIRECT)"]["seconds"])
        return read + steps["write output (O_DIRECT)"]["seconds"]

    lines = [
        "| step | time s | peak RSS MiB | GB/s of input | vs plain copy | vs read + write |",
        "|---|---|---|---|---|---|",
    ]
    for name in rounds[0]:
        seconds = statistics.median(r[name]["seconds"] for r in rounds)
        rss = max(r[name]["peak_rss"] for r in rounds)
        copied = [
            r["plain copy (cp)"]["seconds"] / r[name]["seconds"]
            for r in rounds
            if r.get("plain copy (cp)")
        ]
        speed = f"{statistics.median(copied):.2f}x" if copied else "-"
        bound = (
            f"{statistics.median(r[name]['seconds'] / disk(r) for r in rounds):.2f}x"
            if name in TOOLS
            else "-"
        )
        lines.append(
            f"| {name} | {seconds:.1f} | {rss / 2**20:.0f} | {data / seconds / 1e9:.2f} | "
            f"{speed} | {bound} |"
        )
    return "\n".join(lines)


def machine() -> str:
    try:
        from benchlib import machine as describe

        return describe()
    except Exception:  # benchlib needs onnxruntime; the figures do not
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the preset's)")
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: the preset's)")
    parser.add_argument("--dir", default="bench-out/scale", help="where the files go")
    parser.add_argument("--compare", action="store_true", help="also time the other tools")
    parser.add_argument("--repeats", type=int, default=1, help="rounds (medians are reported)")
    parser.add_argument("--keep", action="store_true", help="keep the generated model")
    parser.add_argument(
        "--reuse", action="store_true", help="use the model a --keep run left in --dir"
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--no-copy",
        action="store_true",
        help="leave out the plain copy (for a disk without room for a second input)",
    )
    parser.add_argument(
        "--run-tool", nargs=3, metavar=("TOOL", "IN", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.run_tool:
        tool, model, out = args.run_tool
        run_tool(tool, Path(model), Path(out))
        return 0
    result = bench(args)
    print(f"{result['machine']}; {result['date']}; load average before {result['load_before']}")
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
