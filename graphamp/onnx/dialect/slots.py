"""Per-slot rules of an ONNX node from its op's schema.

:mod:`graphamp.onnx.dialect.reader` hands each computing node to :func:`computing_node` (once per
signature of op and types), which works on names, types and an attribute getter only. The slots
bound to the type variable of the first float input are the node's computation-type slots; a second
float type variable follows it when its schema admits the target type, except where a runtime needs
float32 (Resize roi, Upsample scales)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from graphamp.core import dtypes
from graphamp.core.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.core.graph import MatrixDims, NodeKind, OpNode, TensorInfo
from graphamp.errors import GraphampError
from graphamp.onnx.dialect import schemas
from graphamp.onnx.dialect.types import type_str_dtype

DEFAULT_DOMAINS = ("", "ai.onnx")
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

# An attribute's value by name (a Python value), or None when the node has none of that name.
AttributeValue = Callable[[str], object]


class NodeId(NamedTuple):
    """What errors and notes name a node by."""

    name: str
    op_type: str
    domain: str


def op_name(op_type: str, domain: str) -> str:
    """The op as the plan names it: an op of another domain is named with it
    (com.microsoft.Attention is not Attention)."""
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}.{op_type}"


def opset_of(opsets: dict[str, int], domain: str) -> int:
    return opsets.get(domain, opsets.get("", 1))


@dataclass(frozen=True)
class Slots:
    """What an op's schema says of the nodes of one signature (op, opset, input and output
    types, which optional slots are given)."""

    kind: NodeKind
    computes: bool = False  # on a float type: the fields below are set
    compute_type: str | None = None
    any_type_inputs: frozenset[int] = frozenset()
    allowed_types: frozenset[str] = frozenset()
    follow_inputs: frozenset[int] = frozenset()
    follow_outputs: frozenset[int] = frozenset()
    schema_note: str = ""
    # an attribute may keep the node float32 (schemas.FLOAT32_WHEN_ATTRIBUTE): asked per node
    attribute_rule: bool = False


def computing_node(
    op_node: OpNode,
    op_type: str,
    tensors: dict[str, TensorInfo],
    output_types: tuple[str, ...],
    opsets: dict[str, int],
    target: str,
    signatures: dict[tuple[object, ...], Slots],
    attribute: AttributeValue,
) -> OpNode:
    """Fill ``op_node`` (an op that is neither a Cast, a Constant nor control flow) from its
    schema. Nodes of one op with the same types get the same slots: the schema work is done
    once per signature (a large graph has few: most nodes repeat a handful of them)."""
    inputs, outputs, domain = op_node.inputs, op_node.outputs, op_node.domain
    input_types = tuple([tensors[name].dtype if name else "" for name in inputs])
    opset = opset_of(opsets, domain)
    # which outputs are given: their number where none is left out (the common case, and
    # cheaper to tell than the pattern of a few)
    given = tuple(map(bool, outputs)) if "" in outputs else len(outputs)
    key = (domain, op_type, opset, input_types, output_types, given)
    slots = signatures.get(key)
    if slots is None:
        node = NodeId(op_node.name, op_type, domain)
        slots = _op_slots(
            node, opset, opsets.get("", 0), inputs, outputs, input_types, output_types, target
        )
        signatures[key] = slots
    op_node.kind = slots.kind
    op_node.any_type_inputs = slots.any_type_inputs
    if not slots.computes:
        return op_node  # no schema (a custom domain), or computes on no float type
    op_node.compute_type = slots.compute_type
    kept = (
        schemas.float32_attribute_note(op_type, domain, attribute) if slots.attribute_rule else ""
    )
    op_node.allowed_types = slots.allowed_types - dtypes.LOW_TYPES if kept else slots.allowed_types
    if slots.schema_note or kept:
        op_node.schema_source += slots.schema_note + kept
    op_node.follow_inputs = slots.follow_inputs
    op_node.follow_outputs = slots.follow_outputs
    if op_node.op in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
        op_node.flops = _matrix_flops(op_node, tensors, attribute)
        op_node.matrix = _matrix_dims(op_node, tensors, attribute)
    elif op_node.op == "Gather":  # which axis it indexes: float8's 8-bit tables need axis 0
        axis = attribute("axis")  # an INT attribute (validated), 0 where not given
        op_node.params = {"axis": axis if isinstance(axis, int) else 0}
    return op_node


def output_type_fallback(
    op_node: OpNode, op_type: str, slot: int, opsets: dict[str, int]
) -> str | None:
    """The type of an output that type inference left untyped, from the node itself: a
    Cast's target, the computation type of a following output, a fixed output type."""
    if op_node.kind is NodeKind.CAST:
        return str(op_node.cast_to)
    if slot in op_node.follow_outputs and op_node.compute_type:
        return op_node.compute_type
    if op_node.kind is NodeKind.OP:
        found = schemas.schema(op_type, opset_of(opsets, op_node.domain), op_node.domain)
        param = found.output_param(slot) if found else None
        if param is not None and found is not None and param not in found.allowed:
            return type_str_dtype(param)
    return None


