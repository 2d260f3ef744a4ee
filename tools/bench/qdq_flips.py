"""Where a converted QDQ model's output error comes from, in quantisation steps.

Builds onnxruntime.quantization's QDQ model (tests/onnx/qdq_models.py: ``vit`` or ``resnet``
at ``--opset``), converts it with graphamp (``keep_io_types``) and runs both op by op on the
CPU (no graph optimisation; the converted model through the faithful evaluator, every float16
value rounded as it is produced), with every QuantizeLinear output exposed. It prints:

* per QuantizeLinear, in graph order: how many of its integers differ from the float32 QDQ
  model's and by how many steps at most (layer by layer: where flips start and how they grow);
* the output's error in steps of its DequantizeLinear's scale, on ``--seeds``, with the same
  figure for the float32 QDQ model run with onnxruntime's default graph optimisations (its
  fused integer kernels) against itself op by op;
* ``--attribute``: each float16 rounding of the converted model alone (one value rounded, or
  one scale stored float16, everything else float32): the output steps it costs; then all the
  roundings that cost at most one step alone, together;
* ``--one-flip``: the largest output change one integer of the tensor quantised before the
  output's op moves by one step causes (that op's sensitivity to a single flipped rounding).

Run: ``python tools/bench/qdq_flips.py vit --opset 21 --attribute --one-flip``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import graphamp.onnx as gonnx  # noqa: E402
from graphamp.numerics.verify import random_inputs  # noqa: E402
from graphamp.onnx.numerics.emulate import emulated  # noqa: E402
from tests.onnx.qdq_models import qdq_model  # noqa: E402

LOW = "__emulated_low"
RAW = "__emulated_raw"


def session(proto: onnx.ModelProto, optimised: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimised:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def exposing(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    known = {o.name for o in model.graph.output}
    for name in names:
        if name not in known:
            model.graph.output.append(helper.make_value_info(name, onnx.TypeProto()))
    return model


class Study:
    """The float32 QDQ model, its conversion's emulation, and runs of both."""

    def __init__(self, original: onnx.ModelProto) -> None:
        self.original = original
        self.converted = gonnx.convert(original, keep_io_types=True).to_proto()
        self.emulation = emulated(self.converted, gonnx.inferred_types(self.converted))
        self.stored = {i.name: numpy_helper.to_array(i) for i in original.graph.initializer}
        self.quantised = [n.output[0] for n in original.graph.node if n.op_type == "QuantizeLinear"]
        self.output = original.graph.output[0].name
        producer = {o: n for n in original.graph.node for o in n.output}
        self.step = float(self.stored[producer[self.output].input[1]].max())
        self.low_scales = [
            i.name
            for i in self.converted.graph.initializer
            if i.data_type == onnx.TensorProto.FLOAT16 and "_scale" in i.name
        ]
        self.rounded = [n.output[0][: -len(LOW)] for n in self.emulation.graph.node if _rounds(n)]
        self.farthest: dict[str, int] = {}

    def run(self, proto: onnx.ModelProto, feeds: dict, optimised: bool = False) -> dict:
        model = exposing(proto, self.quantised)
        names = [o.name for o in model.graph.output]
        return dict(zip(names, session(model, optimised).run(names, feeds), strict=True))

    def variant(self, keep: Callable[[str], bool], float32_scales: set[str]) -> onnx.ModelProto:
        """The emulation with only the roundings ``keep`` names, and ``float32_scales`` (names
        in the converted model) back to their float32 values."""
        model = onnx.ModelProto()
        model.CopyFrom(self.emulation)
        dropped = {n.output[0][: -len(LOW)] for n in model.graph.node if _rounds(n)}
        dropped = {value for value in dropped if not keep(value)}
        nodes = []
        for node in model.graph.node:
            if _rounds(node) and node.output[0][: -len(LOW)] in dropped:
                continue
            if node.op_type == "Cast" and node.input[0].endswith(LOW) and node.output[0] in dropped:
                continue
            node.input[:] = [f"{x}{RAW}" if x in dropped else x for x in node.input]
            nodes.append(node)
        for output in model.graph.output:
            if output.name in dropped:
                nodes.append(helper.make_node("Identity", [f"{output.name}{RAW}"], [output.name]))
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        for init in model.graph.initializer:
            if init.name in float32_scales:
                exact = self.stored[init.name.removesuffix("__float16")].astype(np.float32)
                init.CopyFrom(numpy_helper.from_array(exact, init.name))
        return model

    def steps(self, proto: onnx.ModelProto, seeds: list[int]) -> tuple[float, dict[str, int]]:
        """Largest output error in steps over ``seeds``, and integers moved per quantiser (the
        largest move of each in ``self.farthest``)."""
        worst, moved = 0.0, dict.fromkeys(self.quantised, 0)
        self.farthest = dict.fromkeys(self.quantised, 0)
        for seed in seeds:
            feeds = random_inputs(self.original, seed=seed)
            expected, actual = self.run(self.original, feeds), self.run(proto, feeds)
            error = np.abs(actual[self.output].astype(np.float64) - expected[self.output])
            worst = max(worst, float(np.rint(error.max() / self.step)))
            for name in self.quantised:
                gap = np.abs(expected[name].astype(np.int32) - actual[name].astype(np.int32))
                moved[name] += int(np.count_nonzero(gap))
                self.farthest[name] = max(self.farthest[name], int(gap.max()))
        return worst, moved


