"""The PyTorch dialect: capture a module as a torch.fx graph, decide precisions with the same
passes as ONNX, and return a mixed-precision ``GraphModule``.

Capture uses ``torch.export`` into the training IR, whose op names (``linear``, ``matmul``,
``layer_norm``, ...) are the ones PyTorch's autocast lists name, and whose nodes carry their
module path (``nn_module_stack``), which name rules match. Casts are explicit
``aten._to_copy(x, dtype=...)`` nodes, one per (value, dtype), so autograd flows through them
and ``torch.compile`` sees them.

Weights: ``weights="master"`` keeps float32 parameters and casts each once per call where it
is used in low precision (training: gradients arrive in float32); ``weights="low"`` stores
parameters read only in low precision in the target type (inference: half the memory).
"""

from __future__ import annotations

import logging
import operator
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from graphamp.errors import GraphampError, SlowPrecisionWarning
from graphamp.graph import FLOAT_TYPES, NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.passes import run_passes
from graphamp.plan import Plan
from graphamp.policy import Policy
from graphamp.training import DynamicLossScaling, StaticLossScaling, TrainStep, train_step

log = logging.getLogger(__name__)

__all__ = ["DynamicLossScaling", "StaticLossScaling", "TrainStep", "convert", "train_step"]

_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}
CAST_OPS = frozenset({"_to_copy", "to", "_convert_element_type"})
RUNNING_STATS = frozenset({"running_mean", "running_var"})


def dtype_name(dtype: object) -> str:
    if isinstance(dtype, torch.dtype):
        return _DTYPES.get(dtype) or str(dtype).removeprefix("torch.")
    return "unknown"


@dataclass
class FxGraph:
    """An OpGraph with the fx nodes its names stand for."""

    graph: OpGraph
    module: fx.GraphModule
    nodes: dict[str, fx.Node]  # OpGraph tensor name -> the fx node that produces it


def capture(
    model: nn.Module | torch.export.ExportedProgram, example_inputs: tuple[Any, ...] | None
) -> fx.GraphModule:
    """A fresh GraphModule in torch.export's training IR; ``model`` is not changed."""
    if isinstance(model, torch.export.ExportedProgram):
        program = model
    elif isinstance(model, nn.Module):
        if example_inputs is None:
            raise GraphampError(
                f"{type(model).__name__}: example_inputs are needed to capture "
                "the module with torch.export"
            )
        try:
            program = torch.export.export(model, tuple(example_inputs))
        except (
            Exception
        ) as exc:  # torch.export raises many types; the first line names the construct
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GraphampError(
                f"{type(model).__name__}: torch.export could not capture it: {first[:300]}"
            ) from None
    else:
        raise GraphampError(
            f"expected an nn.Module, GraphModule or ExportedProgram, got {type(model).__name__}"
        )
    return program.module()


def _val_dtype(node: fx.Node) -> str:
    value = node.meta.get("val")
    return dtype_name(getattr(value, "dtype", None))


def _op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target))


def _scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else ""


def read(module: fx.GraphModule, *, master_weights: bool) -> FxGraph:
    """The OpGraph of ``module``'s graph. With master weights, parameters are not stored
    values to convert but inputs to cast at run time.

    Names are stable identities, so that a plan survives edits elsewhere in the model: an op is
    ``<module path>/<op>`` (``layers.0.attention.query/linear``; ``_1``, ``_2`` for repeats in
    one module, in graph order), a parameter its module path, an input its argument name.
    """
    graph = OpGraph("fx")
    graph.inputs_fixed = True  # a caller passes float32 tensors: inputs are never retyped
    names = _stable_names(module)
    for node in module.graph.nodes:
        name = names.get(node.name, node.name)
        if node.op in ("placeholder", "get_attr"):
            tensor = TensorInfo(name, _val_dtype(node), is_graph_input=node.op == "placeholder")
            if node.op == "get_attr":
                value = _attr(module, node.target)  # type: ignore[arg-type]
                tensor.dtype = dtype_name(getattr(value, "dtype", None))
                if not master_weights and isinstance(value, torch.Tensor):
                    tensor.load_value = lambda v=value: v.detach().cpu().float().numpy()
            graph.add_tensor(tensor)
        elif node.op == "call_function" and node.target is not operator.getitem:
            outputs = _outputs(node, names)
            for output, dtype in outputs:
                graph.add_tensor(TensorInfo(output, dtype))
            graph.add_node(_read_call(node, name, [output for output, _ in outputs], graph, names))
        elif node.op == "call_module" and not node.name.startswith("_guards"):
            raise GraphampError(
                f"node {node.name!r}: call_module {node.target!r} is not supported "
                "after torch.export"
            )
        elif node.op == "output":
            for arg in _flat(node.args[0]):
                if isinstance(arg, fx.Node) and names.get(arg.name) in graph.tensors:
                    graph.graph_outputs.append(names[arg.name])
                    graph.tensors[names[arg.name]].is_graph_output = True
    graph.graph_inputs = [names[n.name] for n in module.graph.nodes if n.op == "placeholder"]
    if not any(t.is_float for t in graph.tensors.values()):
        raise GraphampError("the module computes on no floating-point tensor: nothing to convert")
    by_name = {n.name: n for n in module.graph.nodes}
    return FxGraph(graph, module, {names.get(n, n): node for n, node in by_name.items()})


