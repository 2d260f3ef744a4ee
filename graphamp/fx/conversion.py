"""Converting a PyTorch model with the engine: the policy for a device, and the conversion."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx, nn

from graphamp import engine
from graphamp.core import collector
from graphamp.core.vocab import ListName, Precision, Rule
from graphamp.errors import (
    BackwardWarning,
    Float8Warning,
    GraphampError,
    KeptWarning,
    ModeWarning,
    SlowPrecisionWarning,
    StaticShapeWarning,
    UnlistedOpWarning,
    warn,
)
from graphamp.fx.dialect import float8_convert, float8_step
from graphamp.fx.dialect.capture import Captured
from graphamp.fx.dialect.plugin import FxDialect
from graphamp.passes.options import Options
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy
from graphamp.training.float8 import Float8

Model = nn.Module | torch.export.ExportedProgram


def dtype_name(value: Any) -> Any:
    """A ``torch.dtype`` as the name a policy takes (``torch.bfloat16`` -> ``"bfloat16"``);
    any other value as it is (a name, or something the policy refuses in one line)."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def fx_policy(
    model: Model,
    policy: Policy | None,
    device: str | None,
    overrides: dict[str, Any],
    where: str = "graphamp.fx.convert()",
) -> Policy:
    """The policy for a PyTorch model: PyTorch's autocast lists for ``device`` (default: the
    device of the model's parameters), bfloat16 on the CPU and float16 on CUDA by default."""
    if device is None:
        params = list(model.parameters()) if isinstance(model, nn.Module) else []
        device = "cuda" if params and params[0].is_cuda else "cpu"
    if device not in ("cpu", "cuda"):
        raise GraphampError(f"device={device!r}: choose 'cpu' or 'cuda'")
    if "dtype" in overrides:
        overrides["dtype"] = dtype_name(overrides["dtype"])
    if policy is None:
        overrides.setdefault("dtype", "bfloat16" if device == "cpu" else "float16")
        policy = Policy.create(dialect=f"fx_{device}", where=where, **overrides)
    elif overrides:
        raise GraphampError("pass either a policy or keyword overrides, not both")
    elif not policy.dialect.startswith("fx_"):
        raise GraphampError(
            f"the policy was made for {policy.dialect!r} graphs: create it with "
            f"dialect='fx_{device}'"
        )
    if device == "cpu" and not cpu_has_native(policy.dtype):
        warn(
            f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no {policy.dtype} "
            f"matrix instructions ({_NATIVE_CHECKS[policy.dtype][1]}): PyTorch emulates "
            f"{policy.dtype} matrix products here, tens of times slower than float32. The "
            "results are right; for speed, run on a CPU with them or on a GPU",
            SlowPrecisionWarning,
        )
    return policy


def analyse(
    model: Model,
    example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
    *,
    example_kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    policy: Policy,
    weights: str = "master",
    strict: bool = False,
) -> engine.Analysis:
    """Capture ``model`` and run the passes: its graph and plan; nothing is converted."""
    dialect = FxDialect(
        weights=weights,
        example_inputs=example_inputs,
        example_kwargs=example_kwargs,
        dynamic_shapes=dynamic_shapes,
    )
    return engine.analyse(model, policy, dialect=dialect, options=Options(strict=strict))


