"""Reading a torch.fx GraphModule into the neutral OpGraph.

Per-slot rules come from the aten schema of each op: a tensor argument (``Tensor``,
``Tensor?``, ``Tensor[]``) holding a float value carries the computation type, and so does a
float tensor result. An op that writes an argument in place (``Tensor(a!)``) or updates running
statistics (batch norm) must not have them cast (the write would land in a temporary): only
its data input follows, and every parameter stays float32, as autocast calls such kernels.

Names are stable identities, so that a plan survives edits elsewhere in the model: an op is
``<module path>/<op>`` (``layers.0.attention.query/linear``; ``_1``, ``_2`` for repeats in one
module, in graph order), a parameter its module path, an input its argument name.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from graphamp.dialects.base import ReadGraph
from graphamp.dtypes import FLOAT_TYPES
from graphamp.errors import GraphampError
from graphamp.fx.types import dtype_name
from graphamp.graph import NodeKind, OpGraph, OpNode, Role, TensorInfo

CAST_OPS = frozenset({"_to_copy", "to", "_convert_element_type"})
RUNNING_STATS = frozenset({"running_mean", "running_var"})
SCHEMA_SOURCE = "aten"


@dataclass
class FxHandles:
    """The fx nodes the OpGraph's tensor names stand for (each value is the node producing it),
    and the program they were captured from, if any."""

    nodes: dict[str, fx.Node]
    program: Any = None


def read(
    module: fx.GraphModule,
    *,
    master_weights: bool,
    roles: dict[str, tuple[Role, str | None]] | None = None,
) -> ReadGraph:
    """The OpGraph of ``module``'s graph. With master weights, parameters are not stored
    values to convert but inputs to cast at run time. ``roles`` marks values of a training
    step (fx node name -> role and, for updates, the name of the value replaced)."""
    graph = OpGraph("fx")
    names = stable_names(module)
    for node in module.graph.nodes:
        name = names.get(node.name, node.name)
        if node.op in ("placeholder", "get_attr"):
            graph.add_tensor(_leaf(module, node, name, master_weights))
        elif node.op == "call_function" and node.target is not operator.getitem:
            outputs = _outputs(node, names)
            for output in outputs:
                graph.add_tensor(output)
            graph.add_node(_read_call(node, name, [t.name for t in outputs], graph, names))
        elif node.op == "call_module" and not node.name.startswith("_guards"):
            raise GraphampError(
                f"node {node.name!r}: call_module {node.target!r} is not supported "
                "after torch.export"
            )
        elif node.op == "output":
            for arg in flat(node.args[0]):
                if isinstance(arg, fx.Node) and names.get(arg.name) in graph.tensors:
                    graph.graph_outputs.append(names[arg.name])
                    graph.tensors[names[arg.name]].is_graph_output = True
    graph.graph_inputs = [names[n.name] for n in module.graph.nodes if n.op == "placeholder"]
    for fx_name, (role, replaces) in (roles or {}).items():
        tensor = graph.tensors[names.get(fx_name, fx_name)]
        tensor.role = role
        tensor.replaces = names.get(replaces, replaces) if replaces else None
    if not any(t.is_float for t in graph.tensors.values()):
        raise GraphampError("the module computes on no floating-point tensor: nothing to convert")
    by_name = {n.name: n for n in module.graph.nodes}
    return ReadGraph(graph, module, FxHandles({names.get(n, n): v for n, v in by_name.items()}))


def _leaf(module: fx.GraphModule, node: fx.Node, name: str, master_weights: bool) -> TensorInfo:
    """A placeholder (a caller's argument: its type is fixed) or a stored attribute."""
    tensor = _tensor(name, node.meta.get("val"))
    tensor.is_graph_input = tensor.type_fixed = node.op == "placeholder"
    if node.op == "get_attr":
        stored = attribute(module, node.target)  # type: ignore[arg-type]
        tensor.dtype = dtype_name(getattr(stored, "dtype", None))
        if isinstance(stored, torch.Tensor):
            tensor.shape = tuple(int(d) for d in stored.shape)
            if not master_weights:
                tensor.load_value = lambda v=stored: v.detach().cpu().float().numpy()
    return tensor


def stable_names(module: fx.GraphModule) -> dict[str, str]:
    """fx node name -> stable identity (see the module docstring)."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            names[node.name] = str(node.target)
        elif node.op == "placeholder":
            names[node.name] = node.name
        elif node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0].name  # type: ignore[union-attr]
            names[node.name] = f"{names.get(source, source)}.{node.args[1]}"
        elif node.op == "call_function":
            scope = _scope(node)
            base = f"{scope}/{op_name(node)}" if scope else op_name(node)
            count = seen.get(base, 0)
            seen[base] = count + 1
            names[node.name] = base if count == 0 else f"{base}_{count}"
    return names


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target))


def _scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    return list(stack.values())[-1][0] if stack else ""


def flat(value: object) -> list[object]:
    if isinstance(value, tuple | list):
        return [item for element in value for item in flat(element)]
    if isinstance(value, dict):
        return [item for element in value.values() for item in flat(element)]
    return [value]


def _outputs(node: fx.Node, names: dict[str, str]) -> list[TensorInfo]:
    """One tensor per output; a tuple's elements are ``<name>.<index>``, the names the
    getitem nodes that read them get."""
    value = node.meta.get("val")
    if isinstance(value, tuple | list):
        return [_tensor(f"{names[node.name]}.{i}", v) for i, v in enumerate(value)]
    return [_tensor(names[node.name], value)]


def _tensor(name: str, value: object) -> TensorInfo:
    """A tensor of the traced value's type and shape (symbolic dimensions as text)."""
    shape = getattr(value, "shape", None)
    dims = None
    if shape is not None:
        dims = tuple(d if isinstance(d, int) else str(d) for d in shape)
    return TensorInfo(name, dtype_name(getattr(value, "dtype", None)), dims)


def _read_call(
    node: fx.Node, name: str, outputs: list[str], graph: OpGraph, names: dict[str, str]
) -> OpNode:
    args = [arg for arg in flat([node.args, node.kwargs]) if isinstance(arg, fx.Node)]
    inputs = [names.get(arg.name, arg.name) for arg in args]
    op = op_name(node)
    op_node = OpNode(
        name=name,
        op=op,
        inputs=inputs,
        outputs=outputs,
        scope=_scope(node),
        schema_source=SCHEMA_SOURCE,
    )
    if op in CAST_OPS and isinstance(node.kwargs.get("dtype"), torch.dtype):
        op_node.kind = NodeKind.CAST
        op_node.cast_to = dtype_name(node.kwargs["dtype"])
        return op_node
    follow_in = _follow_inputs(node, args, inputs, graph)
    follow_out = [i for i, out in enumerate(outputs) if graph.tensors[out].dtype in FLOAT_TYPES]
    op_node.follow_inputs = frozenset(follow_in)
    op_node.follow_outputs = frozenset(follow_out)
    if follow_in:
        op_node.compute_type = graph.tensors[inputs[follow_in[0]]].dtype
    elif follow_out:
        op_node.compute_type = graph.tensors[outputs[follow_out[0]]].dtype
    op_node.allowed_types = FLOAT_TYPES
    return op_node


def _follow_inputs(
    node: fx.Node, args: list[fx.Node], inputs: list[str], graph: OpGraph
) -> list[int]:
    """The computation-type input slots, from the op's aten schema (module docstring)."""
    tensor_args = _schema_tensor_args(node)
    follow = [
        slot
        for slot, arg in enumerate(args)
        if graph.tensors[inputs[slot]].dtype in FLOAT_TYPES
        and (tensor_args is None or arg.name in tensor_args)
    ]
    if follow and _written_args(node):
        follow = follow[:1]
    return follow


def _schema_tensor_args(node: fx.Node) -> set[str] | None:
    """Names of the fx nodes passed to tensor-typed schema arguments; None without a schema
    (Python functions on shapes, higher-order ops): every float input then follows."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    names: set[str] = set()
    for position, argument in enumerate(schema.arguments):
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        if "Tensor" in str(argument.type):
            names.update(arg.name for arg in flat(value) if isinstance(arg, fx.Node))
    return names


def _written_args(node: fx.Node) -> set[str]:
    """Names of the fx nodes the op writes in place, per its schema (``Tensor(a!)``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return set()
    written = set()
    for position, argument in enumerate(schema.arguments):
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        writes = argument.alias_info is not None and argument.alias_info.is_write
        # aten::batch_norm/instance_norm are composite: their schema does not mark the running
        # statistics they update, so they are named here.
        if isinstance(value, fx.Node) and (writes or argument.name in RUNNING_STATS):
            written.add(value.name)
    return written


def attribute(module: nn.Module, target: str) -> object:
    value: object = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def set_attribute(module: nn.Module, target: str, value: object) -> None:
    *path, last = target.split(".")
    owner: object = module
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, last, value)
