"""A model as the ONNX dialect holds it between loading and writing: its proto, what type
inference and validation found, and where the weights it does not hold are."""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from graphamp.onnx.io.infile import InFileTensor
from graphamp.onnx.validation.validate_nodes import NodeFields


@dataclass
class ProtoModel:
    """A model read straight from its proto: the caller's proto (never changed), the
    ValueInfoProto of each value it declares (inputs, value_info, outputs) and the serialised
    TypeProto of every typed value (the model's own where it gives type and shape, else type
    inference's, for both)."""

    proto: onnx.ModelProto
    value_info: dict[str, onnx.ValueInfoProto]
    types: dict[str, bytes]
    # The graph's nodes' fields, where validation read them already.
    nodes: list[NodeFields] | None = None
    # Filled by read(): each node's name in the plan (unnamed nodes get one), in graph order,
    # and the names that differ from the proto's, by node number (from 1).
    node_names: list[str] = field(default_factory=list)
    renamed_nodes: dict[int, str] = field(default_factory=dict)
    # Each typed value's TypeProto, serialised (the writer builds value_info from them).
    type_bytes: dict[str, bytes] = field(default_factory=dict)
    # Initializers whose data ``proto`` does not hold: where it is in the model file
    # (graphamp.onnx.io.infile); their TensorProtos have name, type and dims only.
    weights: dict[str, InFileTensor] = field(default_factory=dict)
    # What graphamp.onnx.validation.declared repaired in ``proto`` ("" for nothing).
    repaired: str = ""
    # The model kept weights in external data files: the converted one does too.
    external: bool = False
    # The model has If/Loop/Scan bodies or model-local functions: the inferred model (its
    # bodies' value types, None where inference failed), which the reader reads them by.
    nested: bool = False
    inferred: onnx.ModelProto | None = None
    inline_functions: bool = False  # the writer puts each call site's body inline
