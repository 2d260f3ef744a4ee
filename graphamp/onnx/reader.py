"""Reading an ONNX model into the neutral OpGraph.

Value types come from ONNX type inference (:mod:`graphamp.onnx.files`), with a local fallback
from the op schemas (an output bound to the same type variable as a typed input, Cast's ``to``,
fixed output types), so a tensor that inference missed still gets its casts. Per-slot rules
come from the op schemas at the model's opset (:mod:`graphamp.onnx.schemas`): the slots bound
to the type variable of the first float input are the node's computation-type slots; a second
float type variable follows it when its schema admits the target type, except where a runtime
needs float32 (Resize roi, Upsample scales).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from graphamp import dtypes
from graphamp.dialects.base import ReadGraph
from graphamp.dtypes import FLOAT_TYPES, UNKNOWN
from graphamp.errors import GraphampError
from graphamp.graph import NodeKind, OpGraph, OpNode, TensorInfo, unique_name
from graphamp.onnx import kernels, schemas, stream
from graphamp.onnx.types import dtype_name, ir_type, type_str_dtype

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class OnnxHandles:
    """The onnx_ir objects the OpGraph's names stand for."""

    nodes: dict[str, ir.Node] = field(default_factory=dict)
    values: dict[str, ir.Value] = field(default_factory=dict)


def read(model: ir.Model, target: str, provider: str = "any") -> ReadGraph:
    """The OpGraph of ``model``'s main graph, for ``target`` on ``provider`` (kernels.TARGETS).

    Unnamed nodes get a name derived from their op and first output, in the model itself, so
    that the plan and the output model agree on it.
    """
    graph = model.graph
    opsets = dict(model.opset_imports)
    op_graph = OpGraph(graph.name or "graph")
    handles = OnnxHandles()
    _name_nodes(graph)

    initializer_names = set(graph.initializers)
    budget = stream.CacheBudget()
    for value in graph.inputs:
        _add_value(op_graph, handles, value, graph_input=True, budget=budget)
    for name, value in graph.initializers.items():
        if name not in handles.values:
            _add_value(op_graph, handles, value, budget=budget)
    # Nodes of one op with the same types get the same slots: the schema work is done once
    # per signature (a graph of 50,000 nodes may have a dozen).
    signatures: dict[tuple[object, ...], _Slots] = {}
    for node in graph:
        handles.nodes[node.name] = node
        for value in node.outputs:
            _add_value(op_graph, handles, value)
        op_node = _read_node(op_graph, model, node, opsets, target, signatures)
        if op_node.kind is NodeKind.OP and op_node.follow_inputs | op_node.follow_outputs:
            op_node.no_kernel = kernels.missing_kernel(
                provider, node.domain, node.op_type, _opset(opsets, node.domain), target
            )
        op_graph.add_node(op_node)
        _fill_output_types(op_graph, node, op_node, opsets)
    for value in graph.outputs:
        op_graph.graph_outputs.append(value.name)
        op_graph.tensors[value.name].is_graph_output = True
    op_graph.graph_inputs = [v.name for v in graph.inputs if v.name not in initializer_names] + [
        v.name for v in graph.inputs if v.name in initializer_names
    ]
    if not any(t.is_float for t in op_graph.tensors.values()):
        raise GraphampError("the model computes on no floating-point tensor: nothing to convert")
    return ReadGraph(op_graph, model, handles)


def _name_nodes(graph: ir.Graph) -> None:
    """Unnamed nodes get ``<op>__<first output>``; a name a node shares with an earlier one
    (ONNX allows it) gets a suffix, ``<name>_1``: the plan names each node once."""
    taken = {node.name for node in graph if node.name}
    seen: set[str] = set()
    for node in graph:
        if not node.name:
            first = next((v.name for v in node.outputs if v.name), "")
            node.name = unique_name(f"{node.op_type}__{first}" if first else node.op_type, taken)
        elif node.name in seen:
            node.name = unique_name(node.name, taken)
        seen.add(node.name)


def _add_value(
    op_graph: OpGraph,
    handles: OnnxHandles,
    value: ir.Value,
    *,
    graph_input: bool = False,
    budget: stream.CacheBudget | None = None,
) -> None:
    shape = None
    if value.shape is not None:
        shape = tuple(
            d if isinstance(d, int) else (str(d) if d is not None else None) for d in value.shape
        )
    tensor = TensorInfo(
        name=value.name, dtype=dtype_name(value.dtype), shape=shape, is_graph_input=graph_input
    )
    if value.const_value is not None:
        const = value.const_value
        tensor.load_value = stream.loader(const, budget)  # on disk until scanned
        tensor.on_disk = isinstance(const, ir.ExternalTensor)
        if tensor.dtype == UNKNOWN:
            tensor.dtype = dtype_name(const.dtype)
        if tensor.shape is None:
            tensor.shape = tuple(int(d) for d in const.shape)
    handles.values[value.name] = value
    op_graph.add_tensor(tensor)


