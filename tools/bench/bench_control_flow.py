"""Figures for control flow and functions: bodies converted like inline nodes.

    python tools/bench/bench_control_flow.py                 # every section
    python tools/bench/bench_control_flow.py --only hand_built   # or node_bodies, functions,
    optimum

Sections (``SECTIONS``; another section is a function returning its markdown, added there):

* ``hand_built``: the models of ``graphamp.models.control_flow`` (an If whose branches do
  MatMul + Softmax; a Loop carrying a hidden state through MatMul + Add + Tanh for 8
  iterations; a Scan RNN; an If nested in a Loop), each converted in float16 and bfloat16,
  beside the same computation unrolled into a flat graph and converted: valid (full checker,
  onnxruntime loads it), a fixed point, MatMuls low, Casts in the model and inside loop bodies
  (those run every iteration; also with --keep-io-types, where the float32 inputs and outputs
  need Casts at the loop's edge), and the max error relative to max |y| of the float32 model's
  outputs under the faithful evaluator (graphamp's emulation, onnxruntime) and under
  ``onnx.reference`` (computes in the stored types), with its ratio to the unrolled model's
  (the bar: <= 2x).
* ``node_bodies``: ONNX's node test cases with If/Loop/Scan bodies, and ``functions``: ONNX's
  function ops rebuilt as model-local functions (``graphamp.models.onnx_cases``): how many
  convert in both dtypes to a valid fixed point within tolerance of float32 under
  ``onnx.reference`` (2e-2 float16, 8e-2 bfloat16, as the node corpus test), and how many of
  their body nodes run low.

* ``optimum``: Optimum's T5 and BART exports converted as folders (tools/bench/bench_optimum.py:
  MatMul/Gemm in float16 in every file, the merged decoder's Casts against decoder_model's and
  decoder_with_past_model's, the merged decoder's error against theirs, generation with
  ORTModelForSeq2SeqLM).

No timing here: every figure is a count or an error, the same on any machine.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from onnx.reference import ReferenceEvaluator

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "bench"))

from benchlib import machine  # noqa: E402

import graphamp.onnx as gonnx  # noqa: E402
from graphamp.core import dtypes  # noqa: E402
from graphamp.models.control_flow import CASES  # noqa: E402
from graphamp.models.onnx_cases import feeds_for, function_cases, loads  # noqa: E402
from graphamp.onnx.numerics.runtime import run as run_faithfully  # noqa: E402

DTYPES = ("float16", "bfloat16")
TOLERANCE = {"float16": 2e-2, "bfloat16": 8e-2}
_GRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def convert(proto: onnx.ModelProto, dtype: str, **policy: object) -> tuple[onnx.ModelProto, object]:
    result = gonnx.convert(proto, dtype=dtype, **policy)
    return result.to_proto(), result.plan


def checked(proto: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError:
        return False
    return True


def valid(proto: onnx.ModelProto) -> bool:
    return checked(proto) and loads(proto)


def fixed_point(converted: onnx.ModelProto, dtype: str) -> bool:
    again, _ = convert(converted, dtype)
    return again.SerializeToString() == converted.SerializeToString()


def relative(got: dict, want: dict) -> float:
    worst = 0.0
    for key, value in want.items():
        value64 = np.asarray(value, np.float64)
        got64 = np.asarray(got[key], np.float64)
        worst = max(worst, float(np.abs(got64 - value64).max() / np.abs(value64).max()))
    return worst


def reference_run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict:
    typed = {}
    for info in proto.graph.input:
        name = dtypes.from_onnx(info.type.tensor_type.elem_type)
        value = feeds[info.name]
        typed[info.name] = (
            value.astype(dtypes.numpy_type(name)) if value.dtype.kind == "f" else value
        )
    names = [o.name for o in proto.graph.output]
    return dict(zip(names, ReferenceEvaluator(proto).run(None, typed), strict=True))


def errors(
    converted: onnx.ModelProto, original: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> tuple[float, float]:
    """(faithful evaluator, onnx.reference) max error relative to max |y32|."""
    want = run_faithfully(original, feeds)[0]
    faithful = relative(run_faithfully(converted, feeds)[0], want)
    reference = relative(reference_run(converted, feeds), reference_run(original, feeds))
    return faithful, reference


def casts(proto: onnx.ModelProto) -> tuple[int, int]:
    """(Casts in the whole model, Casts inside Loop/Scan bodies: those run every iteration)."""
    total, looping = 0, 0
    pending: list[tuple[onnx.GraphProto, bool]] = [(proto.graph, False)]
    while pending:
        graph, in_loop = pending.pop()
        for node in graph.node:
            if node.op_type == "Cast":
                total += 1
                looping += in_loop
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.type == _GRAPHS[0] else attribute.graphs:
                    pending.append((sub, in_loop or node.op_type in ("Loop", "Scan")))
    return total, looping


def hand_built() -> str:
    rows = [
        "| model | dtype | valid | fixed point | MatMul low | Casts (in loop bodies) | "
        "same, --keep-io-types | error, faithful | unrolled | ratio | error, onnx.reference | "
        "unrolled | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, build in CASES.items():
        case = build()
        flats = case.unrolled if isinstance(case.unrolled, list) else [case.unrolled]
        for dtype in DTYPES:
            out, plan = convert(case.model, dtype)
            matmuls = [d for d in plan.nodes.values() if d.op == "MatMul"]  # type: ignore[attr-defined]
            low = sum(d.precision == dtype for d in matmuls)
            total, looping = casts(out)
            kept_total, kept_looping = casts(convert(case.model, dtype, keep_io_types=True)[0])
            measured = []
            for index, feeds in enumerate(case.feeds):
                flat = flats[min(index, len(flats) - 1)]
                flat_feeds = {
                    k: v for k, v in feeds.items() if k in {i.name for i in flat.graph.input}
                }
                flat_out, _ = convert(flat, dtype)
                measured.append(
                    (errors(out, case.model, feeds), errors(flat_out, flat, flat_feeds))
                )
            faithful = max(m[0][0] for m in measured)
            flat_faithful = max(m[1][0] for m in measured)
            reference = max(m[0][1] for m in measured)
            flat_reference = max(m[1][1] for m in measured)
            rows.append(
                f"| {name} | {dtype} | {_yes(valid(out))} | {_yes(fixed_point(out, dtype))} | "
                f"{low} of {len(matmuls)} | {total} ({looping}) | {kept_total} ({kept_looping}) | "
                f"{faithful:.3g} | "
                f"{flat_faithful:.3g} | {faithful / flat_faithful:.2f}x | {reference:.3g} | "
                f"{flat_reference:.3g} | {reference / flat_reference:.2f}x |"
            )
    return "\n".join(rows)


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _corpus(cases: list[tuple[str, onnx.ModelProto, object]], inline: bool) -> str:
    rows = [
        "| dtype | cases | full checker | loads where the original does | fixed point | "
        "compared | within tolerance | worst error | body nodes low |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype in DTYPES:
        count = ok = loaded = fixed = compared = within = low = 0
        worst = 0.0
        for _, proto, case in cases:
            try:
                onnx.checker.check_model(proto, full_check=True)
            except onnx.checker.ValidationError:
                continue
            count += 1
            out, plan = convert(proto, dtype)
            ok += checked(out)
            loaded += loads(out) or not loads(proto)
            fixed += fixed_point(out, dtype)
            low += sum(
                1
                for n, d in plan.nodes.items()
                if "/" in n and d.precision == dtype
            )
            first, second = proto, out
            if inline:  # onnx.reference runs a renamed function copy only inlined
                first, second = (onnx.inliner.inline_local_functions(m) for m in (proto, out))
            inputs = case.data_sets[0][0]  # type: ignore[attr-defined]
            try:
                want = ReferenceEvaluator(first).run(None, feeds_for(proto, inputs))
            except Exception:  # the evaluator cannot run the original
                continue
            got = ReferenceEvaluator(second).run(None, feeds_for(out, inputs))
            compared += 1
            error = 0.0
            for a, b in zip(got, want, strict=True):
                if isinstance(b, np.ndarray) and b.dtype.kind == "f":
                    error = max(error, _relative_error(a, b))
            within += error <= TOLERANCE[dtype]
            worst = max(worst, error)
        rows.append(
            f"| {dtype} | {count} | {ok} | {loaded} | {fixed} | {compared} | {within} | "
            f"{worst:.3g} | {low} |"
        )
    return "\n".join(rows)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max |got - want| / max |want| over the finite values of ``want``; inf where the two
    disagree on which values are finite (as tests/onnx/test_node_corpus.py measures)."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want64)
    if (np.isfinite(got64) != finite).any():
        return float("inf")
    if not finite.any():
        return 0.0
    scale = np.abs(want64[finite]).max()
    error = np.abs(got64[finite] - want64[finite]).max()
    return float(error / scale) if scale else float(error)


def node_bodies() -> str:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    chosen = [
        (case.name, case.model, case)
        for case in cases
        if any(a.type in _GRAPHS for node in case.model.graph.node for a in node.attribute)
        and not case.name.startswith("test_flexattention")  # FlexAttention: kept whole
    ]
    return _corpus(chosen, inline=False)


def functions() -> str:
    return _corpus(function_cases(), inline=True)


def optimum() -> str:
    from bench_optimum import section

    return section()


SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "hand_built": ("Hand-built control flow beside the same computation unrolled", hand_built),
    "node_bodies": ("ONNX node test cases with If/Loop/Scan bodies", node_bodies),
    "functions": ("ONNX function ops as model-local functions", functions),
    "optimum": ("Optimum's seq2seq exports converted as folders", optimum),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", action="append", choices=sorted(SECTIONS), help="run only these sections"
    )
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"date: {datetime.date.today()}; onnx {onnx.__version__}")
    for key in args.only or SECTIONS:
        title, section = SECTIONS[key]
        print(f"\n### {title}\n")
        print(section())


if __name__ == "__main__":
    main()
