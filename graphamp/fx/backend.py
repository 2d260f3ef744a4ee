"""graphamp as a ``torch.compile`` backend: the user's own model and training loop, each graph
torch.compile captures converted by graphamp's passes, then compiled by inductor.

    compiled = torch.compile(model, backend=graphamp.fx.backend(dtype="bfloat16"))

For each graph Dynamo captures (parameters and buffers are its inputs), the backend

1. traces it into the aten ops of torch.export's training IR (``make_fx`` before autograd,
   on fake inputs of Dynamo's shapes, symbolic ones included), keeping each node's module
   path so name rules and plan names work as with :func:`graphamp.fx.convert`, and attention
   masks that mask nothing dropped as a capture drops them
   (:mod:`graphamp.fx.dialect.attention`);
2. runs the same passes as ``convert`` on it (float32 parameters cast at use, as autocast and
   ``weights="master"`` do) and applies the plan: explicit ``aten._to_copy`` casts, those of
   parameters and inputs just before their first reader, as autocast casts;
3. hands the converted graph to inductor (or another registered backend, ``inner=``), whose
   AOTAutograd derives the backward from it when training: each cast's gradient is a cast back,
   so gradients reach the float32 parameters in float32, as under ``torch.autocast``.

``backend.plans`` holds the plan of every graph converted, in the order Dynamo compiled them.
Loss scaling stays the user's (``torch.amp.GradScaler``), as with autocast.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from graphamp import engine
from graphamp.errors import GraphampError
from graphamp.fx.conversion import check_arguments, fx_policy, warn_unlisted_library_ops
from graphamp.fx.dialect.attention import drop_all_true_masks
from graphamp.fx.dialect.plugin import FxDialect
from graphamp.passes.options import Options
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy


class Backend:
    """A ``torch.compile`` backend converting each captured graph with graphamp (see the
    module docstring); ``plans`` lists the plans of the graphs converted."""

    def __init__(
        self,
        dtype: str | None = None,
        policy: Policy | None = None,
        *,
        device: str | None = None,
        inner: str = "inductor",
        **policy_overrides: Any,
    ) -> None:
        if dtype is not None:
            policy_overrides["dtype"] = dtype
        if policy is not None and policy_overrides:
            raise GraphampError("pass either a policy or keyword overrides, not both")
        self.policy, self.device, self.inner = policy, device, inner
        self.overrides = policy_overrides
        self.plans: list[Plan] = []
        self._policies: dict[str, Policy] = {}
        # the policy and the overrides checked now, not at the model's first call (Dynamo's
        # BackendCompilerFailed around the error)
        check_arguments("graphamp.fx.backend()", policy=policy)
        self._policy_for(device or "cpu")
        try:  # and the inner backend
            if not (isinstance(inner, str) or callable(inner)):
                raise TypeError(inner)
            torch._dynamo.lookup_backend(inner)
        except Exception:
            raise GraphampError(
                f"graphamp.fx.backend(): inner={inner!r} is no torch.compile backend (inductor, "
                "aot_eager, or a name torch._dynamo.list_backends(exclude_tags=()) lists)"
            ) from None

    def __call__(self, graph: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        converted = self.convert(graph, example_inputs)
        return torch._dynamo.lookup_backend(self.inner)(converted, list(example_inputs))

    def convert(self, graph: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
        """The graph Dynamo captured, traced to aten ops and converted; its plan is appended
        to ``plans``. A graph that computes on no floating-point tensor is left as it is."""
        traced = trace(graph, example_inputs)
        device = self.device or _device_of(example_inputs)
        dialect = FxDialect(weights="master")
        try:
            analysis = engine.analyse_model(
                dialect,
                traced,
                self._policy_for(device),
                # a graph after a graph break reads the last one's low outputs: decided by the
                # lists, as autocast decides every op, not held float32 as a converted model's
                options=Options(keep_model_decisions=False),
                label=f"graph {len(self.plans)}",
            )
        except GraphampError as exc:
            if "no floating-point tensor" in str(exc):
                return graph
            raise
        self.plans.append(analysis.plan)
        warn_unlisted_library_ops(analysis)
        converted = engine.apply(analysis).model
        cast_at_first_reader(converted)
        if torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
        ):
            cast_per_reader(converted)
        return converted

    def _policy_for(self, device: str) -> Policy:
        if device not in self._policies:
            where = "graphamp.fx.backend()"
            self._policies[device] = fx_policy(
                torch.nn.Module(), self.policy, device, dict(self.overrides), where
            )
        return self._policies[device]


def backend(
    dtype: str | None = None,
    policy: Policy | None = None,
    *,
    device: str | None = None,
    inner: str = "inductor",
    **policy_overrides: Any,
) -> Backend:
    """A ``torch.compile`` backend that converts each captured graph with graphamp's passes
    before ``inner`` (default inductor) compiles it. ``dtype``, ``policy`` and the overrides
    are those of :func:`graphamp.fx.convert`; ``device`` picks the default lists (default: where
    the graph's inputs are)."""
    return Backend(dtype, policy, device=device, inner=inner, **policy_overrides)


def trace(graph: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """``graph`` (Dynamo's: torch functions and methods) as aten ops before autograd, the ops
    torch.export's training IR holds, traced on fake inputs of the shapes Dynamo saw (its
    symbolic sizes included); nodes keep their module path, placeholders Dynamo's names."""
    from torch._guards import detect_fake_mode
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_mode = detect_fake_mode(list(example_inputs))
    placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
    values = [node.meta.get("example_value") for node in placeholders]
    if fake_mode is None or any(value is None for value in values):
        raise GraphampError("graphamp.fx.backend() is used as torch.compile(backend=...)")
    # Dynamo's fake tensors, copied into the mode of this compilation (one shape environment)
    fakes = [fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in values]

    def run(*args: Any) -> Any:
        return fx.Interpreter(graph).run(*args)

    with fx_traceback.preserve_node_meta(), fake_mode:
        traced = make_fx(run, pre_dispatch=True)(*fakes)
    for node, source in zip(
        (n for n in traced.graph.nodes if n.op == "placeholder"), placeholders, strict=True
    ):
        node._rename(_input_name(source))
    for node in traced.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {
                key: (module_path(path), kind) for key, (path, kind) in stack.items()
            }
    traced.recompile()
    drop_all_true_masks(traced)
    return traced


def cast_at_first_reader(module: fx.GraphModule) -> None:
    """Move each cast of a parameter or input from the top of the graph, where the plan's
    application puts it, to just before its first reader, where autocast casts. The values are
    the same; the backward AOTAutograd derives follows the forward's order, so with the casts at
    the top every weight gradient's cast back to float32 came last, in one kernel after the
    whole backward, each bfloat16 gradient held until then; at the reader each is cast as it is
    made, fused into that layer's kernels as under autocast."""
    graph = module.graph
    order = {node: index for index, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        source = node.args[0] if node.args else None
        if (
            node.target is not torch.ops.aten._to_copy.default
            or not isinstance(source, fx.Node)
            or source.op not in ("placeholder", "get_attr")
            or not node.users
        ):
            continue
        min(node.users, key=order.__getitem__).prepend(node)
    graph.lint()
    module.recompile()


def cast_per_reader(module: fx.GraphModule) -> None:
    """In a graph that will be differentiated, give each reader of a cast activation a cast of
    its own. autograd sums the gradients of a value's readers in the value's type: with one
    shared bfloat16 cast the readers' gradients were summed in bfloat16 before the cast back,
    where autocast (a cast per op) sums them in float32. Casts of parameters and inputs stay
    shared, as autocast's cache of weight casts shares them. Inductor merges the forward
    copies again, so only the backward changes."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten._to_copy.default or len(node.users) < 2:
            continue
        source = node.args[0]
        if not isinstance(source, fx.Node) or source.op in ("placeholder", "get_attr"):
            continue
        for reader in list(node.users)[1:]:
            with graph.inserting_before(reader):  # where autocast casts: at the reader
                copy = graph.call_function(node.target, node.args, dict(node.kwargs))
            copy.meta = dict(node.meta)
            reader.replace_input_with(node, copy)
    graph.lint()
    module.recompile()


# the compiled module as Dynamo names it: ``self`` in its own forward, ``fn`` where Dynamo
# traces from the module's call (an nn.Sequential's graph: ``L['fn']._modules['0']``)
_SELF = re.compile(r"^L\['(self|fn)'\]")
_INDEX = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]")
_CONTAINERS = frozenset({"_modules", "_parameters", "_buffers"})


def module_path(dynamo_path: str) -> str:
    """A module's or parameter's path as ``named_modules``/``named_parameters`` give it
    (``layers.0.attention``, ``fc.weight``) from Dynamo's (``L['self'].layers[0].attention``,
    ``L['self']._modules['fc']._parameters['weight']``, ``L['fn']._modules['0']``); an input's
    name (``L['x']``: ``x``)."""
    path = _INDEX.sub(r".\1", _SELF.sub("", dynamo_path))
    parts = [part for part in path.split(".") if part and part not in _CONTAINERS]
    return ".".join(parts[1:] if parts[:1] == ["L"] else parts)


def _input_name(node: fx.Node) -> str:
    """A placeholder's name from the parameter, buffer or input Dynamo read for it."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    path = module_path(name() if callable(name) else name) if name else ""
    return re.sub(r"\W", "_", path) or node.name


def _device_of(example_inputs: Sequence[Any]) -> str:
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    return "cuda" if any(t.is_cuda for t in tensors) else "cpu"