def _opset(opsets: dict[str, int], domain: str) -> int:
    return opsets.get(domain, opsets.get("", 1))


@dataclass(frozen=True)
class _Slots:
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


_SUBGRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _read_node(
    op_graph: OpGraph,
    model: ir.Model,
    node: ir.Node,
    opsets: dict[str, int],
    target: str,
    signatures: dict[tuple[object, ...], _Slots],
) -> OpNode:
    inputs = [v.name if v is not None else "" for v in node.inputs]
    outputs = [v.name for v in node.outputs]
    op_node = OpNode(
        name=node.name,
        # an op of another domain is named with it (com.microsoft.Attention is not Attention)
        op=node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}",
        inputs=inputs,
        outputs=outputs,
        domain=node.domain,
        scope=node.name,
        schema_source=f"opset {opsets.get('', 0)}",
    )
    tensors = op_graph.tensors
    default_domain = node.domain in _DEFAULT_DOMAINS
    if default_domain and node.op_type == "Cast":
        op_node.kind = NodeKind.CAST
        op_node.cast_to = dtype_name(ir.DataType(node.attributes["to"].value))
        return op_node
    if default_domain and node.op_type == "Constant":
        op_node.kind = NodeKind.CONSTANT
        _attach_constant(op_graph, node)
        return op_node
    attributes = node.attributes.data  # the plain dict: its views are much quicker
    if node.op_type in CONTROL_FLOW_OPS or (
        attributes and any(a.type in _SUBGRAPH_ATTRIBUTES for a in attributes.values())
    ):
        op_node.kind = NodeKind.CONTROL_FLOW
        op_node.implicit_inputs = _outer_scope_reads(node, model.graph)
        return op_node
    input_types = tuple(tensors[name].dtype if name else "" for name in inputs)
    output_types = tuple(dtype_name(v.dtype) for v in node.outputs)
    opset = _opset(opsets, node.domain)
    key = (node.domain, node.op_type, opset, input_types, output_types, tuple(map(bool, outputs)))
    slots = signatures.get(key)
    if slots is None:
        slots = _op_slots(
            node, opset, opsets.get("", 0), inputs, outputs, input_types, output_types, target
        )
        signatures[key] = slots
    op_node.kind = slots.kind
    op_node.any_type_inputs = slots.any_type_inputs
    if not slots.computes:
        return op_node  # no schema (a custom domain), or computes on no float type
    op_node.compute_type = slots.compute_type
    kept = schemas.float32_attribute_note(node.op_type, node.domain, attributes)
    op_node.allowed_types = slots.allowed_types - (dtypes.LOW_TYPES if kept else frozenset())
    op_node.schema_source += slots.schema_note + kept
    op_node.follow_inputs = slots.follow_inputs
    op_node.follow_outputs = slots.follow_outputs
    if op_node.op in ("MatMul", "Gemm", "Conv", "ConvTranspose"):
        op_node.flops = _matrix_flops(op_node, tensors, node)
    return op_node


def _op_slots(
    node: ir.Node,
    opset: int,
    default_opset: int,
    inputs: list[str],
    outputs: list[str],
    input_types: tuple[str, ...],
    output_types: tuple[str, ...],
    target: str,
) -> _Slots:
    """The slots of ``node`` from its op's schema (the same for every node of its signature;
    errors name the first node of it)."""
    found = schemas.schema(node.op_type, opset, node.domain)
    if found is None:
        if node.domain in _DEFAULT_DOMAINS:
            raise GraphampError(
                f"node {node.name!r}: unknown op {node.op_type!r} at opset {default_opset}"
            )
        return _Slots(NodeKind.OPAQUE)

    _check_input_types(node, found, inputs, input_types)
    any_type_inputs = schemas.any_type_inputs(found, inputs, len(outputs))
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
    if primary is None:
        for slot, dtype in enumerate(output_types):
            param = found.output_param(slot)
            if param in found.allowed and dtype in FLOAT_TYPES:
                primary, compute_type = param, dtype
                break
    if primary is None:
        return _Slots(NodeKind.OP, any_type_inputs=any_type_inputs)  # no float type

    allowed_types = schemas.float_types(found, primary)
    note = schemas.float32_output_note(node.op_type, node.domain, outputs)
    if note:
        allowed_types -= dtypes.LOW_TYPES
    since = schemas.RUNTIME_TYPE_SINCE.get((node.op_type, target))
    if node.domain in _DEFAULT_DOMAINS and since is not None and default_opset < since:
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
    return _Slots(
        NodeKind.OP,
        computes=True,
        compute_type=compute_type,
        any_type_inputs=any_type_inputs,
        allowed_types=allowed_types,
        follow_inputs=follow_inputs,
        follow_outputs=follow_outputs,
        schema_note=note,
    )


