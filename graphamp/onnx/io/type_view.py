"""Each value's type in a model, as the serialised TypeProto the model holds, in one parse.

The reader keys the value types it reads by their serialised TypeProto (the 50,000 values of the
benchmark's chain have two or three), and the writer writes them back as those bytes. Reading each
ValueInfoProto's ``type`` and serialising it again cost about a microsecond a value. Parsed with
messages that declare ``type`` as ``bytes`` (the wire format does not tell a message from bytes),
protobuf hands each type over as the bytes it holds."""

from __future__ import annotations

from functools import cache

import onnx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

_PACKAGE = "graphamp.type_view"
_FIELD = descriptor_pb2.FieldDescriptorProto


@cache
def _model_view() -> type[Message]:
    """A message class reading a ModelProto's main graph's typed values and nothing else:
    ``graph`` (ModelProto field 7) holds ``input``, ``output`` and ``value_info`` (GraphProto
    fields 11 to 13), each entry a ValueInfoProto's ``name`` (1) and ``type`` (2) as bytes."""
    file = descriptor_pb2.FileDescriptorProto(
        name="graphamp_type_view.proto", package=_PACKAGE, syntax="proto2"
    )
    value = file.message_type.add(name="Value")
    value.field.add(name="name", number=1, type=_FIELD.TYPE_STRING, label=_FIELD.LABEL_OPTIONAL)
    value.field.add(name="type", number=2, type=_FIELD.TYPE_BYTES, label=_FIELD.LABEL_OPTIONAL)
    graph = file.message_type.add(name="Graph")
    for name, number in (("input", 11), ("output", 12), ("value_info", 13)):
        graph.field.add(
            name=name,
            number=number,
            type=_FIELD.TYPE_MESSAGE,
            label=_FIELD.LABEL_REPEATED,
            type_name=f".{_PACKAGE}.Value",
        )
    model = file.message_type.add(name="Model")
    model.field.add(
        name="graph",
        number=7,
        type=_FIELD.TYPE_MESSAGE,
        label=_FIELD.LABEL_OPTIONAL,
        type_name=f".{_PACKAGE}.Graph",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName(f"{_PACKAGE}.Model")
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf 4.22+
    if get_class is None:  # the protobuf 3.20 onnx 1.17 allows
        # attr-defined: the stubs follow protobuf 4.22+, which dropped GetPrototype
        return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # type: ignore[attr-defined]
    return get_class(descriptor)


def value_types(model: onnx.ModelProto) -> dict[str, bytes]:
    """Name -> serialised TypeProto of each ``value_info`` entry and output of ``model``'s main
    graph (an output's entry wins over a value_info entry of its name)."""
    # attr-defined: the view's message class is built at run time (no stub knows its fields)
    graph = _model_view().FromString(model.SerializeToString()).graph  # type: ignore[attr-defined]
    types = {value.name: value.type for value in graph.value_info}
    types.update((value.name, value.type) for value in graph.output)
    return types


def settled_types(
    graph: onnx.GraphProto,
    inferred: onnx.GraphProto | None,
    inferred_types: dict[str, bytes] | None = None,
) -> tuple[dict[str, onnx.ValueInfoProto], dict[str, bytes]]:
    """(the ValueInfoProto of each value ``graph`` declares: its inputs, value_info entries
    and outputs, which the writer reads; every typed value's serialised TypeProto, which the
    reader reads): the graph's own where it gives a type and shape, else type inference's
    (``inferred``: the same graph after inference; ``inferred_types``: its value types as
    bytes, read here where not given, else filled in and returned)."""
    own = {info.name: info for info in [*graph.input, *graph.value_info, *graph.output]}
    if inferred is None:
        return own, {name: info.type.SerializeToString() for name, info in own.items()}
    if inferred_types is None:
        inferred_types = {
            info.name: info.type.SerializeToString()
            for info in (*inferred.value_info, *inferred.output)
        }
    types = inferred_types
    declared: dict[str, onnx.ValueInfoProto] = {}
    settled_by_inference = []
    for name, info in own.items():
        tensor_type = info.type.tensor_type
        if name not in types or (tensor_type.elem_type and tensor_type.HasField("shape")):
            declared[name] = info
            types[name] = info.type.SerializeToString()
        else:
            settled_by_inference.append(name)
    if settled_by_inference:  # their inferred entries, from a table built only for them
        found = {info.name: info for info in inferred.value_info}
        found.update((info.name, info) for info in inferred.output)
        declared.update((name, found[name]) for name in settled_by_inference)
    return declared, types
