"""Float8 in a training step: the scaled GEMMs and their scales, as passes of the ``step``
pipeline.

The dialect traces the step with every matrix product the model pipeline decided ``fp8`` as a
*float8 GEMM mark* (a node whose ``params`` hold ``float8_gemm``: ``output``, ``grad_input``
or ``grad_weight``, and ``layer``, the forward node it belongs to), its two inputs the values
it multiplies: the layer's input x and weight w for its output (x @ w.T), the output's
gradient g and w for the input's gradient (g @ w), g and x for the weight's gradient (g.T @ x).

* **fp8_scaling** replaces every mark by a ``float8_gemm`` node reading quantised operands and
  their scales. Each operand value is quantised once per format and granularity and shared by
  every GEMM reading it (x by the output's and the weight's gradient, w by the output's and the
  input's gradient, g by both gradients): an ``amax`` node (max |value|, per tensor, or per
  row along the contracted dimension), then a ``quantize`` node (value times scale, clamped to
  the format's range, cast). Formats: HYBRID for per-tensor scales (E4M3 for x and w, E5M2 for
  g, which needs range more than precision), E4M3 for all with rowwise scales (torchao's
  ROWWISE, whose scales are powers of two). Scales:

  - *current*: this step's amax, float8_max / amax (torchao's arithmetic);
  - *delayed*: Transformer Engine's: each quantised value has an amax history (length L) and a
    scale, new inputs and outputs of the step like the loss scale; the quantize node uses
    the scale the earlier steps left, and on the first step (a scale of 0: no history yet)
    this step's amax, as current scaling would.

* **fp8_scale_update** (delayed, update steps): one ``scale_update_fp8`` node after the finite
  check writes each value's amax into its history, rolls it and computes the next scale from
  its largest (``max``) or newest (``most_recent``) amax, ``float8_max * 2**-margin / amax``,
  keeping the old scale where that amax is 0 or not finite (Transformer Engine's
  ``delayed_scaling.cu``). A step skipped for non-finite gradients keeps history and scales,
  as it keeps the parameters. Over a process group the amaxes are first reduced with MAX, so
  every rank keeps the same scales (Transformer Engine's ``reduce_amax``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphamp.core.graph import NodeKind, OpNode, Role
from graphamp.core.vocab import Precision, Rule
from graphamp.errors import GraphampError
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.loss_scale import add_node, add_output, add_state, reroute
from graphamp.plans.records import ScaleRecord

GEMM_PARAM = "float8_gemm"
LAYER_PARAM = "layer"
# What each GEMM reads in its two input slots, and along which dimension of that value the
# product contracts (the dimension a rowwise amax runs over).
OPERANDS: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "output": (("input", 1), ("weight", 1)),
    "grad_input": (("grad_output", 1), ("weight", 0)),
    "grad_weight": (("grad_output", 0), ("input", 0)),
}
FORMAT_MAX = {"e4m3fn": 448.0, "e5m2": 57344.0}


def marks_of(context: PassContext) -> list[OpNode]:
    return [node for node in context.graph if GEMM_PARAM in node.params]


@dataclass
class Quantised:
    """One operand value quantised in one format and granularity: the nodes' outputs and
    the GEMMs reading them."""

    value: str
    operand: str  # input, weight or grad_output, as its first reader calls it
    layer: str
    format: str
    axis: int | None  # None: one scale for the value; else the dimension the amax runs over
    amax: str = ""
    quantised: str = ""
    scale: str = ""
    state: list[str] = field(default_factory=list)  # delayed: history, scale
    consumers: list[str] = field(default_factory=list)


def _format(settings: Any, operand: str) -> str:
    if operand == "grad_output" and settings.granularity == "tensor":
        return "e5m2"
    return "e4m3fn"


def _source(settings: Any) -> str:
    if settings.recipe == "delayed":
        return (
            f"delayed scaling: an amax history of {settings.history} steps ({settings.algorithm}"
            f", margin {settings.margin}); the first step uses its own amax"
        )
    return "current scaling: this step's amax"


class Fp8ScalingPass(Pass):
    """Quantise the operands of every float8 GEMM mark and scale the GEMMs (module
    docstring)."""

    name = "fp8_scaling"
    gives = frozenset({Fact.FP8_SCALED})

    def applies(self, context: PassContext) -> bool:
        return bool(marks_of(context))

    def run(self, context: PassContext) -> PassResult:
        settings = context.options.fp8
        if settings is None:
            raise GraphampError("the step holds float8 GEMM marks but no float8 settings")
        if settings.recipe not in ("current", "delayed"):
            raise GraphampError(
                f"train_step(fp8=...): recipe {settings.recipe!r} is for converted models; "
                "a training step takes Float8.current() or Float8.delayed()"
            )
        quantised: dict[tuple[str, str, int | None], Quantised] = {}
        gemms = 0
        for mark in marks_of(context):
            gemm, layer = str(mark.params[GEMM_PARAM]), str(mark.params[LAYER_PARAM])
            operands = []
            for value, (operand, contracted) in zip(mark.inputs, OPERANDS[gemm], strict=True):
                fmt = _format(settings, operand)
                axis = contracted if settings.granularity == "row" else None
                key = (value, fmt, axis)
                if key not in quantised:
                    quantised[key] = self._quantise(
                        context, settings, value, operand, layer, fmt, axis
                    )
                quantised[key].consumers.append(f"{layer}.{gemm}")
                operands.append(quantised[key])
            self._gemm(context, mark, gemm, layer, operands, settings)
            gemms += 1
        for record in quantised.values():
            context.scales.append(_record(record, settings))
        return PassResult(
            modified=True, note=f"{gemms} float8 GEMMs, {len(quantised)} quantised values"
        )

    def _quantise(
        self,
        context: PassContext,
        settings: Any,
        value: str,
        operand: str,
        layer: str,
        fmt: str,
        axis: int | None,
    ) -> Quantised:
        record = Quantised(value, operand, layer, fmt, axis)
        base = f"{layer}.{operand}" if axis is None else f"{layer}.{operand}.rows{axis}"
        per = "per tensor" if axis is None else f"per row along dimension {axis}"
        amax = add_node(
            context,
            NodeKind.AMAX,
            [value],
            [(f"{base}.amax", "float32")],
            Rule.FP8_AMAX,
            f"max |{operand}| of {layer} {per}, for its {fmt} scale",
            params={"axis": -1 if axis is None else axis},
            name=f"{base}.amax",
        )
        record.amax = amax.outputs[0]
        inputs = [value, record.amax]
        if settings.recipe == "delayed":
            history = add_state(
                context, f"float8.{base}.amax_history", "float32", 0.0, (settings.history,)
            )
            scale = add_state(context, f"float8.{base}.scale", "float32", 0.0)
            record.state = [history, scale]
            inputs.append(scale)
        node = add_node(
            context,
            NodeKind.QUANTIZE,
            inputs,
            [(f"{base}.{fmt}", f"float8_{fmt}"), (f"{base}.scale", "float32")],
            Rule.FP8_QUANTIZE,
            f"{operand} of {layer} to {fmt} {per}: x * scale clamped to +-"
            f"{FORMAT_MAX[fmt]:g}, {_source(settings)}",
            params={
                "format": fmt,
                "axis": -1 if axis is None else axis,
                "recipe": settings.recipe,
                "power_of_2": int(settings.granularity == "row"),
                **({"history": record.state[0]} if record.state else {}),
            },
            name=f"{base}.quantize",
        )
        record.quantised, record.scale = node.outputs
        return record

    def _gemm(
        self,
        context: PassContext,
        mark: OpNode,
        gemm: str,
        layer: str,
        operands: list[Quantised],
        settings: Any,
    ) -> None:
        graph = context.graph
        (output,) = mark.outputs
        a, b = operands
        node = add_node(
            context,
            NodeKind.FLOAT8_GEMM,
            [a.quantised, a.scale, b.quantised, b.scale],
            [(f"{layer}.{gemm}", graph.tensors[output].dtype)],
            Rule.FP8,
            f"{gemm} of {layer} on float8 operands: {a.operand} {a.format} "
            f"({_scale_words(a)}) x {b.operand} {b.format} ({_scale_words(b)}), "
            f"{graph.tensors[output].dtype} out",
            params={
                "gemm": gemm,
                "layer": layer,
                # fast accumulation for the output's GEMM, a split accumulator for the
                # gradients' (torchao's and Transformer Engine's defaults)
                "fast_accum": int(gemm == "output"),
                "out_dtype": graph.tensors[output].dtype,
            },
            name=f"{layer}.{gemm}",
            precision=Precision.FLOAT8_E4M3FN,
        )
        reroute(context, output, node.outputs[0], skip=node.name)
        tensor, new = graph.tensors[output], graph.tensors[node.outputs[0]]
        if tensor.role is Role.GRADIENT:
            tensor.role, new.role = None, Role.GRADIENT
        context.script.erase_nodes.append(mark.name)


def _record(record: Quantised, settings: Any) -> ScaleRecord:
    """The plan's record of one quantised value of the step: its GEMMs are its consumers,
    its layer and operand are in ``detail``."""
    detail: dict[str, object] = {"layer": record.layer, "operand": record.operand}
    detail.update(settings.source_detail())
    return ScaleRecord(
        record.value,
        record.format,
        "tensor" if record.axis is None else "row",
        settings.source(),
        detail,
        list(record.consumers),
        list(record.state),
    )


def _scale_words(record: Quantised) -> str:
    per = "per tensor" if record.axis is None else "per row"
    return f"{per}, scale {record.scale}"


class Fp8ScaleUpdatePass(Pass):
    """Delayed scaling's history and scale update after the finite check (module
    docstring)."""

    name = "fp8_scale_update"
    requires = frozenset({Fact.FP8_SCALED, Fact.FINITE_CHECKED})

    def applies(self, context: PassContext) -> bool:
        settings = context.options.fp8
        # no scaled GEMM (every layer kept in the low type: the size table, no linear layer)
        # leaves no history to keep and no scale to update
        scaled = Fact.FP8_SCALED in context.facts
        return settings is not None and settings.recipe == "delayed" and scaled

    def run(self, context: PassContext) -> PassResult:
        settings = context.options.fp8
        assert settings is not None  # applies() checked it
        graph = context.graph
        quantised = [n for n in graph if n.kind is NodeKind.QUANTIZE and "history" in n.params]
        amaxes = [node.inputs[1] for node in quantised]
        histories = [str(node.params["history"]) for node in quantised]
        scales = [node.inputs[2] for node in quantised]
        params: dict[str, float | str] = {
            "algorithm": settings.algorithm,
            "margin": settings.margin,
            "formats": ",".join(str(node.params["format"]) for node in quantised),
        }
        group = context.options.shard or context.options.all_reduce
        where = ""
        if group is not None:
            params.update(group=group.group, world_size=group.world_size)
            where = f"; the amaxes first reduced with MAX over the {group.world_size} ranks"
        found_inf = "found_inf.agreed" if "found_inf.agreed" in graph.tensors else "found_inf"
        node = add_node(
            context,
            NodeKind.SCALE_UPDATE_FP8,
            [found_inf, *amaxes, *histories, *scales],
            [(f"{name}.next", "float32") for name in [*histories, *scales]],
            Rule.FP8_SCALE_UPDATE,
            f"the {len(quantised)} float8 scales for the next step (Transformer Engine's "
            f"delayed scaling: history {settings.history}, {settings.algorithm}, margin "
            f"{settings.margin}){where}; a skipped step keeps them",
            params=params,
            name="float8.scale_update",
        )
        for state, output in zip([*histories, *scales], node.outputs, strict=True):
            graph.tensors[output].shape = graph.tensors[state].shape
            add_output(context, output, state)
        return PassResult(modified=True, note=f"{len(quantised)} delayed scales")