def _check_input_types(
    node: ir.Node, found: schemas.Schema, inputs: list[str], input_types: tuple[str, ...]
) -> None:
    """Refuse an input whose type the op's schema does not admit (a string into MatMul), or
    two inputs of one type variable with different types (an int32 weight into a float32
    MatMul): a Cast to the low type would be inserted in front of it otherwise."""
    bound: dict[str, tuple[str, str]] = {}  # type variable -> (dtype, input name)
    for slot, name in enumerate(inputs):
        param = found.input_param(slot)
        dtype = input_types[slot] if name else UNKNOWN
        # only tensor type variables: a sequence's element type says nothing here
        admitted_types = found.allowed.get(param, frozenset()) & set(dtypes.BY_NAME)  # type: ignore[arg-type]
        if not admitted_types or dtype not in dtypes.BY_NAME:
            continue
        if dtype not in admitted_types:
            admitted = ", ".join(sorted(admitted_types))
            raise GraphampError(
                f"node {node.name!r} ({node.op_type}): input {slot} {name!r} is {dtype}, which "
                f"{node.op_type} does not take (it takes {admitted})"
            )
        first = bound.setdefault(param, (dtype, name))  # type: ignore[arg-type]
        if first[0] != dtype and param not in found.heterogeneous:
            raise GraphampError(
                f"node {node.name!r} ({node.op_type}): input {name!r} is {dtype} but "
                f"{first[1]!r} is {first[0]}; {node.op_type} takes one type for both ({param})"
            )


def _fill_output_types(
    op_graph: OpGraph, node: ir.Node, op_node: OpNode, opsets: dict[str, int]
) -> None:
    """Local type fallback for outputs that type inference left untyped."""
    tensors = op_graph.tensors
    for slot, value in enumerate(node.outputs):
        tensor = tensors[value.name]
        if tensor.dtype != UNKNOWN:
            continue
        if op_node.kind is NodeKind.CAST:
            tensor.dtype = str(op_node.cast_to)
        elif slot in op_node.follow_outputs and op_node.compute_type:
            tensor.dtype = op_node.compute_type
        elif op_node.kind is NodeKind.OP:
            found = schemas.schema(node.op_type, _opset(opsets, node.domain), node.domain)
            param = found.output_param(slot) if found else None
            if param is not None and found is not None and param not in found.allowed:
                tensor.dtype = type_str_dtype(param)
        if tensor.dtype in FLOAT_TYPES and value.dtype is None:
            value.dtype = ir_type(tensor.dtype)


def _attach_constant(op_graph: OpGraph, node: ir.Node) -> None:
    tensor = op_graph.tensors[node.outputs[0].name]
    attr = node.attributes.get("value")
    if attr is not None and attr.type is ir.AttributeType.TENSOR:
        const = attr.value
        tensor.load_value = const.numpy
        tensor.dtype = dtype_name(const.dtype)
    elif "value_float" in node.attributes:
        tensor.load_value = lambda v=node.attributes["value_float"].value: np.array(v, np.float32)
        tensor.dtype = "float32"
    elif "value_floats" in node.attributes:
        tensor.load_value = lambda v=node.attributes["value_floats"].value: np.array(v, np.float32)
        tensor.dtype = "float32"


def _outer_scope_reads(node: ir.Node, main: ir.Graph) -> list[str]:
    """Names of main-graph values read inside ``node``'s subgraphs, in first-use order."""
    names: dict[str, None] = {}
    for inner in subgraph_nodes(node):
        for value in inner.inputs:
            if value is not None and value.graph is main:
                names.setdefault(value.name)
    return list(names)


def subgraph_nodes(node: ir.Node) -> list[ir.Node]:
    """Every node inside ``node``'s subgraphs, nested ones included."""
    found: list[ir.Node] = []
    for attr in node.attributes.values():
        graphs = (
            [attr.value]
            if attr.type is ir.AttributeType.GRAPH
            else (list(attr.value) if attr.type is ir.AttributeType.GRAPHS else [])
        )
        for subgraph in graphs:
            found.extend(ir.traversal.RecursiveGraphIterator(subgraph))
    return found


def _matrix_flops(op_node: OpNode, tensors: dict[str, TensorInfo], node: ir.Node) -> int | None:
    out = tensors[op_node.outputs[0]].shape
    if not out or not all(isinstance(d, int) for d in out):
        return None
    out_elems = int(np.prod(out))
    a = tensors[op_node.inputs[0]].shape
    b = tensors[op_node.inputs[1]].shape if len(op_node.inputs) > 1 else None
    if op_node.op == "MatMul" and a and isinstance(a[-1], int):
        return 2 * out_elems * int(a[-1])
    if op_node.op == "Gemm" and a and len(a) == 2:
        trans_a = node.attributes.get("transA")
        k = a[0] if trans_a is not None and trans_a.value else a[1]
        return 2 * out_elems * int(k) if isinstance(k, int) else None
    if op_node.op in ("Conv", "ConvTranspose") and b and all(isinstance(d, int) for d in b):
        return 2 * out_elems * int(np.prod(b[1:]))  # type: ignore[arg-type]
    return None
