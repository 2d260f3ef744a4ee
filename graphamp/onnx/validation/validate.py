"""Checking an ONNX model from a stranger before anything is converted.

Model files are data: a malformed one gets one line naming the problem (a GraphampError, exit
status 2), never a traceback or an invalid output. ``onnx.checker`` is not run on the input as a
whole: it refuses models with onnxruntime's own operators (``com.microsoft``), which graphamp
converts, and it reads every weight. What is checked here, on the protobuf and without reading
weights:

* the header: an IR version this onnx knows, an opset for the default domain, each domain
  imported once at a positive version, every node's domain imported (or a function of the
  model), every string valid UTF-8 (doc strings and metadata too: :mod:`.validate_nodes`);
* the graph's structure, subgraphs included: every value produced once (a subgraph may not
  reuse a name of an enclosing graph), every input of a node produced by an earlier node, a
  graph input or initializer (or, in a subgraph, an enclosing graph's value defined before it):
  a node that reads a value nothing produces, a cycle, a node reading its own output, an order
  that is not topological are named; every graph output produced; graph inputs named, typed
  and declared once; every attribute typed;
* each node of a domain onnx defines against its op schema (arity, attributes and their types;
  :mod:`.validate_nodes`);
* stored tensors: data exactly as long as dims and type need, in raw_data, a typed field or an
  external file inside the model's folder (symlinks resolved: nothing outside it is ever read;
  :mod:`.validate_data`).

Type rules (a float op fed a string) are the reader's: it knows each value's inferred type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import onnx

from graphamp.errors import GraphampError
from graphamp.onnx.validation.validate_data import KNOWN_TYPES, MAX_RANK, check_tensor, type_name
from graphamp.onnx.validation.validate_nodes import (
    DEFAULT_DOMAINS,
    NodeFields,
    check_node,
    check_strings,
    node_fields,
)

_ATTR = onnx.AttributeProto
MIN_OPSET = 6  # the oldest default-domain opset converted (Cast-6: ``to`` is an int)
_GRAPH_ATTRIBUTES = frozenset({_ATTR.GRAPH, _ATTR.GRAPHS})
_DATA_ATTRIBUTES = frozenset(
    {_ATTR.TENSOR, _ATTR.TENSORS, _ATTR.SPARSE_TENSOR, _ATTR.SPARSE_TENSORS}
)


class Checked(NamedTuple):
    """What validation found on the way: whether the graph has subgraphs (whose nodes the
    reader looks for) and its nodes' fields (which the reader needs too)."""

    subgraphs: bool
    nodes: list[NodeFields]


def validate(
    proto: onnx.ModelProto,
    *,
    where: str,
    base_dir: Path | None,
    in_file: Mapping[str, int] | None = None,
    nodes: list[NodeFields] | None = None,
) -> Checked:
    """Raise a GraphampError naming the first problem of ``proto`` (see the module
    docstring). ``in_file``: the raw_data lengths of main-graph initializers whose data was
    left in the file (:mod:`graphamp.onnx.io.infile`), checked as their raw_data would be;
    ``nodes``: the main graph's :func:`node_fields`, where read already."""
    graph = proto.graph
    nodes = node_fields(graph) if nodes is None else nodes
    opsets = _check_header(proto, nodes, where)
    check_strings(proto, where, known=(graph, nodes))
    functions = {(function.domain, function.name) for function in proto.functions}
    _check_graph_io(graph, where, proto.ir_version)
    if graph.sparse_initializer:
        raise GraphampError(
            f"{where}: sparse initializer {graph.sparse_initializer[0].values.name!r}: sparse "
            "initializers are not supported (store it dense)"
        )
    check = _GraphCheck(where, opsets, functions, base_dir)
    check.run(graph, outer=set(), nodes=nodes, in_file=in_file or {})
    return Checked(check.subgraphs, nodes)


def _check_header(proto: onnx.ModelProto, nodes: list[NodeFields], where: str) -> dict[str, int]:
    if not 0 < proto.ir_version <= onnx.IR_VERSION:
        raise GraphampError(
            f"{where}: ir_version {proto.ir_version} is not an ONNX IR version this onnx reads "
            f"(1 to {onnx.IR_VERSION})"
        )
    opsets: dict[str, int] = {}
    for entry in proto.opset_import:
        if entry.domain in opsets:
            raise GraphampError(f"{where}: opset_import names domain {entry.domain!r} twice")
        if entry.version <= 0:
            raise GraphampError(
                f"{where}: opset_import gives domain {entry.domain!r} version {entry.version}"
            )
        opsets[entry.domain] = entry.version
    if not opsets:
        raise GraphampError(f"{where}: the model imports no opset (opset_import is empty)")
    default = opsets.get("", opsets.get("ai.onnx"))
    uses_default = any(node.domain in DEFAULT_DOMAINS for node in nodes)
    if default is None and uses_default:
        raise GraphampError(f"{where}: no opset_import for the default ONNX domain")
    newest = onnx.defs.onnx_opset_version()
    if default is not None and not 0 < default <= newest:
        raise GraphampError(
            f"{where}: default-domain opset {default} is not one this onnx knows (1 to {newest})"
        )
    if default is not None and default < MIN_OPSET and uses_default:
        raise GraphampError(
            f"{where}: default-domain opset {default} is older than graphamp converts (opset "
            f"{MIN_OPSET} and later: the Casts it adds take their type as a number since "
            "opset 6, and onnxruntime has no Cast kernel before it); upgrade the model first, "
            "e.g. with onnx.version_converter.convert_version(model, 17)"
        )
    return opsets


