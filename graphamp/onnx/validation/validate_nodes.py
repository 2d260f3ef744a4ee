"""Nodes and strings of a model from a stranger, checked against what ONNX defines.

* A node of a domain onnx has schemas for (the default one, ``ai.onnx.ml``, ...) is checked
  against its op schema at the model's opset, as ``onnx.checker`` does: a known, not deprecated
  op, the number of inputs and outputs, every required attribute, no attribute the op does not
  have, each of the type the schema says. A Cast without ``to`` or a Softmax whose ``axis`` is a
  float is one line here, not an error deep inside the conversion or a model the runtime
  refuses. Nodes of other domains (onnxruntime's ``com.microsoft``, custom ops), and the few
  ops onnxruntime registers in ONNX's domain (SimplifiedLayerNormalization), are the
  runtime's to judge.
* Every string field of the model is valid UTF-8 (doc strings and metadata included): protobuf
  parses one that is not, and fails only when the converted model is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, partial
from typing import NamedTuple

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from graphamp.errors import GraphampError

DEFAULT_DOMAINS = ("", "ai.onnx")
_AttributeType = onnx.AttributeProto.AttributeType
# Each attribute type an op schema names, as the AttributeProto type of the same name (onnx's
# stubs give OpSchema.AttrType no integer value).
_ATTRIBUTE_TYPES: dict[onnx.defs.OpSchema.AttrType, int] = {
    getattr(onnx.defs.OpSchema.AttrType, name): value
    for name, value in _AttributeType.items()
    if hasattr(onnx.defs.OpSchema.AttrType, name)
}


class NodeFields(NamedTuple):
    """A node's fields, read from its proto once: each read of a protobuf field builds new
    Python objects, and validation, the strings check and the reader all need them:
    reading them once per node, not once per user, keeps that cost to one pass."""

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: Sequence[onnx.AttributeProto]  # the node's repeated field itself
    metadata: Sequence[onnx.StringStringEntryProto]  # metadata_props, the same way


# NodeFields from a plain tuple, in C: NamedTuple's own constructor is a Python function, one
# more Python call per node
_from_tuple = partial(tuple.__new__, NodeFields)


def node_fields(graph: onnx.GraphProto) -> list[NodeFields]:
    """:class:`NodeFields` of each node of ``graph``, in graph order."""
    return [
        # (a slice of a repeated field is a list, and quicker than list())
        _from_tuple(
            (n.name, n.op_type, n.domain, n.input[:], n.output[:], n.attribute, n.metadata_props)
        )
        for n in graph.node
    ]


@cache
def _schema(op: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, version, domain)
    except onnx.defs.SchemaError:
        return None


@cache
def _domain_has_schemas(domain: str) -> bool:
    return domain in {schema.domain for schema in onnx.defs.get_all_schemas()}


@cache
def _runtime_defines(op: str, version: int) -> bool:
    """Whether ``op`` is one of the ops onnxruntime registers in ONNX's domain though onnx does
    not define it there at ``version`` (schemas.RUNTIME_OPS_IN_ONNX_DOMAIN)."""
    from graphamp.onnx.dialect.schemas import schema

    return schema(op, version, "") is not None


def check_node(node: onnx.NodeProto, opsets: dict[str, int], where: str) -> None:
    """Refuse ``node`` where it breaks its op schema (module docstring)."""
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    version = opsets.get(domain, opsets.get("ai.onnx" if domain == "" else domain))
    if version is None or not _domain_has_schemas(domain):
        return
    schema = _schema(node.op_type, version, domain)
    label = f"{where}: node {node.name!r} ({node.op_type})"
    if schema is None and domain == "" and _runtime_defines(node.op_type, version):
        return  # onnxruntime's own op in ONNX's domain (SimplifiedLayerNormalization): its call
    if schema is None:
        raise GraphampError(
            f"{label}: no op {node.op_type!r} in domain {domain or 'ai.onnx'!r} at opset {version}"
        )
    if schema.deprecated:
        raise GraphampError(f"{label}: {node.op_type} is deprecated at opset {version}")
    _check_count(label, "inputs", len(node.input), schema.min_input, schema.max_input)
    _check_count(label, "outputs", len(node.output), schema.min_output, schema.max_output)
    _check_empty_inputs(node, schema, label)
    _check_empty_outputs(node, schema, label)
    present = set()
    for attr in node.attribute:
        present.add(attr.name)
        spec = schema.attributes.get(attr.name)
        if spec is None:
            raise GraphampError(f"{label}: {node.op_type} has no attribute {attr.name!r}")
        wanted = _ATTRIBUTE_TYPES[spec.type]
        if attr.type != wanted and not attr.ref_attr_name:
            raise GraphampError(
                f"{label}: attribute {attr.name!r} is {_AttributeType.Name(attr.type)}; "
                f"{node.op_type} takes {_AttributeType.Name(wanted)}"
            )
    for name, spec in schema.attributes.items():
        if spec.required and name not in present:
            raise GraphampError(f"{label}: required attribute {name!r} is missing")


def _check_empty_inputs(node: onnx.NodeProto, schema: onnx.defs.OpSchema, label: str) -> None:
    """An empty input name means "not given": only an optional input may be left out."""
    formals = schema.inputs
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    for index, name in enumerate(node.input):
        if name or not formals:
            continue
        formal = formals[min(index, len(formals) - 1)]
        if formal.option != optional:
            raise GraphampError(
                f"{label}: input {index} ({formal.name}) is required but its name is empty"
            )


def _check_empty_outputs(node: onnx.NodeProto, schema: onnx.defs.OpSchema, label: str) -> None:
    """An empty output name means "not wanted": the checker refuses it for an output the op
    always makes (a single one; onnxruntime reads it as a value named ""), so graphamp does."""
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for index, (name, formal) in enumerate(zip(node.output, schema.outputs, strict=False)):
        if not name and formal.option == single:
            raise GraphampError(
                f"{label}: output {index} ({formal.name}) is always made but its name is empty"
            )


def _check_count(label: str, what: str, count: int, least: int, most: int) -> None:
    if not least <= count <= most:
        expected = str(least) if least == most else f"{least} to {most}"
        if most >= 2**31 - 1:
            expected = f"at least {least}"
        raise GraphampError(f"{label}: has {count} {what}; the op takes {expected}")


_STRING, _MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE


@cache
def _tensor_fields() -> tuple[tuple[str, int, bool], ...]:
    """TensorProto's string and message fields: its data (bytes and numbers) is not visited,
    since reading ``raw_data`` copies it."""
    return tuple(
        (field.name, field.type, _is_repeated(field))
        for field in onnx.TensorProto.DESCRIPTOR.fields
        if field.type in (_STRING, _MESSAGE)
    )


@cache
def _kind(field: FieldDescriptor) -> tuple[int, bool]:
    return field.type, _is_repeated(field)


def _is_repeated(field: object) -> bool:
    """``field`` (a descriptor of protobuf's Python or upb build) is a repeated field."""
    repeated = getattr(field, "is_repeated", None)  # protobuf 6+
    if repeated is None:  # a `label` before (gone from the stubs, which follow 6+)
        repeated = getattr(field, "label", None) == FieldDescriptor.LABEL_REPEATED
    return bool(repeated)


def check_strings(
    message: Message, where: str, known: tuple[onnx.GraphProto, list[NodeFields]] | None = None
) -> None:
    """Refuse the first string field anywhere in ``message`` that is not valid UTF-8.

    protobuf hands such a field over as bytes (or as a str with surrogates): the strings are
    gathered, then joined and encoded once, which finds both in two C calls. ``known``: a graph
    whose nodes' fields were read already, and those fields."""
    texts: list[str] = []
    stack: list[Message] = [message]
    while stack:
        current = stack.pop()
        if isinstance(current, onnx.GraphProto):
            if known is not None and current is known[0]:
                _node_strings(current, known[1], texts, stack)
            else:
                _node_strings(current, node_fields(current), texts, stack)
            fields = [
                (*_kind(field), value)
                for field, value in current.ListFields()
                if field.name != "node"
            ]
        elif isinstance(current, onnx.TensorProto):
            fields = [
                (kind, repeated, getattr(current, name))
                for name, kind, repeated in _tensor_fields()
                if repeated or kind == _STRING or current.HasField(name)
            ]
        else:
            fields = [(*_kind(field), value) for field, value in current.ListFields()]
        for kind, repeated, value in fields:
            if kind == _STRING:
                if repeated:
                    texts.extend(value)
                else:
                    texts.append(value)
            elif kind == _MESSAGE:
                if repeated:
                    stack.extend(value)
                else:
                    stack.append(value)
    try:
        "\n".join(texts).encode("utf-8")
    except (TypeError, UnicodeEncodeError):
        bad = next(text for text in texts if not _is_utf8(text))
        raise GraphampError(f"{where}: a name or string is not valid UTF-8: {bad!r}") from None


def _node_strings(
    graph: onnx.GraphProto, fields: list[NodeFields], texts: list[str], stack: list[Message]
) -> None:
    """The strings of a graph's nodes, their fields read directly (a generic walk would visit
    every field of every node); attributes and the like go on ``stack``."""
    for node, known in zip(graph.node, fields, strict=True):
        name, op_type, domain, inputs, outputs, attributes, metadata = known  # (unpacked once)
        texts += inputs
        texts += outputs
        texts += (name, op_type, domain, node.doc_string, node.overload)
        if attributes:
            stack.extend(attributes)
        if metadata:
            stack.extend(metadata)
        if node.device_configurations:
            stack.extend(node.device_configurations)


def _is_utf8(text: str | bytes) -> bool:
    if isinstance(text, bytes):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