def _stable_names(module: fx.GraphModule) -> dict[str, str]:
    """fx node name -> stable identity (see :func:`read`)."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            names[node.name] = str(node.target)
        elif node.op == "placeholder":
            names[node.name] = node.name
        elif node.op == "call_function" and node.target is operator.getitem:
            names[node.name] = f"{names.get(node.args[0].name, node.args[0].name)}.{node.args[1]}"  # type: ignore[union-attr]
        elif node.op == "call_function":
            scope = _scope(node)
            base = f"{scope}/{_op_name(node)}" if scope else _op_name(node)
            count = seen.get(base, 0)
            seen[base] = count + 1
            names[node.name] = base if count == 0 else f"{base}_{count}"
    return names


def _flat(value: object) -> list[object]:
    if isinstance(value, tuple | list):
        return [item for element in value for item in _flat(element)]
    if isinstance(value, dict):
        return [item for element in value.values() for item in _flat(element)]
    return [value]


def _outputs(node: fx.Node, names: dict[str, str]) -> list[tuple[str, str]]:
    """(tensor name, dtype) per output; a tuple's elements are ``<name>.<index>``, the names
    the getitem nodes that read them get."""
    value = node.meta.get("val")
    if isinstance(value, tuple | list):
        return [
            (f"{names[node.name]}.{i}", dtype_name(getattr(v, "dtype", None)))
            for i, v in enumerate(value)
        ]
    return [(names[node.name], dtype_name(getattr(value, "dtype", None)))]


def _read_call(
    node: fx.Node, name: str, outputs: list[str], graph: OpGraph, names: dict[str, str]
) -> OpNode:
    inputs = [
        names.get(arg.name, arg.name)
        for arg in _flat([node.args, node.kwargs])
        if isinstance(arg, fx.Node)
    ]
    op = _op_name(node)
    op_node = OpNode(name=name, op=op, inputs=inputs, outputs=outputs, scope=_scope(node))
    if op in CAST_OPS and isinstance(node.kwargs.get("dtype"), torch.dtype):
        op_node.kind = NodeKind.CAST
        op_node.attrs["to"] = dtype_name(node.kwargs["dtype"])
        return op_node
    follow_in = [i for i, name in enumerate(inputs) if graph.tensors[name].dtype in FLOAT_TYPES]
    if _written_args(node) and follow_in:
        # An op that updates running statistics in place (batch norm) must not have them cast
        # (the write would land in a temporary); PyTorch's kernels then want the data input
        # alone in low precision and every parameter in float32, as autocast calls them.
        follow_in = follow_in[:1]
    follow_out = [i for i, name in enumerate(outputs) if graph.tensors[name].dtype in FLOAT_TYPES]
    op_node.follow_inputs = frozenset(follow_in)
    op_node.follow_outputs = frozenset(follow_out)
    if follow_in:
        op_node.compute_type = graph.tensors[inputs[follow_in[0]]].dtype
    elif follow_out:
        op_node.compute_type = graph.tensors[outputs[follow_out[0]]].dtype
    op_node.allowed_types = FLOAT_TYPES
    return op_node


def _written_args(node: fx.Node) -> set[int]:
    """Indexes (in the flattened fx-node inputs) of arguments the op writes in place, per its
    schema (``Tensor(a!)``): casting one would send the write to a temporary copy."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return set()
    written_nodes = set()
    for position, argument in enumerate(schema.arguments):
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        writes = argument.alias_info is not None and argument.alias_info.is_write
        # aten::batch_norm/instance_norm are composite: their schema does not mark the running
        # statistics they update, so they are named here.
        if isinstance(value, fx.Node) and (writes or argument.name in RUNNING_STATS):
            written_nodes.add(value.name)
    flat = [arg for arg in _flat([node.args, node.kwargs]) if isinstance(arg, fx.Node)]
    return {index for index, arg in enumerate(flat) if arg.name in written_nodes}


def _attr(module: nn.Module, target: str) -> object:
    value: object = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _set_attr(module: nn.Module, target: str, value: object) -> None:
    *path, last = target.split(".")
    owner: object = module
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, last, value)