def convert(
    model: Model,
    example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
    *,
    example_kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    policy: Policy | None = None,
    device: str | None = None,
    weights: str = "master",
    calibrate: Iterable[Any] | None = None,
    strict: bool = False,
    fp8: Float8 | None = None,
    _float8_marks: str = "",
    _for_step: bool = False,
    **policy_overrides: Any,
) -> tuple[fx.GraphModule, Plan]:
    """Convert ``model`` to a mixed-precision GraphModule; returns it and its Plan.

    ``model`` may be an ``nn.Module`` (captured with torch.export on ``example_inputs``, a
    tuple or one tensor, and ``example_kwargs``), a ``GraphModule`` or an ``ExportedProgram``;
    it is never changed.
    ``dynamic_shapes`` has torch.export's meaning; left out, the first dimension of every input
    tensor of two or more dimensions is dynamic where the model allows it (a
    :class:`~graphamp.errors.StaticShapeWarning` names the inputs where it does not), and
    ``"static"`` keeps the example's shapes. ``device`` picks the default lists ("cpu":
    PyTorch's CPU autocast lists, default dtype bfloat16; "cuda": its CUDA lists, default
    float16); by default the device of the model's parameters. ``weights`` is "master"
    (float32 parameters, cast at use) or "low" (stored in the target type where only
    low-precision ops read them). ``calibrate`` (batches: tuples of the module's arguments,
    single tensors, or dicts of arrays by input name) runs the float32 module on each and keeps
    float32, with rule ``range``, every op whose values there leave the target type's range
    (see :mod:`graphamp.numerics.ranges`). ``strict`` makes a policy rule that matches nothing
    in the model (a :class:`~graphamp.errors.PolicyWarning`) an error. :func:`graphamp.fx.save`
    writes the result as a ``.pt2`` program. ``fp8`` (a :class:`graphamp.Float8`: ``current()``,
    or ``static()`` with ``calibrate``) puts the layers its rules choose in float8
    (:mod:`graphamp.fx.dialect.float8_convert`); ``_float8_marks`` marks them for a training step to
    trace instead (:func:`converted_for_step`).
    """
    check_arguments(
        "graphamp.fx.convert()",
        policy=policy,
        strict=strict,
        fp8=fp8,
        example_kwargs=example_kwargs,
        calibrate=calibrate,
    )
    dialect = FxDialect(
        weights=weights,
        example_inputs=example_inputs,
        example_kwargs=example_kwargs,
        dynamic_shapes=dynamic_shapes,
    )
    policy = fx_policy(model, policy, device, policy_overrides)
    if not _for_step:
        _warn_training_mode(model)
    with collector.paused():  # one block: no full collection between capturing and applying
        captured = dialect.load(model)
        _warn_static_batches(captured.meta["graphamp"])
        if _for_step:
            _warn_autograd_functions(captured.meta["graphamp"])
        ranges = None  # float8's range rule reads the matrix operands' histograms too
        if calibrate is not None:
            ranges = dialect.calibrate(captured, calibrate, histograms=fp8 is not None)
        analysis = engine.analyse_model(
            dialect,
            captured,
            policy,
            options=Options(ranges=ranges, strict=strict, fp8=fp8),
            label=dialect.label(model),
        )
        warn_unlisted_library_ops(analysis)
        if not _converted_by_graphamp(model):  # its float32 ops are its own decisions
            _warn_kept(analysis.plan, policy)
        result = engine.apply(analysis)  # the plan is kept with the module (FxDialect.keep_plan)
    if fp8 is not None:
        if _float8_marks:
            float8_step.mark(result.model, result.plan, weights=_float8_marks)
        else:
            float8_convert.lower(result.model, result.plan, fp8)
        _warn_no_float8(result.plan, "train_step" if _float8_marks else "convert")
    return result.model, result.plan


def check_arguments(
    where: str,
    *,
    policy: Any = None,
    strict: Any = False,
    fp8: Any = None,
    example_kwargs: Any = None,
    keep_model: Any = False,
    calibrate: Any = None,
) -> None:
    """Arguments of the fx entry points whose wrong type would otherwise pass silently
    (``strict="no"`` is true) or fail deep inside: one line naming the argument."""
    if policy is not None and not isinstance(policy, Policy):
        raise GraphampError(f"{where}: policy is a graphamp.Policy, got {type(policy).__name__}")
    for name, value in (("strict", strict), ("keep_model", keep_model)):
        if not isinstance(value, bool):
            raise GraphampError(f"{where}: {name} is True or False, got {value!r}")
    if fp8 is not None and not isinstance(fp8, Float8):
        raise GraphampError(
            f"{where}: fp8 is a graphamp.Float8 (Float8.current(), Float8.static()), got {fp8!r}"
        )
    if example_kwargs is not None and not isinstance(example_kwargs, dict):
        raise GraphampError(
            f"{where}: example_kwargs is a dict of keyword arguments, got "
            f"{type(example_kwargs).__name__}"
        )
    if calibrate is not None and (
        isinstance(calibrate, torch.Tensor | str | bytes | dict)
        or not hasattr(calibrate, "__iter__")
    ):  # a tensor's rows would be taken for batches
        raise GraphampError(
            f"{where}: calibrate is batches (a list of argument tuples, tensors or dicts), got "
            f"{type(calibrate).__name__}: pass [batch] for one batch"
        )