def _rounds(node: onnx.NodeProto) -> bool:
    """A round trip's first Cast after a value the converted model holds float16."""
    return node.op_type == "Cast" and node.output[0].endswith(LOW) and node.input[0].endswith(RAW)


def one_flip(study: Study, seed: int) -> tuple[float, str]:
    """Largest output change (steps) from one integer moved by one step in the QuantizeLinear
    output nearest before the graph output's op, and that tensor's name."""
    producer = {o: n for n in study.original.graph.node for o in n.output}
    op = producer[producer[producer[study.output].input[0]].input[0]]  # DQ <- Q <- op
    source = producer[producer[op.input[0]].input[0]]  # the op's input DQ <- Q
    integers = source.output[0]
    with tempfile.TemporaryDirectory() as folder:
        whole, tail = Path(folder, "whole.onnx"), Path(folder, "tail.onnx")
        onnx.save(study.original, str(whole))
        feeds = random_inputs(study.original, seed=seed)
        values = study.run(exposing(study.original, list(op.input[1:])), feeds)
        onnx.utils.extract_model(str(whole), str(tail), [integers, *op.input[1:]], [study.output])
        run = session(onnx.load(str(tail)))
    fixed = {name: values[name] for name in op.input[1:]}
    base = run.run(None, {integers: values[integers], **fixed})[0]
    worst = 0.0
    flat = values[integers].reshape(-1)
    for index in range(flat.size):
        for delta in (-1, 1):
            moved = flat.astype(np.int32).copy()
            moved[index] += delta
            if not np.iinfo(flat.dtype).min <= moved[index] <= np.iinfo(flat.dtype).max:
                continue
            tensor = moved.astype(flat.dtype).reshape(values[integers].shape)
            out = run.run(None, {integers: tensor, **fixed})[0]
            worst = max(worst, float(np.rint(np.abs(out - base).max() / study.step)))
    return worst, integers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=["vit", "resnet"])
    parser.add_argument("--opset", type=int, default=21)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--attribute", action="store_true", help="each float16 rounding alone")
    parser.add_argument("--one-flip", action="store_true", help="one integer moved by one step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        study = Study(onnx.load(str(qdq_model(args.model, Path(folder), args.opset))))
    casts = sum(n.op_type == "Cast" for n in study.converted.graph.node)
    print(
        f"# {args.model} at opset {args.opset}: {casts} Casts, {len(study.rounded)} float16 "
        f"values, {len(study.low_scales)} float16 scales; seeds {args.seeds}"
    )
    worst, moved = study.steps(study.emulation, args.seeds)
    farthest = dict(study.farthest)
    print("\n| QuantizeLinear output | integers moved | of | largest move (steps) |")
    print("|---|---|---|---|")
    sizes = study.run(study.original, random_inputs(study.original, seed=args.seeds[0]))
    for name in study.quantised:
        size = sizes[name].size * len(args.seeds)
        print(f"| {name} | {moved[name]} | {size} | {farthest[name]} |")
    print(f"\nconverted, op by op: {worst:.0f} output steps")
    for seed in args.seeds:
        feeds = random_inputs(study.original, seed=seed)
        fused = study.run(study.original, feeds, optimised=True)[study.output]
        plain = study.run(study.original, feeds)[study.output]
        gap = float(np.rint(np.abs(fused.astype(np.float64) - plain).max() / study.step))
        print(
            f"seed {seed}: the float32 QDQ model, onnxruntime's default optimisations against "
            f"op by op: {gap:.0f} steps"
        )
    if args.attribute:
        every_scale = set(study.low_scales)
        print("\n| float16 rounding alone | output steps | integers moved |")
        print("|---|---|---|")
        costs: dict[str, float] = {}
        for value in study.rounded:
            costs[value], moved = study.steps(
                study.variant(lambda v, x=value: v == x, every_scale), args.seeds
            )
            print(f"| value {value} | {costs[value]:.0f} | {sum(moved.values())} |")
        for scale in study.low_scales:
            costs[scale], moved = study.steps(
                study.variant(lambda v: False, every_scale - {scale}), args.seeds
            )
            print(f"| scale {scale} | {costs[scale]:.0f} | {sum(moved.values())} |")
        cheap = {name for name, cost in costs.items() if cost <= 1}
        together, _ = study.steps(
            study.variant(lambda v: v in cheap, every_scale - cheap), args.seeds
        )
        print(
            f"\n{sum(c >= 8 for c in costs.values())} of {len(costs)} roundings cost 8 steps or "
            f"more alone; the {len(cheap)} that cost at most one alone cost {together:.0f} together"
        )
    if args.one_flip:
        worst, integers = one_flip(study, args.seeds[0])
        print(f"\none integer of {integers} moved by one step: up to {worst:.0f} output steps")


if __name__ == "__main__":
    main()
