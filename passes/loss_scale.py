"""Training steps: loss scaling, unscaling, the finite check and the step guard, as passes over
the step graph (the ``step`` pipeline).

The dialect captures a plain training step (forward, loss, backward from a seed of one,
optimizer update) and marks its values: the loss, the backward seed, each gradient as the
optimizer reads it, each updated parameter and optimizer state. These passes add, as nodes
the plan records and ``graphamp explain`` explains:

* **loss_scale** (float16 with loss scaling): the seed times the loss scale (the same
  gradients ``(loss * scale).backward()`` gives: small gradients survive float16), and one
  ``unscale`` node multiplying every gradient by 1 / scale before the optimizer reads it;
* **finite_check** (every update step): one boolean, whether any gradient holds inf or NaN; a
  ``step_guard`` that keeps every parameter and optimizer state as it was when it does
  (``where``, never a multiply: inf * 0 is NaN), and a count of the skipped steps;
* **scale_update** (dynamic scaling): the next scale from the finite check, by Paddle's
  ``update_loss_scaling`` rules.

The scale, its counters and the skip count are new graph inputs and outputs: state lives in
tensors, so a step never waits for the host.
"""

from __future__ import annotations

from graphamp.core.graph import NodeKind, OpGraph, OpNode, Role, TensorInfo
from graphamp.core.vocab import Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision
from graphamp.training.scaling import DynamicLossScaling


def add_state(
    context: PassContext, name: str, dtype: str, initial: float, shape: tuple[int, ...] = ()
) -> str:
    """A new graph input holding state (``shape``, every element ``initial``, created by the
    caller)."""
    context.graph.add_tensor(
        TensorInfo(name, dtype, shape=shape, is_graph_input=True, type_fixed=True)
    )
    context.graph.graph_inputs.append(name)
    context.script.new_inputs[name] = initial
    return name


def add_node(
    context: PassContext,
    kind: NodeKind,
    inputs: list[str],
    outputs: list[tuple[str, str]],
    rule: Rule,
    reason: str,
    params: dict[str, float | str] | None = None,
    *,
    name: str | None = None,
    precision: Precision = Precision.FLOAT32,
) -> OpNode:
    """A node of ``kind`` (named ``name``, by default after its kind) reading ``inputs`` and
    writing ``outputs`` (name, dtype), placed after its inputs, decided ``precision`` with
    ``rule`` and ``reason``."""
    graph = context.graph
    for output, dtype in outputs:
        graph.add_tensor(TensorInfo(output, dtype))
    node = OpNode(
        name=name or kind.value,
        op=kind.value,
        inputs=inputs,
        outputs=[output for output, _ in outputs],
        kind=kind,
        params=params or {},
    )
    graph.add_node_after_inputs(node)
    context.script.new_nodes.append(node.name)
    context.decisions[node.name] = NodeDecision(
        op=node.op, precision=precision, rule=rule, reason=reason
    )
    return node


def reroute(context: PassContext, old: str, new: str, *, skip: str) -> None:
    """Every reader of ``old`` but node ``skip`` reads ``new`` instead."""
    graph: OpGraph = context.graph
    added = set(context.script.new_nodes)
    for consumer, slot in list(graph.consumers(old)):
        if consumer != skip:
            graph.replace_input(consumer, slot, new)
            # A node a pass added is built from its inputs in the graph: nothing to rewire.
            if consumer not in added:
                context.script.rewire[(consumer, slot)] = new


def add_output(context: PassContext, name: str, replaces: str) -> None:
    tensor = context.graph.tensors[name]
    tensor.is_graph_output, tensor.replaces = True, replaces
    context.graph.graph_outputs.append(name)
    context.script.new_outputs.append(name)


class LossScalePass(Pass):
    """Scale the backward seed, unscale the gradients (see the module docstring)."""

    name = "loss_scale"
    gives = frozenset({Fact.LOSS_SCALED})

    def applies(self, context: PassContext) -> bool:
        seeds = context.graph.with_role(Role.GRAD_SEED)
        return bool(seeds) and context.options.loss_scaling is not None

    def run(self, context: PassContext) -> PassResult:
        scaling = context.options.loss_scaling
        assert scaling is not None  # applies() checked it
        graph = context.graph
        scale = add_state(context, "loss_scale.scale", "float32", scaling.initial_scale)
        (seed,) = graph.with_role(Role.GRAD_SEED)
        node = add_node(
            context,
            NodeKind.LOSS_SCALE,
            [seed.name, scale],
            [("loss_scale.seed", "float32")],
            Rule.LOSS_SCALE,
            f"{context.policy.dtype} gradients below its smallest value flush to zero: the loss "
            f"is multiplied by the loss scale before backward ({scaling.describe()})",
        )
        reroute(context, seed.name, node.outputs[0], skip=node.name)
        gradients = graph.with_role(Role.GRADIENT)
        if gradients:
            outputs = [(f"{g.name}.unscaled", g.dtype) for g in gradients]
            unscale = add_node(
                context,
                NodeKind.UNSCALE,
                [scale, *(g.name for g in gradients)],
                outputs,
                Rule.UNSCALE,
                f"the optimizer reads true gradients: each of the {len(gradients)} is "
                "multiplied by 1 / loss scale",
            )
            for gradient, (name, _) in zip(gradients, outputs, strict=True):
                reroute(context, gradient.name, name, skip=unscale.name)
                gradient.role, graph.tensors[name].role = None, Role.GRADIENT
        return PassResult(modified=True, note=scaling.describe())