def converted_for_step(
    model: Model, inputs: tuple[Any, ...], policy: Policy, fp8: Float8 | None, weights: str
) -> tuple[fx.GraphModule, Plan]:
    """``model`` converted for a training step to trace through: shapes static (a step is
    captured per batch signature), master weights, the float8 layers marked with their weight
    read as ``weights`` ("master", or "low": its low-type copy, what a sharded step gathers)."""
    with warnings.catch_warnings():  # the step warned of a slow type once, with the policy
        warnings.simplefilter("ignore", SlowPrecisionWarning)
        return convert(
            model,
            inputs,
            dynamic_shapes="static",
            policy=policy,
            fp8=fp8,
            _float8_marks=weights,
            _for_step=True,
        )


def warn_unlisted_library_ops(analysis: engine.Analysis) -> None:
    """One :class:`~graphamp.errors.UnlistedOpWarning` per op registered outside PyTorch that
    computes on floats and stays float32 only because no list names it: PyTorch's autocast
    lists cannot know a library's ops, and such an op may be the model's matrix products
    (transformers' MoE experts call ``transformers::grouped_mm_fallback``)."""
    callers: dict[str, list[str]] = {}
    for node in analysis.graph.nodes.values():
        decision = analysis.plan.nodes.get(node.name)
        if (
            decision is None
            or decision.rule is not Rule.UNLISTED
            or decision.precision is not Precision.FLOAT32
            or node.domain in ("", "graphamp")  # graphamp's own ops are placed by its passes
            or not (node.follow_inputs or node.follow_outputs)
        ):
            continue
        callers.setdefault(f"{node.domain}::{node.op}", []).append(node.name)
    low = analysis.plan.dtype
    for op, names in callers.items():
        who = (
            f"nodes {names[0]!r} and {len(names) - 1} more call"
            if names[1:]
            else (f"node {names[0]!r} calls")
        )
        short = op.split("::", 1)[1]
        warn(
            f"{who} {op}, an op registered outside PyTorch that no "
            f"op list names: it stays float32 (rule unlisted). If it computes in its inputs' "
            f"type, allow=[{short!r}] runs it in {low}",
            UnlistedOpWarning,
        )


# Modules whose forward differs in training mode, as torch.export captures it
_MODE_DEPENDENT = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _warn_training_mode(model: Model) -> None:
    """A dropout or batch norm in training mode (``nn.Module``'s default) is captured as it
    trains: it drops, or updates its statistics, at every call of the converted module, which
    cannot be switched to eval mode afterwards (torch.export's modules refuse ``.eval()``).
    Each submodule's own mode counts (a model in eval mode with one dropout left training
    drops)."""
    if not isinstance(model, nn.Module):
        return
    moded = next(
        (
            (name, sub)
            for name, sub in model.named_modules()
            if isinstance(sub, _MODE_DEPENDENT)
            and sub.training
            and not (isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p == 0)
        ),
        None,
    )
    if moded is not None:
        name, sub = moded
        warn(
            f"{name or type(model).__name__!r} ({type(sub).__name__}) is in training mode, and "
            "so captured as it trains (dropout drops, batch norm updates its statistics at "
            "each call of the converted module); call model.eval() before converting for "
            "inference",
            ModeWarning,
        )


