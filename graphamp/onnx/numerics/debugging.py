"""``debug``: where a converted model departs from its float32 original, node by node.

Both models run side by side on the same data in one onnxruntime session, the converted one
through the faithful evaluator (:mod:`graphamp.onnx.numerics.emulate`), and every float32 value of
the original is compared with the same value of the converted model inside the graph
(:mod:`graphamp.onnx.numerics.statgraph`), batch after batch. The report gives

* the first node, in graph order, whose output is inf/NaN in the converted model where it is
  finite in float32 (``first_nonfinite``), and
* every node ranked by the error it adds (the nodes of If, Loop and Scan bodies too, named by
  their OpGraph paths, their values carried out by :mod:`graphamp.onnx.numerics.body_values` and
  compared over every iteration): the error of its output (max |y - y32| over max
  |y32|, as ``--verify`` measures outputs) less the largest error already in the inputs it
  computes from (stored weights count as the node's own), never below zero. A node whose
  output turns inf/NaN from finite inputs adds an infinite error; one whose inputs already
  were adds none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from graphamp.core import dtypes
from graphamp.errors import GraphampError
from graphamp.numerics.batches import DataSource, as_batches
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.io.subgraphs import named_bodies
from graphamp.onnx.numerics.body_values import (
    EXPORTED,
    body_values,
    exported_name,
    with_body_values,
)
from graphamp.onnx.numerics.emulate import LOW_CODES, emulated, has_low_values
from graphamp.onnx.numerics.runtime import input_specs
from graphamp.onnx.numerics.session import Session, Weights, as_proto
from graphamp.onnx.numerics.statgraph import (
    COMPARE_STATS,
    REF,
    comparison,
    float32_values,
    node_names,
    stat_name,
)
from graphamp.plans.plan import Plan

Stats = dict[str, dict[str, float]]  # tensor -> statistic -> value, over all batches


@dataclass(frozen=True)
class NodeError:
    """One node's share of the converted model's error."""

    name: str
    op: str
    precision: str
    rule: str  # from the plan, "" without one
    error: float  # the error it adds (see the module docstring); inf: it made inf/NaN
    output_error: float
    input_error: float

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "op": self.op,
            "precision": self.precision,
            "error": _number(self.error),
        }


@dataclass
class DebugReport:
    """What :func:`debug` found; ``nodes`` ranked worst first."""

    first_nonfinite: str | None
    nodes: list[NodeError]
    evaluator: str
    batches: int
    outputs: dict[str, float] = field(default_factory=dict)  # graph output -> its error

    def to_dict(self) -> dict[str, object]:
        return {
            "first_nonfinite": self.first_nonfinite,
            "nodes": [node.to_dict() for node in self.nodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def to_text(self, top: int = 15) -> str:
        """A summary for people: the first inf/NaN node and the ``top`` worst nodes."""
        lines = [f"evaluated on {self.batches} batch(es) by {self.evaluator}"]
        for name, error in self.outputs.items():
            lines.append(f"output {name}: error {_text(error)}")
        if self.first_nonfinite is None:
            lines.append("first non-finite: none (no value finite in float32 turns inf/NaN)")
        else:
            node = next(n for n in self.nodes if n.name == self.first_nonfinite)
            lines.append(
                f"first non-finite: {node.name} ({node.op}, {node.precision}"
                + (f", {node.rule}" if node.rule else "")
                + "): finite in float32, inf/NaN in the converted model"
            )
        shown = [n for n in self.nodes if n.error > 0][:top]
        lines.append(
            f"nodes ranked by the error they add ({len(shown)} of {len(self.nodes)} shown; "
            "error = max|y-y32|/max|y32| of the output, less that of its inputs):"
        )
        width = max((len(n.name) for n in shown), default=4)
        for rank, node in enumerate(shown, 1):
            rule = f"  {node.rule}" if node.rule else ""
            lines.append(
                f"{rank:>3}. {node.name:<{width}}  {node.op:<12} {node.precision:<8} "
                f"{_text(node.error):>10}{rule}"
            )
        return "\n".join(lines) + "\n"


def debug(
    original: object, converted: object, data: DataSource, *, plan: Plan | None = None
) -> DebugReport:
    """Compare ``converted`` with its float32 ``original`` (paths or models) on ``data`` (a
    DATA path, a dict of arrays or an iterable of them), node by node (module docstring).
    ``plan`` (the conversion's) adds each node's rule and gives the precisions."""
    reference = as_proto(original, "original")
    target = as_proto(converted, "converted")
    types = inferred_types(target)
    _check_pair(reference, target, types)
    batches = as_batches(data, input_specs(reference))
    faithful, evaluator = target, "onnxruntime cpu"
    if has_low_values(target, types):
        faithful = emulated(target, types)
        kinds = sorted({LOW_CODES[c] for c in types.values() if c in LOW_CODES})
        evaluator += f", {'/'.join(kinds)} rounding emulated"
    # the values inside If/Loop/Scan bodies too, carried out whole by both models (body_values)
    inner = sorted(body_values(reference) & body_values(faithful))
    original_graph = reference
    if inner:
        reference, faithful = _carried(reference, inner), _carried(faithful, inner)
    produced = {out for node in faithful.graph.node for out in node.output}
    produced |= {v.name for v in faithful.graph.input}
    tensors = [t for t in float32_values(original_graph) if t in produced]
    tensors += [exported_name(key) for key in inner]
    stats, outputs = compare(reference, faithful, tensors, batches)
    stats = {_key(tensor): stat for tensor, stat in stats.items()}
    precision_of = _precisions(target, types, plan)
    return report(original_graph, stats, outputs, precision_of, plan, evaluator, len(batches))


def _carried(model: onnx.ModelProto, keys: list[str]) -> onnx.ModelProto:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    with_body_values(work, set(keys))
    return work


def _key(tensor: str) -> str:
    """A compared tensor's OpGraph name (a body value's path, a main-graph value's name)."""
    return tensor.removeprefix(EXPORTED)


def _check_pair(reference: onnx.ModelProto, target: onnx.ModelProto, types: dict[str, int]) -> None:
    """Refuse, in one line, two models that are not a float32 model and its conversion: the
    two given the other way round, or models of different graphs."""
    for what, ours, theirs in (
        ("inputs", reference.graph.input, target.graph.input),
        ("outputs", reference.graph.output, target.graph.output),
    ):
        mine = [v.name for v in ours]
        other = [v.name for v in theirs]
        if sorted(mine) != sorted(other) and not (what == "inputs" and set(other) <= set(mine)):
            shown = [", ".join(names[:4]) or "none" for names in (mine, other)]
            raise GraphampError(
                f"the two models are not a model and its conversion: their graph {what} differ "
                f"(IN: {shown[0]}; CONVERTED: {shown[1]})"
            )
    names = {node.name for node in reference.graph.node if node.name}
    shared = names & {node.name for node in target.graph.node}
    if names and len(shared) < len(names) / 2:
        raise GraphampError(
            "the two models are not a model and its conversion: CONVERTED has "
            f"{len(shared)} of IN's {len(names)} node names"
        )
    if has_low_values(reference, inferred_types(reference)) and not has_low_values(target, types):
        raise GraphampError(
            "IN computes in a low-precision type and CONVERTED does not: the models look "
            "swapped; give the float32 model first (graphamp debug IN CONVERTED)"
        )


def compare(
    reference: onnx.ModelProto,
    other: onnx.ModelProto,
    tensors: list[str],
    batches: Iterable[Mapping[str, np.ndarray]],
) -> tuple[Stats, dict[str, float]]:
    """The comparison statistics of ``tensors`` over ``batches`` (one session, one run per
    batch) and each graph output's error."""
    return Comparison(reference, other, tensors).run(batches)


class Comparison:
    """One session running ``reference`` beside ``other`` (see
    :func:`graphamp.onnx.numerics.statgraph.comparison`), for as many runs as needed."""

    def __init__(
        self,
        reference: onnx.ModelProto,
        other: onnx.ModelProto,
        tensors: list[str],
        shared: frozenset[str] = frozenset(),
        weights: Weights | None = None,
        fold: bool = True,
    ) -> None:
        self.reference = reference
        self.tensors = tensors
        self.outputs = [o.name for o in reference.graph.output]
        inputs = {v.name for v in reference.graph.input}  # a comparison keeps their names
        self._reference_names = {n: n if n in inputs else f"{REF}{n}" for n in self.outputs}
        model = comparison(reference, other, tensors, shared)
        self.session = Session(model, what="the comparison model", weights=weights, fold=fold)

    def run(
        self,
        batches: Iterable[Mapping[str, np.ndarray]],
        feeds_extra: Mapping[str, np.ndarray] | None = None,
        on_batch: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None] | None = None,
    ) -> tuple[Stats, dict[str, float]]:
        """The statistics over ``batches`` and each graph output's error; ``feeds_extra``
        feeds other inputs of ``other``; ``on_batch(expected, got)`` sees each batch's graph
        outputs, float32 and other."""
        stats: Stats = {}
        for feeds in batches:
            values = self.session.run({**feeds, **(feeds_extra or {})})
            if on_batch is not None:
                on_batch(
                    {name: values[self._reference_names[name]] for name in self.outputs},
                    {name: values[name] for name in self.outputs},
                )
            for tensor in self.tensors:
                _fold(stats, tensor, {stat: float(values[stat_name(tensor, stat)])
                                      for stat in COMPARE_STATS})  # fmt: skip
        for tensor in [t for t, stat in stats.items() if stat.get("unmeasured")]:
            del stats[tensor]
        outputs = {name: relative_error(stats[name]) for name in self.outputs if name in stats}
        return stats, outputs


