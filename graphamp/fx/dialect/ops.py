"""Reading one torch.fx node: the slots that carry its computation type, from its aten schema.

A tensor argument (``Tensor``, ``Tensor?``, ``Tensor[]``) holding a float value carries the
computation type, and so does a float tensor result. An op that writes an argument in place
(``Tensor(a!)``) or updates running statistics (batch norm) must not have them cast (the
write would land in a temporary): only its data input follows, and every parameter stays
float32, as autocast calls such kernels.
"""

from __future__ import annotations

import torch
from torch import fx, nn

from graphamp.core.dtypes import FLOAT_TYPES
from graphamp.core.graph import MatrixDims, NodeKind, OpGraph, OpNode, TensorInfo
from graphamp.errors import InternalError
from graphamp.fx.dialect.types import dtype_name

CAST_OPS = frozenset({"_to_copy", "to", "_convert_element_type"})
# Norms whose kernels take a low input with float32 weight and bias and write the input's type
# (PyTorch's mixed-type norms: how they run under autocast, which casts neither): their
# parameter slots are ``float32_params``.
MIXED_TYPE_NORMS = frozenset(
    {
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "native_group_norm",
        "rms_norm",
        "_fused_rms_norm",
    }
)
RUNNING_STATS = frozenset({"running_mean", "running_var"})
SCHEMA_SOURCE = "aten"


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target))


# torch's own op namespaces; any other op was registered through torch.library (graphamp's
# float8 mark, transformers' MoE experts, a user's own)
TORCHS_OWN = frozenset({"aten", "prims", "_c10d_functional", "c10d_functional"})


def library_of(node: fx.Node) -> str:
    """The namespace of an op registered outside torch's own (``"transformers"`` for
    ``transformers::grouped_mm_fallback``); "" for torch's ops and Python functions."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target.namespace not in TORCHS_OWN:
        return target.namespace
    return ""


def module_scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    # torch.export marks nodes a pass added outside any module with a placeholder entry
    paths = [path for key, (path, _) in (stack or {}).items() if key != _NO_MODULE]
    return paths[-1] if paths else ""


_NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"


def flat(value: object) -> list[object]:
    if isinstance(value, tuple | list):
        return [item for element in value for item in flat(element)]
    if isinstance(value, dict):
        return [item for element in value.values() for item in flat(element)]
    return [value]


def outputs_of(node: fx.Node, names: dict[str, str]) -> list[TensorInfo]:
    """One tensor per output; a tuple's elements are ``<name>.<index>``, the names the
    getitem nodes that read them get."""
    value = node.meta.get("val")
    if isinstance(value, tuple | list):
        return [tensor_info(f"{names[node.name]}.{i}", v) for i, v in enumerate(value)]
    return [tensor_info(names[node.name], value)]


def tensor_info(name: str, value: object) -> TensorInfo:
    """A tensor of the traced value's type and shape (symbolic dimensions as text)."""
    shape = getattr(value, "shape", None)
    dims = None
    if shape is not None:
        dims = tuple(d if isinstance(d, int) else str(d) for d in shape)
    return TensorInfo(name, dtype_name(getattr(value, "dtype", None)), dims)


def known_shape(info: TensorInfo) -> tuple[int, ...]:
    """``info``'s dims, each a size: the shape of the state a pass adds, which it knows."""
    shape = info.shape or ()
    sizes = tuple(d for d in shape if isinstance(d, int))
    if len(sizes) != len(shape):
        raise InternalError(f"{info.name}: new state of unknown dims {list(shape)}")
    return sizes


def read_op(
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
        domain=library_of(node),
        scope=module_scope(node),
        schema_source=SCHEMA_SOURCE,
    )
    if op in CAST_OPS and isinstance(node.kwargs.get("dtype"), torch.dtype):
        op_node.kind = NodeKind.CAST
        op_node.cast_to = dtype_name(node.kwargs["dtype"])
        return op_node
    follow_in = _follow_inputs(node, args, inputs, graph)
    follow_out = [i for i, out in enumerate(outputs) if graph.tensors[out].dtype in FLOAT_TYPES]
    op_node.follow_inputs = frozenset(follow_in)
    if op in MIXED_TYPE_NORMS and not op_node.domain:
        op_node.float32_params = frozenset(follow_in) - {0}  # all but the input normalised
    op_node.follow_outputs = frozenset(follow_out)
    if follow_in:
        written = graph.tensors[outputs[follow_out[0]]].dtype if follow_out else None
        op_node.compute_type = _computed_in(
            [graph.tensors[inputs[slot]] for slot in follow_in], written
        )
    elif follow_out:
        op_node.compute_type = graph.tensors[outputs[follow_out[0]]].dtype
    op_node.allowed_types = FLOAT_TYPES
    op_node.matrix = matrix_dims(node, op)
    return op_node


# Where a matrix op's A and B are among its tensor arguments, and B's axis over N.
_MATRIX_SLOTS = {
    "linear": (0, 1, 0),  # x[..., K], weight[N, K]
    "mm": (0, 1, -1),
    "matmul": (0, 1, -1),
    "bmm": (0, 1, -1),
    "addmm": (1, 2, -1),  # (bias, A, B)
    "baddbmm": (1, 2, -1),
}