def apply(fx_graph: FxGraph, plan: Plan) -> fx.GraphModule:
    """Apply ``plan.edits`` to the captured module (modified in place and returned)."""
    module, graph, edits = fx_graph.module, fx_graph.module.graph, plan.edits
    values = dict(fx_graph.nodes)  # tensor name -> fx node holding it; grows with the casts
    body = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))

    def after(source: fx.Node):  # type: ignore[no-untyped-def]
        # Casts of inputs and parameters go at the top of the body, after every placeholder.
        return (
            graph.inserting_before(body)
            if source.op in ("placeholder", "get_attr")
            else graph.inserting_after(source)
        )

    for record in edits.weights:
        source = values[record.name]
        param = _attr(module, source.target)  # type: ignore[arg-type]
        converted = nn.Parameter(
            param.detach().to(_TORCH_DTYPES[record.dst]),  # type: ignore[attr-defined]
            requires_grad=False,
        )
        if record.in_place:
            _set_attr(module, source.target, converted)  # type: ignore[arg-type]
        else:
            target = record.stored_as.replace(".", "_")
            module.register_parameter(target, converted)
            with after(source):
                values[record.stored_as] = graph.get_attr(target)

    for record in edits.casts:
        source = values[record.tensor]
        with after(source):
            values[record.output] = graph.call_function(
                torch.ops.aten._to_copy.default, (source,), {"dtype": _TORCH_DTYPES[record.dst]}
            )

    op_nodes = fx_graph.graph.nodes
    for (node_name, slot), tensor in edits.rewire.items():
        old = op_nodes[node_name].inputs[slot]
        values[node_name].replace_input_with(values[old], values[tensor])

    for node_name, dtype in edits.retarget_casts.items():
        node = values[node_name]
        node.kwargs = {**node.kwargs, "dtype": _TORCH_DTYPES[dtype]}
    for node_name in edits.remove_nodes:
        node = values[node_name]
        node.replace_all_uses_with(node.args[0])  # type: ignore[arg-type]
        graph.erase_node(node)

    output = next(n for n in graph.nodes if n.op == "output")
    for record in edits.output_casts:  # kept outputs: the low value cast back for the caller
        source = values[record.output]
        with graph.inserting_before(output):
            cast = graph.call_function(
                torch.ops.aten._to_copy.default, (source,), {"dtype": _TORCH_DTYPES[record.dst]}
            )
        output.replace_input_with(source, cast)

    graph.lint()
    module.recompile()
    return module


def analyse(
    model: nn.Module | torch.export.ExportedProgram,
    example_inputs: tuple[Any, ...] | None,
    *,
    policy: Policy,
    weights: str = "master",
) -> tuple[FxGraph, Plan]:
    """Capture ``model`` and run the passes: its graph and plan; nothing is converted."""
    module = capture(model, example_inputs)
    fx_graph = read(module, master_weights=weights == "master")
    return fx_graph, run_passes(fx_graph.graph, policy, model=type(model).__name__)


def convert(
    model: nn.Module | torch.export.ExportedProgram,
    example_inputs: tuple[Any, ...] | None = None,
    *,
    policy: Policy | None = None,
    device: str | None = None,
    weights: str = "master",
    **policy_overrides: Any,
) -> tuple[fx.GraphModule, Plan]:
    """Convert ``model`` to a mixed-precision GraphModule; returns it and its Plan.

    ``model`` may be an ``nn.Module`` (captured with torch.export on ``example_inputs``), a
    ``GraphModule`` or an ``ExportedProgram``; it is never changed. ``device`` picks the
    default lists ("cpu": PyTorch's CPU autocast lists, default dtype bfloat16; "cuda": its
    CUDA lists, default float16); by default the device of the model's parameters.
    ``weights`` is "master" (float32 parameters, cast at use) or "low" (stored in the target
    type where only low-precision ops read them).
    """
    if weights not in ("master", "low"):
        raise GraphampError(f"weights={weights!r}: choose 'master' or 'low'")
    if device is None:
        params = list(model.parameters()) if isinstance(model, nn.Module) else []
        device = "cuda" if params and params[0].is_cuda else "cpu"
    if device not in ("cpu", "cuda"):
        raise GraphampError(f"device={device!r}: choose 'cpu' or 'cuda'")
    if policy is None:
        policy_overrides.setdefault("dtype", "bfloat16" if device == "cpu" else "float16")
        policy = Policy.create(
            dialect=f"fx_{device}", where="graphamp.fx.convert()", **policy_overrides
        )
    elif policy_overrides:
        raise GraphampError("pass either a policy or keyword overrides, not both")
    elif not policy.dialect.startswith("fx_"):
        raise GraphampError(
            f"the policy was made for {policy.dialect!r} graphs: create it with "
            f"dialect='fx_{device}'"
        )
    if device == "cpu" and not cpu_has_native(policy.dtype):
        warnings.warn(
            f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no {policy.dtype} "
            f"matrix instructions ({_NATIVE_CHECKS[policy.dtype][1]}): PyTorch emulates "
            f"{policy.dtype} matrix products here, tens of times slower than float32. The "
            "results are right; for speed, run on a CPU with them or on a GPU",
            SlowPrecisionWarning,
            stacklevel=2,
        )
    fx_graph, plan = analyse(model, example_inputs, policy=policy, weights=weights)
    return apply(fx_graph, plan), plan


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
