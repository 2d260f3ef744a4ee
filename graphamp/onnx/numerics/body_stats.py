"""Range statistics of the values inside If, Loop and Scan bodies, carried out to the graph.

Calibration (:mod:`graphamp.onnx.numerics.calibration`) reduces each float32 value to a few scalars
where it is made (:mod:`graphamp.onnx.numerics.statgraph`); a value inside a body cannot be a graph
output, so its statistics leave the body the way the body's results do:

* an If branch returns them as extra results, the other branch the neutral values (largest
  |x| 0, smallest |x| +inf, no inf/NaN), and the If hands them on as extra outputs;
* a Loop or Scan body folds them into extra loop-carried values, one per statistic,
  started at the neutral value and combined each iteration (max, min, sum), so the loop's
  extra outputs hold them over every iteration;
* nested bodies hand theirs on through every level the same way.

Each body value is keyed by its name in the OpGraph (``<node>/<attribute>/<value>``), so a
calibrated range meets the node that reads it. Model-local functions are inlined before this
(:func:`graphamp.onnx.numerics.calibration.calibrate_proto`, their values named by call path). Not
measured: the values inside a Scan of opset 8 (its states carry a batch axis).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import onnx
from onnx import helper

from graphamp.core.names import Names
from graphamp.onnx.io.files import with_stubs
from graphamp.onnx.io.subgraphs import bodies, element_types, model_names, twinned_bodies
from graphamp.onnx.numerics.statgraph import RANGE_STATS, STAT, node_names, stat_name

if TYPE_CHECKING:
    from google.protobuf.internal.containers import (
        RepeatedCompositeFieldContainer,
        RepeatedScalarFieldContainer,
    )

F32 = onnx.TensorProto.FLOAT
_INF, _ZERO = f"{STAT}inf", f"{STAT}zero"
NEUTRAL = {"max_abs": _ZERO, "min_abs": _INF, "nonfinite": _ZERO}
COMBINE = {"max_abs": "Max", "min_abs": "Min", "nonfinite": "Sum"}

Stat = tuple[str, str, str]  # (the value's OpGraph name, statistic, the name holding it here)


def with_body_stats(model: onnx.ModelProto) -> list[str]:
    """Make every If, Loop and Scan node of ``model``'s main graph (changed in place) also
    output the :data:`RANGE_STATS` of the float32 values of its bodies, named
    ``stat_name(<OpGraph name>, stat)`` (values of the main graph: the caller makes them graph
    outputs). The OpGraph names measured, in order."""
    fresh = Fresh(model)
    measured: list[str] = []
    for node, name, twin in owners(model, fresh):
        for key, stat, _ in _export(node, name, twin, fresh, final=True):
            if stat == "max_abs":
                measured.append(key)
    return measured


def owners(
    model: onnx.ModelProto, fresh: Fresh
) -> list[tuple[onnx.NodeProto, str, onnx.NodeProto | None]]:
    """The main graph's nodes whose bodies are entered (:meth:`Fresh.entered`): each with its
    name and its twin in the inferred model, which holds the bodies' value types."""
    named = zip(model.graph.node, node_names(model.graph), strict=True)
    found = [(node, name) for node, name in named if fresh.entered(node)]
    if not found:
        return []
    large = {i.name for i in model.graph.initializer if len(i.raw_data) > 1024}
    light = with_stubs(model, large, "graphamp-type-inference-stub")
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False).graph
    twins = dict(zip((id(n) for n in model.graph.node), inferred.node, strict=False))
    return [(node, name, twins.get(id(node))) for node, name in found]


