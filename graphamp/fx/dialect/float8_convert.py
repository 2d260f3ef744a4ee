"""Float8 in a converted module for inference (``graphamp.fx.convert(..., fp8=...)``): every
layer the plan put in float8 becomes a scaled GEMM on float8 operands.

* The weight is quantised once, at conversion, and stored in float8 with its scale (the
  float32 parameter is dropped where nothing else reads it): per tensor under current
  scaling (its amax is the same on every run, so this is current scaling's result), per
  output channel under rowwise current scaling (a power of two, as torchao's rowwise
  recipe) and under static scaling.
* The activation is quantised on every run: with its own amax (current scaling, per tensor
  or per row), or with the scale calibration fixed (static: float8_max / (max |x| over the
  calibration batches, the plan's record, times 2**margin: ``Float8.static``'s headroom, a
  binade by default, as the ONNX dialect's), expanded to one per row where the weight has
  one per channel (CUDA's scaled GEMM takes both per tensor or both per row).
* The product runs as :func:`graphamp.fx.dialect.float8.scaled_mm` with fast accumulation, in the
  low type, the bias added after it.
"""

from __future__ import annotations

import torch
from torch import fx

from graphamp.errors import InternalError
from graphamp.fx.dialect import float8
from graphamp.fx.dialect.float8_step import chosen_layers, keep_unbuilt, layer_of
from graphamp.fx.dialect.ops import attribute_of
from graphamp.plans.plan import Plan
from graphamp.training.float8 import Float8


def current_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    axis: int | None,
) -> torch.Tensor:
    """A float8 layer whose activation takes this run's amax (per tensor, or per row with
    ``axis`` 1)."""
    rows = x.reshape(-1, x.shape[-1])
    scale = float8.scale_of(float8.amax(rows, axis), "e4m3fn", power_of_2=axis is not None)
    quantised = float8.quantize(rows, scale, "e4m3fn")
    out = float8.scaled_mm(quantised, scale, weight.t(), weight_scale.t(), x.dtype, True)
    return _finish(out, x, bias)


def static_linear(
    x: torch.Tensor,
    scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """A float8 layer whose activation takes the calibrated ``scale``, one per row (the
    weight has one per output channel)."""
    rows = x.reshape(-1, x.shape[-1])
    quantised = float8.quantize(rows, scale, "e4m3fn")
    row_scales = scale.expand(rows.shape[0], 1).contiguous()
    out = float8.scaled_mm(quantised, row_scales, weight.t(), weight_scale.t(), x.dtype, True)
    return _finish(out, x, bias)


def _finish(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias.to(out.dtype)


def quantised_weight(
    weight: torch.Tensor, per_channel: bool, power_of_2: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ([N, K]) in E4M3 and its scale: one (a 0-d tensor), or one per output
    channel ([N, 1]), rounded down to a power of two for the rowwise recipe (torchao's)."""
    with torch.no_grad():
        value = weight.detach()
        amax = float8.amax(value, 1 if per_channel else None)
        scale = float8.scale_of(amax, "e4m3fn", power_of_2)
        return float8.quantize(value, scale, "e4m3fn"), scale


def lower(module: fx.GraphModule, plan: Plan, settings: Float8) -> None:
    """Every float8 layer of ``plan`` in ``module`` made a scaled GEMM (module docstring);
    a chosen node that is not a layer keeps the low type (the plan and a warning say so)."""
    graph = module.graph
    layers = chosen_layers(module, plan)
    keep_unbuilt(plan, {n for n, node in layers if layer_of(module, node) is None}, "a module")
    per_channel = settings.recipe == "static" or settings.granularity == "row"
    amaxes = {record.tensor: record.detail.get("amax") for record in plan.scales}
    replaced: set[str] = set()
    for name, node in layers:
        found = layer_of(module, node)
        if found is None:
            continue
        x, master, _, bias = found
        stored = attribute_of(module, master)
        if not isinstance(stored, torch.Tensor):  # (layer_of found a matrix there)
            raise InternalError(f"{name}: its weight {master.target!r} is no tensor")
        weight, scale = quantised_weight(stored, per_channel, settings.granularity == "row")
        stem = f"{str(master.target).replace('.', '_')}_float8"
        module.register_buffer(stem, weight)
        module.register_buffer(f"{stem}_scale", scale)
        with graph.inserting_before(node):
            inputs = [graph.get_attr(stem), graph.get_attr(f"{stem}_scale"), bias]
            if settings.recipe == "static":
                amax = amaxes.get(plan.fp8[name].operands[0])
                if not isinstance(amax, int | float) or amax <= 0:
                    raise InternalError(f"no calibrated amax for the input of {name!r}")
                headroom = float(amax) * 2.0**settings.margin  # Float8.static's margin
                stored = float8.scale_of(torch.tensor(headroom), "e4m3fn")
                module.register_buffer(f"{stem}_input_scale", stored)
                activation = graph.get_attr(f"{stem}_input_scale")
                out = graph.call_function(static_linear, (x, activation, *inputs))
            else:
                axis = 1 if settings.granularity == "row" else None
                out = graph.call_function(current_linear, (x, *inputs, axis))
        out.meta = dict(node.meta)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        replaced.add(str(master.target))
    graph.eliminate_dead_code()
    readers = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for target in replaced - readers:  # a parameter only the float8 layers read
        *path, leaf = target.split(".")
        owner = module.get_submodule(".".join(path))
        delattr(owner, leaf)
    graph.lint()
    module.recompile()