def matrix_dims(node: fx.Node, op: str) -> MatrixDims | None:
    """The product a linear, mm, addmm, matmul, bmm or baddbmm computes, from the traced
    shapes: batch dimensions folded into M; a dimension the shapes leave symbolic is None.
    (Convolutions and einsum have none: the float8 pass keeps them in the low type.)"""
    if op not in _MATRIX_SLOTS:
        return None
    a_slot, b_slot, n_axis = _MATRIX_SLOTS[op]
    args = [arg for arg in flat([node.args, node.kwargs]) if isinstance(arg, fx.Node)]
    if len(args) <= b_slot:
        return None
    a, b = (getattr(args[s].meta.get("val"), "shape", None) for s in (a_slot, b_slot))
    if a is None or b is None or len(a) < 1 or len(b) < 2:
        return None

    def known(value: object) -> int | None:
        return value if isinstance(value, int) else None

    rows: int | None = 1
    for size in a[:-1]:  # a batch of A (bmm's too) is more rows of the product
        rows = rows * size if rows is not None and isinstance(size, int) else None
    k = known(a[-1])
    n = known(b[0] if n_axis == 0 else b[-1])
    return MatrixDims(rows, k, n, a=a_slot, b=b_slot, n_axis=n_axis)


def _computed_in(tensors: list[TensorInfo], written: str | None) -> str | None:
    """The type an op computes in, from its computation-type inputs and the type it writes.
    Inputs of one type: that type (a zero-dimensional tensor defers to the others: ``x *
    torch.tensor(0.5)`` stays low). Inputs of several, as PyTorch's kernel treats them, which
    the traced output shows: a low activation into a float32 weight (a graph after a graph
    break, a bfloat16 example input) promotes to float32, an op the model holds in float32,
    not one it already runs low; layer_norm and group_norm take a low input with float32
    parameters and write the input's type, as they run under autocast."""
    shaped = [t.dtype for t in tensors if t.shape != ()] or [t.dtype for t in tensors]
    types = set(shaped)
    if len(types) == 1:
        return shaped[0]
    if written in types:
        return written
    return "float64" if "float64" in types else "float32"


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


def written_arguments(node: fx.Node) -> list[fx.Node]:
    """The nodes ``node`` writes in place, per its op's schema (``Tensor(a!)``; each node of
    a written list too); none where its target has no schema (a Python function, a binding)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    written: list[fx.Node] = []
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        written += [v for v in flat(value) if isinstance(v, fx.Node)]
    return written


def tensor_value(node: object) -> torch.Tensor | None:
    """The (fake) tensor a traced node holds in ``meta["val"]``; None for anything else."""
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def cast_type(node: object) -> torch.dtype | None:
    """The type ``node`` casts to where it is a ``_to_copy`` that changes nothing else (no
    memory format, a strided layout, its source's device); else None."""
    if not isinstance(node, fx.Node) or node.target is not torch.ops.aten._to_copy.default:
        return None
    dtype, source = node.kwargs.get("dtype"), node.args[0]
    if not isinstance(dtype, torch.dtype) or set(node.kwargs) - {"dtype", "layout", "device"}:
        return None
    if node.kwargs.get("layout", torch.strided) != torch.strided:
        return None
    value = tensor_value(source)
    if value is None:
        return None
    return dtype if node.kwargs.get("device", value.device) == value.device else None


def plain_cast(node: object, dtype: torch.dtype, only_reader: fx.Node | None = None) -> bool:
    """Whether ``node`` casts to ``dtype`` and changes nothing else (:func:`cast_type`), its
    value in its source's strides (a reader given the source reads the same layout), read by
    ``only_reader`` alone when one is given."""
    if not isinstance(node, fx.Node) or cast_type(node) != dtype:
        return False
    value, source = node.meta.get("val"), node.args[0]
    source_value = source.meta.get("val") if isinstance(source, fx.Node) else None
    if not isinstance(value, torch.Tensor) or not isinstance(source_value, torch.Tensor):
        return False
    if value.stride() != source_value.stride():
        return False
    return only_reader is None or list(node.users) == [only_reader]


def returns_alias(node: fx.Node) -> bool:
    """Whether ``node``'s op may return (a view of) an input's memory, per its schema."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


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


def value_arg(node: fx.Node, index: int = 0) -> fx.Node:
    """The value ``node`` takes as argument ``index`` (a Cast's input, a cond's predicate)."""
    value = node.args[index]
    if not isinstance(value, fx.Node):
        raise InternalError(f"node {node.name!r}: argument {index} is {value!r}, not a value")
    return value


def attribute(module: nn.Module, target: str) -> object:
    value: object = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def attribute_of(module: nn.Module, node: fx.Node) -> object:
    """What the ``get_attr`` node ``node`` reads in ``module``."""
    if not isinstance(node.target, str):
        raise InternalError(f"node {node.name!r} reads no attribute ({node.target!r})")
    return attribute(module, node.target)


def set_attribute(module: nn.Module, target: str, value: object) -> None:
    *path, last = target.split(".")
    owner: object = module
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, last, value)