class Fresh:
    """Names for the values this module adds, new in the whole model
    (:class:`graphamp.core.names.Names` over every name ``model`` holds). A value is named
    after its statistic, ``stat_name(key, stat)`` with a suffix: that name itself is kept for
    the statistic's output from the main graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.scan8 = opset < 9  # the model's Scan is opset 8's

    @cached_property
    def _names(self) -> Names:  # (read at the first name: most models have no bodies)
        return Names(taken=model_names(self._model))

    def __call__(self, key: str, stat: str) -> str:
        base = stat_name(key, stat)
        self._names.take(base)
        return self._names.value(base)

    def entered(self, node: onnx.NodeProto) -> bool:
        """Whether ``node``'s bodies are entered: an If's or a Loop's, and a Scan's but of
        opset 8 (its states carry a batch axis)."""
        if node.op_type in ("If", "Loop") or (node.op_type == "Scan" and not self.scan8):
            return bool(bodies(node))
        return False


def _export(
    node: onnx.NodeProto,
    path: str,
    inferred: onnx.NodeProto | None,
    fresh: Fresh,
    *,
    final: bool,
) -> list[Stat]:
    """Rewrite ``node`` (an If, Loop or Scan at OpGraph path ``path``) to output the statistics
    of its bodies' values; ``final``: name them as graph outputs (the main graph's)."""
    owned = {name: (body, twin) for name, body, twin in twinned_bodies(node, inferred)}

    def inside(attribute: str) -> tuple[onnx.GraphProto, list[Stat]]:
        graph, twin = owned[attribute]
        return graph, _graph_stats(graph, twin, f"{path}/{attribute}", fresh)

    def name(key: str, stat: str) -> str:
        return stat_name(key, stat) if final else fresh(key, stat)

    if node.op_type == "If":
        (then_graph, then_stats), (else_graph, else_stats) = (
            inside("then_branch"),
            inside("else_branch"),
        )
        keys = [(k, s) for k, s, _ in then_stats] + [(k, s) for k, s, _ in else_stats]
        for graph, stats in ((then_graph, then_stats), (else_graph, else_stats)):
            held = {(k, s): v for k, s, v in stats}
            for key, stat in keys:
                value = held.get((key, stat))
                if value is None:  # the other branch's value: neutral when this one runs
                    value = fresh(key, stat)
                    graph.node.append(helper.make_node("Identity", [NEUTRAL[stat]], [value]))
                graph.output.append(helper.make_tensor_value_info(value, F32, []))
        out = []
        for key, stat in keys:
            node.output.append(name(key, stat))
            out.append((key, stat, node.output[-1]))
        return out
    graph, stats = inside("body")
    loop = node.op_type == "Loop"
    carried = len(node.input) - 2 if loop else len(graph.input) - _scanned(node)
    first_input = 2 if loop else len(node.input) - len(graph.input)  # Scan 8: sequence_lens
    first_param, first_result = (2, 1) if loop else (0, 0)
    added_inputs, added_params, added_results, added_outputs = [], [], [], []
    out = []
    for key, stat, value in stats:
        state, following = fresh(key, stat), fresh(key, stat)
        graph.node.append(helper.make_node(COMBINE[stat], [state, value], [following]))
        added_params.append(helper.make_tensor_value_info(state, F32, []))
        added_results.append(helper.make_tensor_value_info(following, F32, []))
        added_inputs.append(NEUTRAL[stat])
        added_outputs.append(name(key, stat))
        out.append((key, stat, added_outputs[-1]))
    at = carried
    _insert(node.input, first_input + at, added_inputs)
    _insert_infos(graph.input, first_param + at, added_params)
    _insert_infos(graph.output, first_result + at, added_results)
    _insert(node.output, at, added_outputs)
    return out


def _scanned(node: onnx.NodeProto) -> int:
    return next(a.i for a in node.attribute if a.name == "num_scan_inputs")


def _insert(field: RepeatedScalarFieldContainer[str], at: int, items: list[str]) -> None:
    values = list(field)
    field[:] = values[:at] + items + values[at:]


def _insert_infos(
    field: RepeatedCompositeFieldContainer[onnx.ValueInfoProto],
    at: int,
    items: list[onnx.ValueInfoProto],
) -> None:
    values = [onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in field]
    del field[:]
    field.extend(values[:at] + items + values[at:])


def _graph_stats(
    graph: onnx.GraphProto, inferred: onnx.GraphProto | None, path: str, fresh: Fresh
) -> list[Stat]:
    """Add to body ``graph`` (OpGraph path ``path``) the statistics of its float32 values and
    of its own bodies' (handed on by their nodes): what it holds, to return."""
    types = body_types(graph, inferred)
    stats: list[Stat] = []
    stored = {init.name for init in graph.initializer}
    own = [v.name for v in graph.input] + [o for n in graph.node for o in n.output if o]
    names = node_names(graph)
    twins = list(inferred.node) if inferred is not None else []
    added: list[onnx.NodeProto] = []
    for index, (node, name) in enumerate(zip(list(graph.node), names, strict=True)):
        if fresh.entered(node):
            twin = twins[index] if index < len(twins) else None
            stats += _export(node, f"{path}/{name}", twin, fresh, final=False)
    for value in own:
        if value in stored or types.get(value) != F32:
            continue
        key = f"{path}/{value}"
        outputs = {stat: fresh(key, stat) for stat in RANGE_STATS}
        added += _range_nodes(value, key, outputs, fresh)
        stats += [(key, stat, outputs[stat]) for stat in RANGE_STATS]
    graph.node.extend(added)  # after every node: the statistics read what the body made
    return stats


def _range_nodes(
    source: str, key: str, outputs: dict[str, str], fresh: Fresh
) -> list[onnx.NodeProto]:
    """As :func:`graphamp.onnx.numerics.statgraph._range_nodes`, reading ``source`` in a body."""
    abs_, finite, finite_abs = fresh(key, "abs"), fresh(key, "finite"), fresh(key, "fabs")
    nonzero, nonzero_abs = fresh(key, "nonzero"), fresh(key, "nzabs")
    mask, count = fresh(key, "mask"), fresh(key, "count")
    return [
        helper.make_node("Abs", [source], [abs_]),
        helper.make_node("Less", [abs_, _INF], [finite]),
        helper.make_node("Where", [finite, abs_, _ZERO], [finite_abs]),
        helper.make_node("ReduceMax", [finite_abs], [outputs["max_abs"]], keepdims=0),
        helper.make_node("Greater", [finite_abs, _ZERO], [nonzero]),
        helper.make_node("Where", [nonzero, abs_, _INF], [nonzero_abs]),
        helper.make_node("ReduceMin", [nonzero_abs], [outputs["min_abs"]], keepdims=0),
        helper.make_node("Not", [finite], [mask]),
        helper.make_node("Cast", [mask], [count], to=F32),
        helper.make_node("ReduceSum", [count], [outputs["nonfinite"]], keepdims=0),
    ]


def body_types(graph: onnx.GraphProto, inferred: onnx.GraphProto | None) -> dict[str, int]:
    """Element types of body ``graph``'s values: its own declarations, inference's for the
    rest."""
    return {**(element_types(inferred) if inferred is not None else {}), **element_types(graph)}