def _check_graph_io(graph: onnx.GraphProto, where: str, ir_version: int) -> None:
    """Graph inputs named, declared once and typed; outputs named; initializers unique."""
    declared: set[str] = set()
    for value in graph.input:
        if not value.name:
            raise GraphampError(f"{where}: a graph input has no name")
        if value.name in declared:
            raise GraphampError(f"{where}: graph input {value.name!r} is declared twice")
        declared.add(value.name)
        if value.type.WhichOneof("value") is None:  # no type, or an empty one
            raise GraphampError(f"{where}: graph input {value.name!r} has no type")
        _check_elem_type(value, where, required=True)
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            # inference cannot settle an input's shape (it starts from it), and the checker
            # refuses a model whose graph input has none
            raise GraphampError(
                f"{where}: graph input {value.name!r} declares no shape, not even its rank "
                "(the ONNX checker requires one); declare its dims, a name such as 'batch' "
                "for each that varies"
            )
    for value in (*graph.output, *graph.value_info):
        if not value.name:
            raise GraphampError(f"{where}: a graph output or value_info entry has no name")
        _check_elem_type(value, where, required=False)
    stored: set[str] = set()
    for tensor in graph.initializer:
        if not tensor.name:
            raise GraphampError(f"{where}: an initializer has no name")
        if tensor.name in stored:
            raise GraphampError(f"{where}: initializer {tensor.name!r} is stored twice")
        stored.add(tensor.name)
        # (IR 3 wanted every initializer declared as a graph input too; onnxruntime loads a
        # model that does not, and the converted model says IR 4: OnnxDialect.apply)


def _check_elem_type(value: onnx.ValueInfoProto, where: str, *, required: bool) -> None:
    if not value.type.HasField("tensor_type"):
        return  # sequences, maps, optionals: the runtime's to judge
    rank = len(value.type.tensor_type.shape.dim)
    if rank > MAX_RANK:
        raise GraphampError(f"{where}: value {value.name!r} has {rank} dimensions (at most 64)")
    code = value.type.tensor_type.elem_type
    if code in KNOWN_TYPES or (code == onnx.TensorProto.UNDEFINED and not required):
        return
    raise GraphampError(
        f"{where}: value {value.name!r} has no ONNX element type ({type_name(code)})"
    )


