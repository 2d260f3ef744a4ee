"""Checking an ONNX model from a stranger before anything is converted.

Model files are data: a malformed one gets one line naming the problem (a GraphampError, exit
status 2), never a traceback or an invalid output. ``onnx.checker`` is not run on the input as a
whole: it refuses models with onnxruntime's own operators (``com.microsoft``), which graphamp
converts. What it checks here, on the protobuf and without reading weights:

* the header: an IR version this onnx knows, an opset for the default domain, every node's
  domain imported (or a function of the model), names that are valid UTF-8;
* the graph's structure: every value produced once, every input of a node produced by an
  earlier node or a graph input or initializer (a node that reads a value nothing produces, a
  cycle, a node reading its own output, an order that is not topological are named), every
  graph output produced, every attribute typed;
* stored tensors: raw data as long as the dims and type need; external data present, inside
  the model's folder (symlinks resolved: nothing outside it is ever read) and long enough.

Type rules (a float op fed a string) are the reader's: it knows each op's type constraints.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx

from graphamp.errors import GraphampError

_DEFAULT_DOMAINS = ("", "ai.onnx")
_ITEM_BYTES = {
    onnx.TensorProto.FLOAT: 4,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT8: 1,
    onnx.TensorProto.INT16: 2,
    onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.INT32: 4,
    onnx.TensorProto.UINT32: 4,
    onnx.TensorProto.INT64: 8,
    onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.BOOL: 1,
    onnx.TensorProto.COMPLEX64: 8,
    onnx.TensorProto.COMPLEX128: 16,
}


def validate(proto: onnx.ModelProto, *, where: str, base_dir: Path | None) -> None:
    """Raise a GraphampError naming the first problem of ``proto`` (see the module docstring)."""
    # Each node's fields are read from the protobuf once: field access is the cost on large
    # graphs (50,000 nodes).
    nodes = [
        _Node(node, node.name, node.op_type, node.domain, list(node.input), list(node.output))
        for node in proto.graph.node
    ]
    _check_header(proto, nodes, where)
    _check_structure(proto.graph, nodes, where)
    for tensor in proto.graph.initializer:
        check_tensor(tensor, f"{where}: initializer {tensor.name!r}", base_dir)
    for entry in nodes:
        for attr in entry.attributes:
            if attr.type == onnx.AttributeProto.TENSOR:
                check_tensor(
                    attr.t, f"{where}: node {entry.name!r} attribute {attr.name!r}", base_dir
                )


class _Node(NamedTuple):
    proto: onnx.NodeProto
    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]

    @property
    def attributes(self) -> list[onnx.AttributeProto]:
        return list(self.proto.attribute) if self.proto.attribute else []


def _check_header(proto: onnx.ModelProto, nodes: list[_Node], where: str) -> None:
    if not 0 < proto.ir_version <= onnx.IR_VERSION:
        raise GraphampError(
            f"{where}: ir_version {proto.ir_version} is not an ONNX IR version this onnx reads "
            f"(1 to {onnx.IR_VERSION})"
        )
    opsets = {entry.domain: entry.version for entry in proto.opset_import}
    if not opsets:
        raise GraphampError(f"{where}: the model imports no opset (opset_import is empty)")
    default = opsets.get("", opsets.get("ai.onnx"))
    uses_default = any(node.domain in _DEFAULT_DOMAINS for node in nodes)
    if default is None and uses_default:
        raise GraphampError(f"{where}: no opset_import for the default ONNX domain")
    newest = onnx.defs.onnx_opset_version()
    if default is not None and not 0 < default <= newest:
        raise GraphampError(
            f"{where}: default-domain opset {default} is not one this onnx knows (1 to {newest})"
        )
    functions = {function.domain for function in proto.functions}
    for name in (proto.producer_name, proto.producer_version, proto.domain, proto.graph.name):
        _utf8(name, where)
    graph = proto.graph
    texts: list[str | bytes] = [
        value.name for value in (*graph.input, *graph.output, *graph.value_info)
    ]
    texts += [tensor.name for tensor in graph.initializer]
    imported = opsets | dict.fromkeys(functions)
    for node in nodes:
        texts += (node.name, node.op_type, node.domain, *node.inputs, *node.outputs)
        texts += (attr.name for attr in node.attributes)
        if node.domain not in _DEFAULT_DOMAINS and node.domain not in imported:
            raise GraphampError(
                f"{where}: node {node.name!r} ({node.op_type}) is in domain {node.domain!r}, "
                "which the model does not import"
            )
    _all_utf8(texts, where)


def _all_utf8(texts: list[str | bytes], where: str) -> None:
    """:func:`_utf8` of each text, checked at once (one encode) while all are fine."""
    try:
        "".join(texts).encode("utf-8")  # type: ignore[arg-type]
    except (TypeError, UnicodeEncodeError):
        for text in texts:
            _utf8(text, where)


def _utf8(text: str | bytes, where: str) -> None:
    """protobuf hands a string field that is not UTF-8 over as bytes (or with surrogates)."""
    if isinstance(text, bytes):
        raise GraphampError(f"{where}: a name or string is not valid UTF-8: {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise GraphampError(f"{where}: a name or string is not valid UTF-8: {text!r}") from None


def _check_structure(graph: onnx.GraphProto, nodes: list[_Node], where: str) -> None:
    available = {value.name for value in graph.input} | {t.name for t in graph.initializer}
    producer: dict[str, str] = {}
    for node in nodes:
        for output in node.outputs:
            if not output:
                continue
            if output in producer or output in available:
                raise GraphampError(
                    f"{where}: value {output!r} is produced twice (by node {node.name!r} too)"
                )
            producer[output] = node.name
    seen = set(available)
    for node in nodes:
        for attr in node.attributes:
            if attr.type == onnx.AttributeProto.UNDEFINED:
                raise GraphampError(
                    f"{where}: node {node.name!r} attribute {attr.name!r} has no type"
                )
        for read in node.inputs:
            if read and read not in seen:
                _refuse_read(where, node.name, read, producer)
        seen.update(node.outputs)
    for output in graph.output:
        if output.name not in seen:
            raise GraphampError(f"{where}: graph output {output.name!r} is produced by nothing")


def _refuse_read(where: str, node: str, name: str, producer: dict[str, str]) -> None:
    if name not in producer:
        raise GraphampError(
            f"{where}: node {node!r} reads {name!r}, which no node produces and "
            "which is no graph input or initializer"
        )
    if producer[name] == node:
        raise GraphampError(f"{where}: node {node!r} reads its own output {name!r}")
    raise GraphampError(
        f"{where}: node {node!r} reads {name!r} before node {producer[name]!r} "
        "produces it (a cycle, or nodes not in topological order)"
    )


def check_tensor(tensor: onnx.TensorProto, where: str, base_dir: Path | None) -> None:
    """Stored data as long as the dims need; external data inside ``base_dir``."""
    if any(d < 0 for d in tensor.dims):
        raise GraphampError(f"{where}: negative dimension in {list(tensor.dims)}")
    elements = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    itemsize = _ITEM_BYTES.get(tensor.data_type)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        _check_external(tensor, where, base_dir, elements * (itemsize or 0))
    elif (
        tensor.HasField("raw_data")
        and itemsize is not None
        and len(tensor.raw_data) != elements * itemsize
    ):
        raise GraphampError(
            f"{where}: raw_data holds {len(tensor.raw_data)} bytes; dims "
            f"{list(tensor.dims)} of {onnx.TensorProto.DataType.Name(tensor.data_type)} "
            f"need {elements * itemsize}"
        )


def _check_external(
    tensor: onnx.TensorProto, where: str, base_dir: Path | None, needed: int
) -> None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location")
    if not location:
        raise GraphampError(f"{where}: external data without a location")
    if base_dir is None:
        raise GraphampError(
            f"{where}: external data {location!r} but no folder to read it from (load the model "
            "from its file)"
        )
    folder = Path(os.path.realpath(base_dir))
    path = Path(os.path.realpath(folder / location))
    if folder != path and folder not in path.parents:
        raise GraphampError(
            f"{where}: external data {location!r} points outside the model's folder; "
            "graphamp reads nothing there"
        )
    if not path.is_file():
        raise GraphampError(f"{where}: external data file {location!r} is missing")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else needed
    except ValueError:
        raise GraphampError(f"{where}: external data offset or length is not a number") from None
    if offset < 0 or length < 0 or offset + length > path.stat().st_size:
        raise GraphampError(
            f"{where}: external data {location!r} is {path.stat().st_size} bytes; the tensor "
            f"needs bytes {offset} to {offset + length}"
        )
    if needed and length != needed:
        raise GraphampError(
            f"{where}: external data holds {length} bytes; the tensor's dims need {needed}"
        )