def _converted_by_graphamp(model: Model) -> bool:
    """Whether ``model`` is a module graphamp.fx.convert returned (it carries its plan)."""
    captured = model.meta.get("graphamp") if isinstance(model, fx.GraphModule) else None
    return getattr(captured, "plan", None) is not None


def _warn_kept(plan: Plan, policy: Policy) -> None:
    """Say so where allow-list ops stay float32 because the module already computes some ops
    low: silent, a bfloat16 submodule or example input left a model's products float32 (the
    command line says "nothing converted"; the Python API said nothing)."""
    kept = [
        d
        for d in plan.nodes.values()
        if d.rule is Rule.KEPT and policy.list_of(d.op)[0] == ListName.ALLOW
    ]
    low = next((n for n, d in plan.nodes.items() if d.rule is Rule.ALREADY_LOW), None)
    if kept and low is not None:
        warn(
            f"{len(kept)} allow-list ops stay float32 (rule kept): the module already computes "
            "ops in "
            f"{plan.nodes[low].precision} (first: {low!r}), and graphamp holds the float32 ops "
            "of such a module as a converted model's decisions. To have every op decided, "
            "convert the float32 module (its parameters and example inputs float32); "
            "allow_names lowers chosen nodes",
            KeptWarning,
        )


def _warn_autograd_functions(captured: Captured) -> None:
    """A step differentiates the captured forward in its own graph, through a custom
    autograd.Function's forward: its backward is never called. Where that backward is the
    forward's derivative (BLOOM's GeLUFunction, a fused kernel's) nothing changes; where it is
    not (a gradient reversal, a straight-through estimator) the step trains with other
    gradients than eager code: one BackwardWarning naming the classes."""
    functions = captured.autograd_functions
    if functions:
        warn(
            f"train_step(): the model applies the custom torch.autograd.Function "
            f"{', '.join(functions)}; the step differentiates its forward and never calls its "
            "backward: the gradients are those of eager code only where that backward is the "
            "forward's derivative (a gradient reversal would keep its sign, a straight-through "
            "estimator would pass no gradient)",
            BackwardWarning,
        )


def _warn_no_float8(plan: Plan, where: str) -> None:
    """Say so where float8 was asked for and no product got it (every layer under torchao's
    size table, a model without linear layers): the run was a plain low-precision one."""
    decided = plan.fp8.values()
    if any(d.rule is Rule.FP8 for d in decided):
        return
    counts = Counter(str(d.rule) for d in decided)
    why = ", ".join(f"{n} by {rule}" for rule, n in sorted(counts.items())) or "none decided low"
    first = min(plan.fp8.items(), default=None)
    example = f"; {first[0]!r}: {first[1].reason}" if first else ""
    warn(
        f"{where}(fp8=...): no matrix product runs in float8 ({why}){example}",
        Float8Warning,
    )


def _warn_static_batches(captured: Captured) -> None:
    inputs = captured.static_batches
    if inputs:
        cause = captured.static_cause or (
            "torch.export fixes sizes 0 and 1, and the model's code can fix others: give an "
            "example batch of 2 or more, or pass dynamic_shapes"
        )
        warn(
            f"the first dimension of input {', '.join(inputs)} stays static: the converted module "
            f"runs only at that size there ({cause})",
            StaticShapeWarning,
        )


# oneDNN's own tests for low-precision matrix units, and the units they look for
_NATIVE_CHECKS = {
    "bfloat16": ("_is_mkldnn_bf16_supported", "avx512_bf16 or AMX"),
    "float16": ("_is_mkldnn_fp16_supported", "avx512_fp16 or AMX-FP16"),
}


def cpu_has_native(dtype: str) -> bool:
    """Whether this CPU multiplies ``dtype`` matrices in hardware. Unknown answers count as yes:
    the check only decides whether to warn."""
    if dtype not in _NATIVE_CHECKS:
        return True
    try:
        return bool(getattr(torch.ops.mkldnn, _NATIVE_CHECKS[dtype][0])())
    except (AttributeError, RuntimeError):
        return True
