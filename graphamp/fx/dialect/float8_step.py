"""Float8 in a training step, the dialect's part: the forward's float8 layers traced as marks,
the marks handed to the ``step`` pipeline (:mod:`graphamp.passes.fp8_scaling`), and what a
step with float8 refuses.

A layer the model pipeline decided ``fp8`` (an ``aten.linear`` of an activation and a
parameter) becomes, in the forward module the step is traced through, the marked product of
:func:`graphamp.fx.dialect.float8.linear`: the input flattened to rows, the weight read from its
master (a float32 master is quantised directly, not through its low-type copy: one rounding,
as torchao and Transformer Engine quantise it), the bias added in the output's type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from graphamp.core.vocab import Precision, Rule
from graphamp.dialects.base import ReadGraph
from graphamp.errors import Float8Warning, GraphampError, InternalError, warn
from graphamp.fx.dialect import float8
from graphamp.fx.dialect.ops import attribute, attribute_of
from graphamp.fx.dialect.reader import stable_names
from graphamp.passes.fp8_scaling import GEMM_PARAM, LAYER_PARAM
from graphamp.plans.plan import Plan
from graphamp.plans.records import ScaleRecord

LINEAR = torch.ops.aten.linear.default
STEP_LAYERS = "linear layers and x @ W.T products of an activation and a parameter"
CAST = torch.ops.aten._to_copy.default


def mark(module: fx.GraphModule, plan: Plan, weights: str) -> None:
    """The float8 layers of ``plan`` marked in ``module`` for a step to trace (the weight
    quantised from its ``master`` or its ``low`` copy)."""
    left = mark_layers(module, chosen_layers(module, plan), weights)
    keep_unbuilt(plan, left, "a training step")


def keep_unbuilt(plan: Plan, names: Iterable[str], where: str) -> None:
    """Nodes the plan chose for float8 that ``where`` cannot build (not a layer) keep the
    low type: their decision says why, a :class:`Float8Warning` names each, and their scale
    records lose them as consumers."""
    for name in sorted(names):
        decision = plan.fp8[name]
        kept = (
            f"{where} puts in float8 only {STEP_LAYERS}, which this product is not (an x @ W"
            f" of a stored [K, N] weight, say); the float8 rules would have chosen it:"
            f" {decision.reason.removesuffix(f', output {plan.dtype}')}"
        )
        plan.fp8[name] = dataclasses.replace(
            decision, precision=Precision(plan.dtype), rule=Rule.FP8_DENY, reason=kept
        )
        warn(f"node {name!r}: kept {plan.dtype}: {kept}", Float8Warning)
        for record in plan.scales:
            if name in record.consumers:
                record.consumers.remove(name)
        plan.scales[:] = [record for record in plan.scales if record.consumers]


def check_settings(fp8: Any, dtype: str, loss_scaling: Any, accumulate: int) -> None:
    """What a float8 step takes: a current or delayed recipe, bfloat16 compute (float16
    would need loss scaling, which float8's own scales are not yet combined with), and
    delayed scaling without micro-batches (each would need its amax in the history)."""
    recipe = getattr(fp8, "recipe", None)
    if recipe not in ("current", "delayed"):
        raise GraphampError(
            "train_step(fp8=...): give graphamp.Float8.current() or graphamp.Float8.delayed()"
        )
    if dtype != "bfloat16" or loss_scaling is not None:
        raise GraphampError(
            f"train_step(fp8=...): float8 training runs with dtype='bfloat16' and no loss "
            f"scaling (got dtype={dtype!r}"
            + (", loss scaling" if loss_scaling is not None else "")
            + "); float16 with loss scaling is not supported with float8"
        )
    if recipe == "delayed" and fp8.granularity != "tensor":
        raise GraphampError("train_step(fp8=...): delayed scaling keeps one scale per tensor")
    if recipe == "delayed" and accumulate > 1:
        raise GraphampError(
            "train_step(fp8=Float8.delayed(...)) with accumulate > 1 is not supported: use "
            "Float8.current() with accumulation"
        )


def weight_source(module: fx.GraphModule, value: fx.Node) -> fx.Node | None:
    """The parameter ``value`` reads (itself, the master a cast reads, or through a cast of
    its transpose and the transpose back), else None."""
    if value.target is torch.ops.aten.t.default and isinstance(value.args[0], fx.Node):
        inner = value.args[0]  # t(cast(t(W))): W
        if inner.target is CAST and (source := _transposed(inner.args[0])) is not None:
            value = source
    if value.op == "call_function" and value.target is CAST and len(value.args) == 1:
        cast_of = value.args[0]
        if not isinstance(cast_of, fx.Node):
            return None
        value = cast_of
    if value.op == "get_attr" and isinstance(attribute_of(module, value), torch.Tensor):
        return value
    return None


def _transposed(value: object) -> fx.Node | None:
    """What a 2-D transpose ``value`` transposes (``t``, ``transpose(0, 1)``, ``permute``)."""
    if not isinstance(value, fx.Node) or value.op != "call_function":
        return None
    target, args = value.target, value.args
    source = args[0] if isinstance(args[0], fx.Node) else None
    if target is torch.ops.aten.t.default:
        return source
    if target is torch.ops.aten.transpose.int:
        dims = [d % 2 for d in args[1:3] if isinstance(d, int)]
        return source if sorted(dims) == [0, 1] else None
    if target is torch.ops.aten.permute.default:
        order = args[1]
        return source if isinstance(order, list | tuple) and list(order) == [1, 0] else None
    return None


def layer_of(module: fx.GraphModule, node: fx.Node) -> tuple[Any, fx.Node, fx.Node, Any] | None:
    """``node`` as a layer when it is one, a ``linear``, or an ``mm``/``matmul``/``addmm`` of
    an activation and a transposed weight (``x @ W.T``, the cast before or after the
    transpose): (its input, the weight parameter, the value holding the weight it reads as
    (N, K) (the parameter, its cast, or a transpose of the cast it reads), its bias or None);
    else None."""
    target, args = node.target, node.args
    if target is LINEAR:
        weight = args[1]
        bias = args[2] if len(args) > 2 else None
    elif target in (torch.ops.aten.mm.default, torch.ops.aten.matmul.default):
        bias, weight = None, _untransposed(module, args[1])
    elif target is torch.ops.aten.addmm.default and not node.kwargs:
        bias, weight = args[0], _untransposed(module, args[2])
    else:
        return None
    if not isinstance(weight, fx.Node):
        return None
    master = weight_source(module, weight)
    stored = None if master is None else attribute(module, str(master.target))
    if master is None or not isinstance(stored, torch.Tensor) or stored.dim() != 2:
        return None  # a layer's weight is a matrix
    x = args[1] if target is torch.ops.aten.addmm.default else args[0]
    return (x, master, weight, bias)


def _untransposed(module: fx.GraphModule, value: object) -> fx.Node | None:
    """The (N, K) weight a product's B = W.T comes from: what ``t(cast(W))`` transposes,
    or, for ``cast(t(W))`` of a parameter, a transpose of that cast (one already in the
    graph, else one added after the cast: callers drop it as dead code if unused)."""
    inner = _transposed(value)
    if inner is not None or not isinstance(value, fx.Node):
        return inner
    if value.target is not CAST or len(value.args) != 1:
        return None
    source = _transposed(value.args[0])
    if source is None or weight_source(module, source) is None:
        return None
    for user in value.users:  # asked again (convert asks twice): the same transpose
        if user.target is torch.ops.aten.t.default:
            return user
    with module.graph.inserting_after(value):
        return module.graph.call_function(torch.ops.aten.t.default, (value,))


def mark_layers(
    module: fx.GraphModule, layers: Iterable[tuple[str, fx.Node]], weights: str = "master"
) -> list[str]:
    """Each ``(plan name, node)`` of ``layers`` that is a layer (:func:`layer_of`) made the
    marked float8 product in ``module``, quantising the weight's ``master`` or the ``low``
    copy the layer read; returns the names of the others, left as they were."""
    graph = module.graph
    left = []
    for name, node in layers:
        found = layer_of(module, node)
        if found is None:
            left.append(name)
            continue
        x, master, read, bias = found
        weight = master if weights == "master" else read
        stored = attribute(module, str(master.target))
        assert isinstance(stored, torch.Tensor)  # weight_source found a tensor
        with graph.inserting_before(node):
            rows = graph.call_function(torch.ops.aten.reshape.default, (x, [-1, stored.shape[1]]))
            product = graph.call_function(float8.FLOAT8_MM, (rows, weight, "output", name))
            out = graph.call_function(_unflatten, (product, x))
            if bias is not None:
                out = graph.call_function(torch.ops.aten.add.Tensor, (out, bias))
        out.meta = dict(node.meta)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    module.recompile()
    return left


def _unflatten(rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The product's rows back in the input's leading dimensions."""
    return rows.reshape(*x.shape[:-1], rows.shape[-1])


def read_marks(read: ReadGraph) -> ReadGraph:
    """``read`` (a step graph) with every float8 mark given its GEMM and layer (the
    ``params`` the ``fp8_scaling`` pass reads)."""
    for name, node in read.handles.nodes.items():
        if node.op == "call_function" and node.target is float8.FLOAT8_MM:
            _, _, gemm, layer = node.args
            read.graph.nodes[name].params = {GEMM_PARAM: str(gemm), LAYER_PARAM: str(layer)}
    return read


def check_lowered(module: fx.GraphModule) -> None:
    """A step graph must hold no float8 mark once the passes ran (it would compute in
    float32 and report float8)."""
    left = [n.name for n in module.graph.nodes if n.target is float8.FLOAT8_MM]
    if left:
        raise InternalError(f"float8 marks left in the step graph: {', '.join(left)}")


def chosen_layers(module: fx.GraphModule, plan: Plan) -> list[tuple[str, fx.Node]]:
    """The nodes of a converted module the plan put in float8 (rule ``fp8``), by name."""
    chosen = {name for name, decision in plan.fp8.items() if decision.rule is Rule.FP8}
    names = stable_names(module)
    return [(names[n.name], n) for n in module.graph.nodes if names.get(n.name) in chosen]


def step_scales(forward: Plan, step: list[ScaleRecord]) -> list[ScaleRecord]:
    """A step plan's scale records: the forward plan's (its layers' inputs and weights, by
    their names in the forward graph; a delayed one names the state the step keeps for it)
    and the step's records of the gradients it quantises (by their names in the step)."""
    state = {(r.detail["layer"], r.detail["operand"]): r.state for r in step}
    records = []
    for record in forward.scales:
        if record.source == "delayed":
            layer = record.consumers[0]
            operand = "input" if forward.fp8[layer].operands[0] == record.tensor else "weight"
            if (layer, operand) not in state:
                raise InternalError(f"no delayed state for the {operand} of {layer!r}")
            record = dataclasses.replace(record, state=list(state[(layer, operand)]))
        records.append(record)
    return records + [r for r in step if r.detail["operand"] == "grad_output"]