def _fold(stats: Stats, tensor: str, batch: dict[str, float]) -> None:
    """Fold one batch's statistics of ``tensor`` into ``stats``: the largest |y32| and
    |y - y32|, and how many batches turned a finite value inf/NaN. A tensor already inf/NaN in
    float32 (a -inf attention mask) is not measured: it is dropped after the last batch."""
    found = stats.setdefault(tensor, {"max_abs": 0.0, "max_diff": 0.0, "new_nonfinite": 0.0})
    if not math.isfinite(batch["ref_sum"]):
        found["unmeasured"] = 1.0
        return
    found["max_abs"] = max(found["max_abs"], batch["max_abs"])
    if not math.isfinite(batch["sum"]):
        found["new_nonfinite"] += 1
    else:
        found["max_diff"] = max(found["max_diff"], batch["max_diff"])


def relative_error(stat: Mapping[str, float]) -> float:
    """max |y - y32| / max |y32| (the plain difference when y32 is all zero); inf when a value
    finite in float32 is not in the converted model."""
    if stat["new_nonfinite"] > 0:
        return math.inf
    return stat["max_diff"] / stat["max_abs"] if stat["max_abs"] > 0 else stat["max_diff"]


def report(
    reference: onnx.ModelProto,
    stats: Stats,
    outputs: dict[str, float],
    precision_of: Callable[[str], str],
    plan: Plan | None,
    evaluator: str,
    batches: int,
) -> DebugReport:
    """Attribute the error to nodes (module docstring) and rank them."""
    errors = {tensor: relative_error(stat) for tensor, stat in stats.items()}
    ranked: list[tuple[float, int, NodeError]] = []
    first_nonfinite = None
    for index, (name, node, keyed) in enumerate(_every_node(reference.graph)):
        outs = [keyed(o) for o in node.output if o]
        measured = [errors[o] for o in outs if o in errors]
        if not measured:
            continue
        output_error = max(measured)
        ins = [keyed(i) for i in node.input if i]
        input_error = max((errors[i] for i in ins if i in errors), default=0.0)
        if math.isinf(output_error):
            added = 0.0 if math.isinf(input_error) else math.inf
            if first_nonfinite is None and any(
                stats[o]["new_nonfinite"] > 0 for o in outs if o in stats
            ):
                first_nonfinite = name
        else:
            # a node whose output is closer than its inputs adds none (not a negative error)
            added = max(0.0, output_error - (0.0 if math.isinf(input_error) else input_error))
        decision = plan.nodes.get(name) if plan is not None else None
        entry = NodeError(
            name,
            node.op_type,
            precision_of(name),
            str(decision.rule) if decision is not None else "",
            added,
            output_error,
            input_error,
        )
        ranked.append((-added, index, entry))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return DebugReport(first_nonfinite, [e for _, _, e in ranked], evaluator, batches, outputs)