def _op_slots(
    node: NodeId,
    opset: int,
    default_opset: int,
    inputs: list[str],
    outputs: list[str],
    input_types: tuple[str, ...],
    output_types: tuple[str, ...],
    target: str,
) -> Slots:
    """The slots of ``node`` from its op's schema (the same for every node of its signature;
    errors name the first node of it)."""
    found = schemas.schema(node.op_type, opset, node.domain)
    if found is None:
        if node.domain in DEFAULT_DOMAINS:
            raise GraphampError(
                f"node {node.name!r}: unknown op {node.op_type!r} at opset {default_opset}"
            )
        return Slots(NodeKind.OPAQUE)
    found = schemas.runtime_bound(found, node.op_type, node.domain, input_types, output_types)

    _check_input_types(node, found, inputs, input_types)
    any_type_inputs = schemas.any_type_inputs(found, inputs, len(outputs), target)
    # The computation type: the type variable of the first float (or unknown) input.
    primary: str | None = None
    compute_type: str | None = None
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        if not name or param not in found.allowed or slot in any_type_inputs:
            continue
        dtype = input_types[slot]
        if dtype in FLOAT_TYPES or (dtype == UNKNOWN and "float32" in found.allowed[param]):
            primary, compute_type = param, dtype
            if dtype != UNKNOWN:
                break
    from_attribute = primary is None
    if primary is None:
        for slot, dtype in enumerate(output_types):
            param = found.output_param(slot)
            if param in found.allowed and dtype in FLOAT_TYPES:
                primary, compute_type = param, dtype
                break
    if primary is None:
        return Slots(NodeKind.OP, any_type_inputs=any_type_inputs)  # no float type

    allowed_types = schemas.float_types(found, primary)
    note = schemas.float32_output_note(node.op_type, node.domain, outputs)
    if from_attribute:  # ConstantOfShape's value, RandomNormal's dtype: no writer retypes it
        allowed_types -= dtypes.LOW_TYPES
        note += " (its float output's type is an attribute's, which graphamp does not rewrite)"
    if note:
        allowed_types -= dtypes.LOW_TYPES
    since = schemas.RUNTIME_TYPE_SINCE.get((node.op_type, target))
    if node.domain in DEFAULT_DOMAINS and since is not None and default_opset < since:
        allowed_types -= {target}
        note += f" (onnxruntime loads {node.op_type} in {target} from {since})"
    keep_float32 = schemas.FLOAT32_INPUTS.get(node.op_type, frozenset())
    follow_in = set()
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        if not name or param not in found.allowed or slot in keep_float32:
            continue
        if param == primary or (
            target in found.allowed[param] and input_types[slot] == compute_type
        ):
            follow_in.add(slot)
    follow_inputs = frozenset(follow_in)
    # A slot that carries the computation type follows the node even where its type variable
    # is its own (Attention's V: T2): kernels and function bodies bind it with the others.
    any_type_inputs -= follow_inputs
    # An output follows when its type variable is one a following input binds (Attention's
    # present_value is T2, as V is).
    following = {primary} | {found.input_param(slot) for slot in follow_in}
    follow_outputs = frozenset(
        slot
        for slot in range(len(outputs))
        if outputs[slot] and found.output_param(slot) in following
    )
    return Slots(
        NodeKind.OP,
        computes=True,
        compute_type=compute_type,
        any_type_inputs=any_type_inputs,
        allowed_types=allowed_types,
        follow_inputs=follow_inputs,
        follow_outputs=follow_outputs,
        schema_note=note,
        attribute_rule=node.op_type in schemas.FLOAT32_WHEN_ATTRIBUTE,
    )


def _check_input_types(
    node: NodeId, found: schemas.Schema, inputs: list[str], input_types: tuple[str, ...]
) -> None:
    """Refuse an input whose type the op's schema does not admit (a string into MatMul), or
    two inputs of one type variable with different types (an int32 weight into a float32
    MatMul): a Cast to the low type would be inserted in front of it otherwise."""
    bound: dict[str, tuple[str, str]] = {}  # type variable -> (dtype, input name)
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        if param is None:
            continue
        dtype = input_types[slot] if name else UNKNOWN
        # only tensor type variables: a sequence's element type says nothing here
        admitted_types = found.allowed.get(param, frozenset()) & set(dtypes.BY_NAME)
        if not admitted_types or dtype not in dtypes.BY_NAME:
            continue
        if dtype not in admitted_types:
            admitted = ", ".join(sorted(admitted_types))
            raise GraphampError(
                f"node {node.name!r} ({node.op_type}): input {slot} {name!r} is {dtype}, which "
                f"{node.op_type} does not take (it takes {admitted})"
            )
        first = bound.setdefault(param, (dtype, name))
        if first[0] != dtype and param not in found.heterogeneous:
            raise GraphampError(
                f"node {node.name!r} ({node.op_type}): input {name!r} is {dtype} but "
                f"{first[1]!r} is {first[0]}; {node.op_type} takes one type for both ({param})"
            )


