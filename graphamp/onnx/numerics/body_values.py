"""The float32 values inside If, Loop and Scan bodies, carried out to the main graph whole.

``debug`` (:mod:`graphamp.onnx.numerics.debugging`) compares a converted model with its float32
original value by value in one session; a value inside a body is not a graph value, so it is
carried out the way :mod:`graphamp.onnx.numerics.body_stats` carries calibration statistics out, but
whole rather than reduced (the two models' bodies run in different nodes, so the difference
can only be taken outside both):

* an If branch returns it as an extra result, the other branch a float32 zero (both models
  take the same branch on the same data, so the untaken side compares zero with zero);
* a Loop or Scan body returns it as an extra scan output, so the owner's extra output stacks
  every iteration's value and the comparison's max error is the largest over iterations;
* nested bodies hand theirs on through every level the same way.

Each value is keyed by its OpGraph name (``<node>/<attribute>/<value>``, the plan's path
names) and leaves the main graph as :func:`exported_name` of that key. Not carried: the values
inside a Scan of opset 8, and bodies of any other op.
"""

from __future__ import annotations

import onnx
from onnx import helper

from graphamp.onnx.io.subgraphs import twinned_bodies
from graphamp.onnx.numerics.body_stats import Fresh, body_types, owners
from graphamp.onnx.numerics.statgraph import node_names

F32 = onnx.TensorProto.FLOAT
EXPORTED = "graphamp_body::"

Carried = tuple[str, str]  # (the value's OpGraph name, the name holding it in this graph)


def exported_name(key: str) -> str:
    """The main-graph name a body value of OpGraph name ``key`` leaves by."""
    return f"{EXPORTED}{key}"


def body_values(model: onnx.ModelProto) -> set[str]:
    """The OpGraph names of the float32 values inside ``model``'s entered bodies."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    return set(with_body_values(work))


def with_body_values(model: onnx.ModelProto, keep: set[str] | None = None) -> list[str]:
    """Make every If, Loop and Scan node of ``model``'s main graph (changed in place) also
    output the float32 values of its bodies (only those in ``keep``, when given), named
    :func:`exported_name` of their OpGraph names. The OpGraph names carried out, in order."""
    fresh = Fresh(model)
    carried: list[str] = []
    for node, name, twin in owners(model, fresh):
        for key, _ in _carry(node, name, twin, fresh, keep, final=True):
            carried.append(key)
    return carried


def _carry(
    node: onnx.NodeProto,
    path: str,
    inferred: onnx.NodeProto | None,
    fresh: Fresh,
    keep: set[str] | None,
    *,
    final: bool,
) -> list[Carried]:
    """Rewrite ``node`` (an If, Loop or Scan at OpGraph path ``path``) to output its bodies'
    values; ``final``: name them as main-graph values."""
    owned = {name: (body, twin) for name, body, twin in twinned_bodies(node, inferred)}

    shapes: dict[str, list[int]] = {}

    def inside(attribute: str) -> tuple[onnx.GraphProto, list[Carried]]:
        graph, twin = owned[attribute]
        values = _graph_values(graph, twin, f"{path}/{attribute}", fresh, keep)
        known = _static_shapes(twin) if twin is not None else {}
        shapes.update({key: known[key.rsplit("/", 1)[1]] for key, _ in values
                       if key.rsplit("/", 1)[1] in known})  # fmt: skip
        return graph, values

    def name(key: str) -> str:
        return exported_name(key) if final else fresh(key, "value")

    out: list[Carried] = []
    if node.op_type == "If":
        branches = [inside("then_branch"), inside("else_branch")]
        keys = [key for _, values in branches for key, _ in values]
        for graph, values in branches:
            held = dict(values)
            for key in keys:
                value = held.get(key)
                if value is None:  # the other branch's value: zeros when this one runs,
                    # of its shape where known (a loop stacks every iteration's value)
                    value, shape = fresh(key, "untaken"), shapes.get(key, [])
                    graph.node.extend(_zeros(value, shape))
                graph.output.append(helper.make_tensor_value_info(value, F32, None))
        for key in keys:
            node.output.append(name(key))
            out.append((key, node.output[-1]))
        return out
    graph, values = inside("body")
    for key, value in values:  # scan outputs come last in both the body and its node
        graph.output.append(helper.make_tensor_value_info(value, F32, None))
        node.output.append(name(key))
        out.append((key, node.output[-1]))
    return out


def _zeros(name: str, shape: list[int]) -> list[onnx.NodeProto]:
    dims = helper.make_tensor(f"{name}_shape", onnx.TensorProto.INT64, [len(shape)], shape)
    zero = helper.make_tensor(f"{name}_zero", F32, [1], [0.0])
    return [
        helper.make_node("Constant", [], [f"{name}_shape"], value=dims),
        helper.make_node("ConstantOfShape", [f"{name}_shape"], [name], value=zero),
    ]


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """The values of ``graph`` whose shape inference found every dimension."""
    found = {}
    for info in (*graph.input, *graph.output, *graph.value_info):
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            found[info.name] = [d.dim_value for d in tensor.shape.dim]
    return found


def _graph_values(
    graph: onnx.GraphProto,
    inferred: onnx.GraphProto | None,
    path: str,
    fresh: Fresh,
    keep: set[str] | None,
) -> list[Carried]:
    """The float32 values of body ``graph`` (OpGraph path ``path``) and of its own bodies
    (handed on by their nodes), each as a name this graph can return."""
    types = body_types(graph, inferred)
    stored = {init.name for init in graph.initializer}
    twins = list(inferred.node) if inferred is not None else []
    own = [v.name for v in graph.input] + [o for n in graph.node for o in n.output if o]
    carried: list[Carried] = []
    for index, (node, name) in enumerate(zip(list(graph.node), node_names(graph), strict=True)):
        if fresh.entered(node):
            twin = twins[index] if index < len(twins) else None
            carried += _carry(node, f"{path}/{name}", twin, fresh, keep, final=False)
    for value in own:
        key = f"{path}/{value}"
        if value in stored or types.get(value) != F32 or (keep is not None and key not in keep):
            continue
        # a body output is returned once more under a name of its own (one name, one output)
        copy = fresh(key, "copy")
        graph.node.append(helper.make_node("Identity", [value], [copy]))
        carried.append((key, copy))
    return carried