def _every_node(
    graph: onnx.GraphProto, path: str = "", scope: Callable[[str], str] = str
) -> Iterator[tuple[str, onnx.NodeProto, Callable[[str], str]]]:
    """Each node of ``graph`` and of its bodies, nested ones before their owner, as (OpGraph
    name, node, the OpGraph name of a value it reads or makes: its scope's, else the nearest
    enclosing scope's that has it)."""
    own = {v.name for v in graph.input} | {o for n in graph.node for o in n.output}
    own |= {i.name for i in graph.initializer}

    def keyed(value: str) -> str:
        return f"{path}{value}" if value in own else scope(value)

    for name, node in zip(node_names(graph), graph.node, strict=True):
        for attribute, body in named_bodies(node):
            yield from _every_node(body, f"{path}{name}/{attribute}/", keyed)
        yield f"{path}{name}", node, keyed


def _precisions(
    converted: onnx.ModelProto, types: dict[str, int], plan: Plan | None
) -> Callable[[str], str]:
    """A node's precision: the plan's (float8_e4m3fn for a float8 node), else the type of its
    first float output in the converted model."""
    if plan is not None:
        # a float8 node's operands are float8 (its own decision says the low type it outputs)
        fp8 = {name: str(d.precision) for name, d in plan.fp8.items()}
        return lambda name: (
            fp8.get(name) or str(plan.nodes[name].precision) if name in plan.nodes else "?"
        )
    found: dict[str, str] = {}
    for name, node in zip(node_names(converted.graph), converted.graph.node, strict=True):
        kinds = [dtypes.from_onnx(types.get(o, 0)) for o in node.output if o]
        found[name] = next((k for k in kinds if k in dtypes.FLOAT_TYPES), None) or "none"
    return lambda name: found.get(name, "?")


def _number(value: float) -> float | str:
    """JSON has no infinity: an infinite error is written as the string "inf"."""
    return "inf" if math.isinf(value) else value


def _text(value: float) -> str:
    return "inf/NaN" if math.isinf(value) else f"{value:.3g}"