def _matrix_flops(
    op_node: OpNode, tensors: dict[str, TensorInfo], attribute: AttributeValue
) -> int | None:
    inputs = op_node.inputs
    out = tensors[op_node.outputs[0]].shape
    a = tensors[inputs[0]].shape
    b = tensors[inputs[1]].shape if len(inputs) > 1 else None
    transposed = bool(attribute("transA")) if op_node.op == "Gemm" else False
    return _flops(op_node.op, out, a, b, transposed)


def _matrix_dims(
    op_node: OpNode, tensors: dict[str, TensorInfo], attribute: AttributeValue
) -> MatrixDims | None:
    """The GEMM a MatMul, Gemm or Conv computes (None for ConvTranspose, or without B)."""
    inputs = op_node.inputs
    if len(inputs) < 2 or not inputs[1] or op_node.op == "ConvTranspose":
        return None
    a, b = tensors[inputs[0]].shape, tensors[inputs[1]].shape
    # K from A, else from B (a stored weight fixes it where A's last dimension is left
    # symbolic: an attention output reshaped with -1 before its projection)
    if op_node.op == "Gemm":
        trans_a, trans_b = bool(attribute("transA")), bool(attribute("transB"))
        k = _known(_dim(a, 0 if trans_a else 1), _dim(b, 1 if trans_b else 0))
        return MatrixDims(
            _dim(a, 1 if trans_a else 0), k, _dim(b, 0 if trans_b else 1),
            n_axis=0 if trans_b else 1,
        )  # fmt: skip
    if op_node.op == "Conv":
        out = tensors[op_node.outputs[0]].shape
        k = _product(b[1:]) if b else None
        spatial = out[:1] + out[2:] if out else None
        m = _product(spatial) if spatial else None
        return MatrixDims(m, k, _dim(b, 0), n_axis=0)
    rows = a[:-1] if a and len(a) > 1 else None
    m = _product(rows) if rows else None
    n_axis = len(b) - 1 if b else -1
    k = _known(_dim(a, -1), _dim(b, -2) if b and len(b) > 1 else None)
    return MatrixDims(m, k, _dim(b, -1) if b and len(b) > 1 else 1, n_axis=n_axis)


def _known(first: int | None, second: int | None) -> int | None:
    """``first`` where known, else ``second``: one dimension two shapes declare."""
    return first if first is not None else second


def _product(dims: tuple[int | str | None, ...]) -> int | None:
    """The product of ``dims`` when each is a known size (1 for none), else None."""
    sizes = [d for d in dims if isinstance(d, int)]
    return math.prod(sizes) if len(sizes) == len(dims) else None


def _dim(shape: tuple[int | str | None, ...] | None, axis: int) -> int | None:
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    value = shape[axis]
    return value if isinstance(value, int) else None


@functools.lru_cache(maxsize=1024)
def _flops(
    op: str,
    out: tuple[int | str | None, ...] | None,
    a: tuple[int | str | None, ...] | None,
    b: tuple[int | str | None, ...] | None,
    transposed: bool,
) -> int | None:
    """2 x multiply-adds of a matrix op with these shapes (once per distinct shapes: the
    MatMuls of a model share a few)."""
    out_elems = _product(out) if out else None
    if out_elems is None:
        return None
    if op == "MatMul" and a and isinstance(a[-1], int):
        return 2 * out_elems * int(a[-1])
    if op == "Gemm" and a and len(a) == 2:
        k = a[0] if transposed else a[1]
        return 2 * out_elems * int(k) if isinstance(k, int) else None
    if op in ("Conv", "ConvTranspose") and b and isinstance(b[0], int):
        kernel = _product(b[1:])
        if kernel is not None:
            return 2 * out_elems * kernel
    return None


# What the writer adds or changes on a converted node.
# Attributes an op needs when it runs in a low type: in float16 the fused Attention of opset
# 23 keeps its softmax in float32, as a separate Softmax would be kept (torch's
# scaled_dot_product_attention under autocast does the same). Not in bfloat16, which has
# float32's range: there the op's function body would add a bfloat16 mask to float32 scores.
LOW_PRECISION_ATTRIBUTES: dict[tuple[str, str, str], dict[str, str]] = {
    ("", "Attention", "float16"): {"softmax_precision": "float32"},
}
# A Constant's float32 value given as a number or list: a converted one becomes its "value".
CONSTANT_FLOAT_ATTRIBUTES = ("value_float", "value_floats")