class _GraphCheck:
    """Structure, node schemas and stored tensors of a graph and its subgraphs."""

    def __init__(
        self,
        where: str,
        opsets: dict[str, int],
        functions: set[tuple[str, str]],
        base_dir: Path | None,
    ) -> None:
        self.where, self.opsets, self.functions, self.base_dir = where, opsets, functions, base_dir
        self.function_domains = {domain for domain, _ in functions}
        # Node signatures check_node passed: its verdict depends on nothing else, and a large
        # graph has far fewer signatures than nodes.
        self.passed: set[tuple[object, ...]] = set()
        self.subgraphs = False  # met a graph attribute
        # The path of the body being checked (``<node>/<attribute>/``): errors name a body's
        # node by its path, as the plan does.
        self.scope = ""

    def run(
        self,
        graph: onnx.GraphProto,
        outer: set[str],
        nodes: list[NodeFields] | None = None,
        in_file: Mapping[str, int] | None = None,
    ) -> None:
        """Check ``graph``; ``outer`` holds the enclosing graphs' values visible to it;
        ``nodes``: its nodes' fields, where read already; ``in_file``: see validate()."""
        where = self.where
        local = {value.name for value in graph.input} | {t.name for t in graph.initializer}
        in_file = in_file or {}
        for tensor in graph.initializer:
            label = f"{where}: initializer {tensor.name!r}"
            check_tensor(tensor, label, self.base_dir, in_file.get(tensor.name))
        seen = local | outer
        protos = graph.node  # a node's proto is read only where a check needs more than fields
        for index, fields in enumerate(nodes or node_fields(graph)):
            self._check_node(protos, index, fields, seen)
            inputs = fields.inputs
            if not seen.issuperset(inputs):  # (one C call for the common case: all there)
                for name in inputs:
                    if name and name not in seen:
                        producers = self._producers(graph, local | outer)
                        self._unavailable(protos[index], name, producers)
            for output in fields.outputs:
                if not output:
                    continue
                if output in seen:  # produced twice: the table of producers names both
                    self._producers(graph, local | outer)
                seen.add(output)
        for value in graph.output:
            if value.name not in seen:
                label = f"body {self.scope[:-1]!r}'s" if self.scope else "graph"
                raise GraphampError(
                    f"{where}: {label} output {value.name!r} is produced by nothing"
                )

    def _producers(self, graph: onnx.GraphProto, taken: set[str]) -> dict[str, str]:
        """Which node produces each value; raises on a value produced twice (built only when
        a check fails, for its message)."""
        producer: dict[str, str] = {}
        for node in graph.node:
            for output in node.output:
                if not output:
                    continue
                if output in producer or output in taken:
                    raise GraphampError(
                        f"{self.where}: value {output!r} is produced twice (by "
                        f"{self._label(node)} too)"
                    )
                producer[output] = self._label(node)
        return producer

    def _check_node(
        self, protos: Sequence[onnx.NodeProto], index: int, fields: NodeFields, seen: set[str]
    ) -> None:
        """Check node ``index`` of ``protos`` (``fields``: its fields, read already)."""
        where = self.where
        domain, op_type = fields.domain, fields.op_type
        if (
            domain not in DEFAULT_DOMAINS
            and domain not in self.opsets
            and domain not in self.function_domains
        ):
            raise GraphampError(
                f"{where}: node {self.scope + fields.name!r} ({op_type}) is in domain "
                f"{domain!r}, which the model does not import"
            )
        attributes = fields.attributes
        for attr in attributes:
            kind = attr.type
            if kind == _ATTR.UNDEFINED:
                raise GraphampError(
                    f"{where}: node {self.scope + fields.name!r} attribute {attr.name!r} has "
                    "no type"
                )
            if kind in _DATA_ATTRIBUTES:
                label = f"{where}: node {self.scope + fields.name!r} attribute {attr.name!r}"
                for tensor in _attribute_tensors(attr):
                    check_tensor(tensor, label, self.base_dir)
            elif kind in _GRAPH_ATTRIBUTES:
                self.subgraphs = True
                scope = self.scope
                self.scope = f"{scope}{fields.name or op_type}/{attr.name}/"
                for subgraph in (attr.g,) if kind == _ATTR.GRAPH else attr.graphs:
                    self.run(subgraph, outer=set(seen))
                self.scope = scope
        if not self.functions or (domain, op_type) not in self.functions:
            inputs, outputs = fields.inputs, fields.outputs
            signature = (
                domain,
                op_type,
                # which inputs and outputs are given: their number where none is left out (the
                # common case, and cheaper to tell than the pattern)
                tuple(map(bool, outputs)) if "" in outputs else len(outputs),
                tuple(map(bool, inputs)) if "" in inputs else len(inputs),
                tuple((a.name, a.type, bool(a.ref_attr_name)) for a in attributes)
                if attributes
                else (),
            )
            if signature not in self.passed:
                check_node(protos[index], self.opsets, where)
                self.passed.add(signature)

    def _label(self, node: onnx.NodeProto) -> str:
        """A node as an error names it: by name, or an unnamed one by its op and output."""
        if node.name:
            return f"node {self.scope + node.name!r}"
        output = next((o for o in node.output if o), "")
        return f"the unnamed {node.op_type} node" + (f" writing {output!r}" if output else "")

    def _unavailable(self, node: onnx.NodeProto, name: str, producer: dict[str, str]) -> None:
        where, label = self.where, self._label(node)
        in_body = " (nor any enclosing graph's value)" if self.scope else ""
        if name not in producer:
            raise GraphampError(
                f"{where}: {label} reads {name!r}, which no node produces and which is "
                f"no graph input or initializer{in_body}"
            )
        if producer[name] == label:
            raise GraphampError(f"{where}: {label} reads its own output {name!r}")
        raise GraphampError(
            f"{where}: {label} reads {name!r} before {producer[name]} produces it "
            "(a cycle, or nodes not in topological order)"
        )


def _attribute_tensors(attr: onnx.AttributeProto) -> list[onnx.TensorProto]:
    """The stored tensors of a tensor attribute (a sparse one's values and indices)."""
    if attr.type == _ATTR.TENSOR:
        return [attr.t]
    if attr.type == _ATTR.TENSORS:
        return list(attr.tensors)
    sparse = [attr.sparse_tensor] if attr.type == _ATTR.SPARSE_TENSOR else attr.sparse_tensors
    return [part for tensor in sparse for part in (tensor.values, tensor.indices)]