class FiniteCheckPass(Pass):
    """Skip steps whose gradients hold inf or NaN (see the module docstring)."""

    name = "finite_check"
    gives = frozenset({Fact.FINITE_CHECKED})

    def applies(self, context: PassContext) -> bool:
        return bool(context.graph.with_role(Role.GRADIENT))

    def run(self, context: PassContext) -> PassResult:
        graph = context.graph
        gradients = [g.name for g in graph.with_role(Role.GRADIENT)]
        # A float8 quantiser saturates inf to the format's largest value: a non-finite value
        # it quantised shows in its amax, not in the gradients.
        amaxes = [node.outputs[0] for node in graph if node.kind is NodeKind.AMAX]
        also = f" or any of the {len(amaxes)} float8 amaxes" if amaxes else ""
        check = add_node(
            context,
            NodeKind.FINITE_CHECK,
            gradients + amaxes,
            [("found_inf", "bool")],
            Rule.FINITE_CHECK,
            f"one flag for all {len(gradients)} gradients{also}: true when any holds inf or "
            "NaN (the largest magnitude of each, which inf and NaN propagate to)",
        )
        found_inf = check.outputs[0]
        updates = graph.with_role(Role.UPDATE)
        inputs = [found_inf]
        for update in updates:
            inputs += [str(update.replaces), update.name]
        outputs = [(f"{u.name}.guarded", u.dtype) for u in updates]
        add_node(
            context,
            NodeKind.STEP_GUARD,
            inputs,
            outputs,
            Rule.STEP_GUARD,
            f"a step with non-finite gradients leaves all {len(updates)} parameters and "
            "optimizer states as they were (selected with where, never multiplied by 0)",
        )
        for update, (guarded, _) in zip(updates, outputs, strict=True):
            context.script.replace_outputs[update.name] = guarded
        skipped = add_state(context, "skipped_steps", "int32", 0)
        count = add_node(
            context,
            NodeKind.SKIP_COUNT,
            [skipped, found_inf],
            [("skipped_steps.next", "int32")],
            Rule.SKIP_COUNT,
            "counts the steps skipped for non-finite gradients",
        )
        add_output(context, count.outputs[0], skipped)
        return PassResult(modified=True)


class ScaleUpdatePass(Pass):
    """Move the dynamic loss scale after every update step (see the module docstring)."""

    name = "scale_update"
    requires = frozenset({Fact.LOSS_SCALED, Fact.FINITE_CHECKED})

    def applies(self, context: PassContext) -> bool:
        # Update steps only: an accumulating micro-step has no finite check and keeps the scale.
        dynamic = isinstance(context.options.loss_scaling, DynamicLossScaling)
        return dynamic and Fact.FINITE_CHECKED in context.facts

    def run(self, context: PassContext) -> PassResult:
        scaling = context.options.loss_scaling
        assert isinstance(scaling, DynamicLossScaling)  # applies() checked it
        good = add_state(context, "loss_scale.good", "int32", 0)
        bad = add_state(context, "loss_scale.bad", "int32", 0)
        names = ("loss_scale.scale", good, bad)
        node = add_node(
            context,
            NodeKind.SCALE_UPDATE,
            ["found_inf", *names],
            [(f"{n}.next", context.graph.tensors[n].dtype) for n in names],
            Rule.SCALE_UPDATE,
            scaling.describe(),
            params={
                "init_loss_scaling": scaling.init_loss_scaling,
                "incr_every_n_steps": scaling.incr_every_n_steps,
                "decr_every_n_nan_or_inf": scaling.decr_every_n_nan_or_inf,
                "incr_ratio": scaling.incr_ratio,
                "decr_ratio": scaling.decr_ratio,
                "min_loss_scaling": scaling.min_loss_scaling,
            },
        )
        for name, output in zip(names, node.outputs, strict=True):
            add_output(context, output, name)
        return PassResult(modified=True)
