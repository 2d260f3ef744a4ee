"""Fuzz the engine with seeded random graphs and random policies, and the command line with
damaged files.

Each graph (``tools/fuzz/fuzz_graphs.py``) is a random dataflow over about 75 float ONNX op
patterns at an opset from 13 to 22, the model's own Casts included, converted under a random
policy (ops moved between lists, deny_names and deny_tensors rules, keep_io_types, float16 or
bfloat16). On every graph:

* the output passes the full checker and strict type inference, and onnxruntime loads it
  wherever it loads the input (a bfloat16 model the CPU provider has no kernel for excepted);
* its outputs are finite wherever float32's are, and within tolerance of float32 under the
  faithful evaluator (every low value rounded as the low type rounds it): the error relative
  to max(|y|, 1), so an output that cancels to about zero is held to an absolute bound. Two
  kinds of graph are held to the structural properties only, and counted: those with an op
  whose output jumps where a low-precision input crosses a rounding boundary (Round, Floor,
  Sign, Hardmax, TopK's order, a trip through int32), and float16 graphs where a float32 value
  exceeds float16's range (an overflow only ranges from data can foresee, not a wiring fault);
* converting is deterministic (the same bytes twice) and a fixed point (converting the output
  again changes no byte);
* one Cast per (tensor, dtype), no Cast to the type a value already has, no Cast that graphamp
  inserted reading a Cast's output or read by one (a pair that could be one Cast).

    python tools/fuzz/fuzz.py --n 10000          # the benchmark: violations and time
    python tools/fuzz/fuzz.py --n 200 --seed 7   # a quick run
    python tools/fuzz/fuzz.py --cli --n 2000     # damaged files through the command line

``--cli`` is the command-line mutation fuzzer (``tools/fuzz/fuzz_cli.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/helpers.py's checks
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fuzz_graphs, fuzz_cli

from fuzz_graphs import DISCONTINUOUS, SHAPE, Case, random_case

import graphamp.onnx as gonnx
from graphamp.errors import GraphampError

__all__ = ["Case", "check", "check_cli", "mutated", "random_case"]
TOLERANCE = {"float16": 5e-2, "bfloat16": 2e-1}
FLOAT16_MAX = 65504.0
_F = onnx.TensorProto
LOSSLESS_WIDENING = {(_F.FLOAT16, _F.FLOAT), (_F.BFLOAT16, _F.FLOAT), (_F.FLOAT16, _F.DOUBLE),
                     (_F.BFLOAT16, _F.DOUBLE), (_F.FLOAT, _F.DOUBLE)}  # fmt: skip
# Why a graph was held to the structural properties only (counted by main()).
skipped: Counter[str] = Counter()


def check(case: Case) -> list[str]:
    """The properties of the module docstring; the violated ones, in words."""
    from tests.helpers import assert_valid

    problems = []
    policy = case.policy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            first = gonnx.convert(case.model, **policy).to_proto()  # type: ignore[arg-type]
        except GraphampError as exc:
            return [f"refused: {exc}"]
        second = gonnx.convert(case.model, **policy).to_proto()  # type: ignore[arg-type]
        if first.SerializeToString() != second.SerializeToString():
            problems.append("not deterministic")
        try:
            again = gonnx.convert(first, **policy).to_proto()  # type: ignore[arg-type]
        except GraphampError as exc:  # the output is refused as an input: a wiring fault
            again = None
            problems.append(f"output refused when converted again: {exc}")
    if again is not None and again.SerializeToString() != first.SerializeToString():
        problems.append("not a fixed point")
    try:
        assert_valid(first)
    except Exception as exc:  # the checker's and inference's errors alike
        problems.append(f"invalid: {str(exc)[:200]}")
    problems += cast_problems(case.model, first)
    problems += load_problems(case.model, first)
    if problems:
        return problems
    patterns = {node.name.split("_")[1] for node in case.model.graph.node}
    if patterns & {op.lower() for op in DISCONTINUOUS}:
        skipped["discontinuous op"] += 1
        return problems
    return accuracy_problems(case, first)


def cast_problems(original: onnx.ModelProto, converted: onnx.ModelProto) -> list[str]:
    """No more Casts per (tensor, dtype) than the model had (one where it had none); no Cast
    to the type its input has, unless the model's own Cast was such a no-op already; no Cast
    pair that could be one where graphamp made either (both inserted, or the first a lossless
    widening: a narrowing then a widening is the model's own rounding)."""
    own_casts = {n.name: n for n in original.graph.node if n.op_type == "Cast"}
    own_names = {n.name for n in original.graph.node}
    outputs = {o.name for o in original.graph.output}
    before, after = gonnx.inferred_types(original), gonnx.inferred_types(converted)
    producer = {out: node for node in converted.graph.node for out in node.output}
    problems = []
    count_before = Counter((n.input[0], _to(n)) for n in own_casts.values())
    count_after: Counter[tuple[str, int]] = Counter()
    for node in (n for n in converted.graph.node if n.op_type == "Cast"):
        # a model Cast that writes a graph output stays, even where its input's other Cast to
        # the same type gives the same value: each output needs a value of its own
        if node.output[0] not in outputs or node.name not in own_casts:
            count_after[(node.input[0], _to(node))] += 1
        was_noop = node.name in own_casts and before.get(node.input[0]) == _to(own_casts[node.name])
        if after.get(node.input[0]) == _to(node) and not was_noop:
            problems.append(f"Cast {node.name} to the type {node.input[0]!r} already has")
        source = producer.get(node.input[0])
        if source is None or source.op_type != "Cast":
            continue
        made = {node.name, source.name} - own_names
        widening = (after.get(source.input[0]), _to(source)) in LOSSLESS_WIDENING
        if made == {node.name, source.name} or (made and widening):
            problems.append(f"Cast {node.name} reads Cast {source.name}: one Cast would do")
    for key, count in count_after.items():
        if count > max(1, count_before[key]):
            problems.append(f"{count} Casts of {key[0]!r} to type {key[1]}")
    return problems


def _to(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "to")


def _session_error(proto: onnx.ModelProto) -> BaseException | None:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own error types
        return exc
    return None


def load_problems(original: onnx.ModelProto, converted: onnx.ModelProto) -> list[str]:
    """onnxruntime loads the output wherever it loads the input (a missing kernel excepted)."""
    if _session_error(original) is not None:
        return []
    error = _session_error(converted)
    if error is None or isinstance(error, ort.capi.onnxruntime_pybind11_state.NotImplemented):
        return []
    return [f"onnxruntime refuses the output: {str(error).splitlines()[0][:200]}"]


def accuracy_problems(case: Case, converted: onnx.ModelProto) -> list[str]:
    """Finite where float32 is, and within tolerance under the faithful evaluator."""
    from graphamp.onnx.numerics.runtime import run

    dtype = str(case.policy["dtype"])
    rng = np.random.default_rng(0)
    feeds = {n: (rng.random(SHAPE) + 0.5).astype(np.float32) for n in ("x0", "x1")}
    if dtype == "float16" and _largest_float32_value(case.model, feeds) > FLOAT16_MAX:
        skipped["a float32 value beyond float16's range"] += 1
        return []
    want, _ = run(case.model, feeds)
    got, _ = run(converted, feeds)
    problems = []
    for name, expected in want.items():
        expected64, actual = expected.astype(np.float64), got[name].astype(np.float64)
        finite = np.isfinite(expected64)
        if (~np.isfinite(actual) & finite).any():
            problems.append(f"{name}: non-finite where float32 is finite")
            continue
        if not finite.any():
            continue
        scale = max(np.abs(expected64[finite]).max(), 1.0)
        error = np.abs(actual[finite] - expected64[finite]).max() / scale
        if error > TOLERANCE[dtype]:
            problems.append(f"{name}: error {error:.3g} over {TOLERANCE[dtype]}")
    return problems


def _largest_float32_value(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    """The largest finite magnitude of any float32 value of ``proto`` on ``feeds``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    types = gonnx.inferred_types(proto)
    declared = {o.name for o in probe.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in declared and types.get(name) == onnx.TensorProto.FLOAT:
                probe.graph.output.add().CopyFrom(
                    onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    largest = 0.0
    for value in session.run(None, feeds):
        if isinstance(value, np.ndarray) and value.dtype == np.float32:
            finite = np.abs(value[np.isfinite(value)])
            largest = max(largest, float(finite.max()) if finite.size else 0.0)
    return largest


def mutated(seed: int) -> bytes:
    from fuzz_cli import mutated as mutate

    return mutate(seed)


def check_cli(seed: int, folder: Path) -> list[str]:
    from fuzz_cli import check_cli as check_command_line

    return check_command_line(seed, folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000, help="graphs to generate")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--cli", action="store_true", help="damaged files through the CLI")
    args = parser.parse_args(argv)
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="graphamp-fuzz-"))
    start, violations = time.perf_counter(), 0
    for seed in range(args.seed, args.seed + args.n):
        problems = check_cli(seed, folder) if args.cli else check(random_case(seed))
        if problems:
            violations += 1
            print(f"seed {seed}: {'; '.join(problems)}", flush=True)
    seconds = time.perf_counter() - start
    per_graph = seconds / args.n * 1000
    print(
        f"{violations} violations in {args.n} graphs, {seconds:.1f} s ({per_graph:.0f} ms a graph)"
    )
    for reason, count in sorted(skipped.items()):
        print(f"  {count} held to the structural properties only: {reason}")
    if args.cli:
        from fuzz_cli import accepted_invalid, outcomes

        print("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        if accepted_invalid:
            print(
                f"  converted though onnx.checker refuses the input: seeds {accepted_invalid[:20]}"
            )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
