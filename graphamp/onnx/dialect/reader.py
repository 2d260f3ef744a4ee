"""Reading a ``ModelProto`` into the OpGraph: the main graph, If/Loop/Scan bodies and each
call of a model-local function, straight from the protobuf (no onnx_ir model is built:
building one object per node of a 50,000-node graph costs more than the whole conversion may,
docs/ARCHITECTURE.md). :mod:`graphamp.onnx.dialect.writer` then patches a copy of the proto.

Value types come from the model's declarations and ONNX type inference
(:mod:`graphamp.onnx.io.files`), with a local fallback from the op schemas (an output bound to the
same type variable as a typed input, Cast's ``to``, fixed output types), so a tensor that
inference missed still gets its casts. Per-slot rules come from the op schemas at the model's
opset (:mod:`graphamp.onnx.dialect.slots`). The bodies of If, Loop and Scan nodes are read into the
same OpGraph where their owner is (:mod:`graphamp.onnx.dialect.bodies`), and so is a copy of a
model-local function at each call (:mod:`graphamp.onnx.dialect.functions`); a node with a body of
another kind is kept whole.
"""

from __future__ import annotations

from graphamp.core.graph import OpGraph
from graphamp.dialects.base import ReadGraph
from graphamp.errors import GraphampError
from graphamp.onnx.dialect import fusion
from graphamp.onnx.dialect.graph_reader import GraphReader
from graphamp.onnx.dialect.node_reader import Types, node_names
from graphamp.onnx.io import stream
from graphamp.onnx.io.proto_model import ProtoModel
from graphamp.onnx.validation.validate_nodes import node_fields


def read(model: ProtoModel, target: str, provider: str = "any") -> ReadGraph:
    """The OpGraph of ``model``'s main graph and of the bodies of its If, Loop and Scan nodes
    and its calls of model-local functions, for ``target`` on ``provider`` (kernels.TARGETS).

    An unnamed node gets a name from its op and first output (``<op>__<output>``), a repeated
    name a suffix: the plan names each node once, and the writer gives the output model's
    nodes those names."""
    graph = model.proto.graph
    opsets = {entry.domain: entry.version for entry in model.proto.opset_import}
    op_graph = OpGraph(graph.name or "graph")
    nodes = model.nodes if model.nodes is not None else node_fields(graph)
    model.nodes = None  # its lists become the OpGraph's, which passes change
    model.node_names, model.renamed_nodes = node_names(nodes)
    initializers = {init.name: init for init in graph.initializer}
    # what of the external data scanned stays cached for the writer to read again
    budget = stream.CacheBudget() if model.external else None
    typed = Types(model.types, model.type_bytes, model.weights, budget)
    reader = GraphReader(model, op_graph, typed, opsets, target, provider)
    main = reader.main(nodes, initializers)
    for value in graph.input:
        op_graph.add_tensor(typed.tensor(value.name, initializers.get(value.name), True))
    for name, init in initializers.items():
        if name not in op_graph.tensors:
            op_graph.add_tensor(typed.tensor(name, init, False))
    tensors = op_graph.tensors
    reader.read_graph(main)
    for value in graph.output:
        op_graph.graph_outputs.append(value.name)
        tensors[value.name].is_graph_output = True
    inputs = [v.name for v in graph.input]
    op_graph.graph_inputs = [n for n in inputs if n not in initializers] + [
        n for n in inputs if n in initializers
    ]
    if not any(t.is_float for t in tensors.values()):
        raise GraphampError("the model computes on no floating-point tensor: nothing to convert")
    op_graph.fused_kernels = fusion.fused_kernels(opsets, target, provider, tensors)
    return ReadGraph(op_graph, model, reader.handles)
