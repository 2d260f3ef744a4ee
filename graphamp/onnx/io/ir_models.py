"""onnx_ir models for the Python API: ``graphamp.onnx.load`` and ``from_proto`` give a user an
``onnx_ir.Model`` typed as a conversion reads the model. No conversion goes through them (the
reader and writer work on the protobuf: docs/ARCHITECTURE.md); onnx_ir is imported only here.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir

from graphamp.errors import GraphampError


def to_ir(
    proto: onnx.ModelProto, inferred: onnx.ModelProto | None, base_dir: Path | None, where: str
) -> ir.Model:
    """The onnx_ir model of ``proto`` (not modified), typed by ``inferred`` (``proto`` after ONNX
    type inference, or None where it failed); its external data read from ``base_dir``."""
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise GraphampError(f"{where}: malformed ONNX model ({exc})") from None
    if inferred is not None:
        # Values share few distinct types: each distinct TypeProto is deserialised once.
        _type_graph(model.graph, inferred.graph, {})
    if base_dir is not None:
        ir.external_data.set_base_dir(model.graph, base_dir)
    return model


def has_external(model: ir.Model) -> bool:
    """Whether the main graph keeps a weight in external data."""
    return any(
        isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()
    )


def _type_graph(
    graph: ir.Graph,
    inferred: onnx.GraphProto,
    known: dict[bytes, tuple[ir.TypeProtocol, ir.Shape | None]],
) -> None:
    """Type every value of ``graph`` the model leaves without a type or shape as inference
    typed it in ``inferred`` (the same graph), in every body of its nodes too. Every value gets
    its own type (a retype changes it in place) and shares a frozen shape."""
    values = {v.name: v for v in graph.inputs}
    for node in graph:
        for output in node.outputs:
            values[output.name] = output
    for info in [*inferred.value_info, *inferred.output]:
        value = values.get(info.name)
        if value is None or (value.type is not None and value.shape is not None):
            continue
        if not info.type.HasField("tensor_type"):
            continue
        key = info.type.SerializeToString(deterministic=True)
        if key not in known:
            shape = None
            if info.type.tensor_type.HasField("shape"):
                shape = ir.serde.deserialize_type_proto_for_shape(info.type)
                if shape is not None:
                    shape.freeze()
            made = ir.serde.deserialize_type_proto_for_type(info.type)
            if made is None:
                continue  # a type onnx_ir cannot hold: the value keeps what it has
            known[key] = (made, shape)
        type_, shape = known[key]
        if value.type is None:
            value.type = ir.TensorType(type_.dtype, denotation=type_.denotation)
        if value.shape is None and shape is not None:
            value.shape = shape
    # inference types the values inside bodies too: the same graphs, node for node
    for node, inferred_node in zip(graph, inferred.node, strict=False):
        for attribute in inferred_node.attribute:
            found = node.attributes.get(attribute.name)
            if attribute.type == onnx.AttributeProto.GRAPH and found is not None:
                _type_graph(found.value, attribute.g, known)
            elif attribute.type == onnx.AttributeProto.GRAPHS and found is not None:
                for body, inferred_body in zip(found.value, attribute.graphs, strict=False):
                    _type_graph(body, inferred_body, known)
