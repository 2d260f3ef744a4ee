"""A faithful evaluator whose precision decisions are inputs: one session for many plans.

Searching for the nodes that must stay float32 evaluates dozens of plans. Converting,
emulating and loading each costs seconds on a BERT-base, several times its run time. The
switchable model is built once from the float32 model: every op that a plan can make low has a
boolean input (its *flag*); when the flag is set, the values in the op's computation-type slots
are rounded to the low type (a round trip Cast float32 -> low -> float32, inside an ``If`` so
that an op left float32 costs no rounding). That is what the faithful evaluator
(:mod:`graphamp.onnx.emulate`) does to the converted model, where every low value is rounded
where it is made and a float32 op reads low values through a Cast:

* a low op reads its inputs rounded (a float32 producer's value through a Cast to low; a low
  producer's value already rounded) and its outputs are rounded;
* a graph input that the conversion retypes to low is rounded for every reader.

It differs from the converted model only where a plan's casts or weight storage make a
float32 op read a rounded value (a weight converted in place that a float32 op also reads);
:func:`graphamp.onnx.tune.tune` checks its result on the real conversion.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphamp import dtypes
from graphamp.graph import NodeKind, OpGraph
from graphamp.onnx.files import inferred_types
from graphamp.onnx.statgraph import model_shell
from graphamp.plan import Plan
from graphamp.policy import Policy
from graphamp.vocab import Precision

F32 = onnx.TensorProto.FLOAT
FLAG = "graphamp.low/"


class Switchable:
    """The switchable model of a float32 ``proto`` (its nodes named as the reader names
    them: see :func:`graphamp.onnx.statgraph.name_nodes`) read as ``graph``."""

    def __init__(self, proto: onnx.ModelProto, graph: OpGraph, dtype: str) -> None:
        self.graph = graph
        self.dtype = dtype
        self.low_code = dtypes.BY_NAME[dtype].onnx
        types = inferred_types(proto)
        self.switched = [
            node.name
            for node in graph
            if node.kind is NodeKind.OP
            and node.compute_type == "float32"
            and (node.follow_inputs or node.follow_outputs)
        ]
        stored = {init.name for init in proto.graph.initializer}
        self.inputs = [
            v.name for v in proto.graph.input if v.name not in stored and types.get(v.name) == F32
        ]
        self.proto = self._build(proto, types)

    def feeds(self, plan: Plan, policy: Policy) -> dict[str, np.ndarray]:
        """The flag inputs that make the model compute as ``plan`` decides."""
        low = {name for name in self.switched if plan.nodes[name].precision == self.dtype}
        flags = {f"{FLAG}{name}": np.array(name in low) for name in self.switched}
        for name in self.inputs:
            # the conversion retypes an input to low when a low op reads it (keep_io aside)
            readers = [n for n, _ in self.graph.consumers(name)]
            retyped = not policy.keeps_io(name) and any(n in low for n in readers)
            flags[f"{FLAG}input:{name}"] = np.array(retyped)
        return flags

    def low_nodes(self, plan: Plan) -> frozenset[str]:
        return frozenset(
            n for n in self.switched if plan.nodes[n].precision == Precision(self.dtype)
        )

    # -- building ------------------------------------------------------------------------------

    def _build(self, proto: onnx.ModelProto, types: dict[str, int]) -> onnx.ModelProto:
        model = model_shell(proto)
        graph = model.graph
        graph.input.extend(proto.graph.input)
        graph.output.extend(proto.graph.output)
        switched = set(self.switched)
        producer = {out: node.name for node in self.graph for out in node.outputs if out}
        nodes: list[onnx.NodeProto] = []
        renamed_inputs: dict[str, str] = {}
        for name in self.inputs:
            flag = f"{FLAG}input:{name}"
            graph.input.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, []))
            renamed_inputs[name] = f"{name}|switched"
            nodes.append(self._if(flag, name, renamed_inputs[name], f"input:{name}"))
        for index, original in enumerate(proto.graph.node):
            node = onnx.NodeProto()
            node.CopyFrom(original)
            node.input[:] = [renamed_inputs.get(n, n) for n in node.input]
            op = self.graph.nodes.get(node.name)
            if op is None or node.name not in switched:
                nodes.append(node)
                continue
            flag = f"{FLAG}{node.name}"
            graph.input.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL, []))
            for slot in sorted(op.follow_inputs):
                source = node.input[slot] if slot < len(node.input) else ""
                if not source or types.get(op.inputs[slot]) != F32:
                    continue
                cond = flag
                upstream = producer.get(op.inputs[slot])
                if upstream in switched:  # a low producer's value is rounded already
                    cond = f"{FLAG}{node.name}|{slot}"
                    nodes.append(helper.make_node("Not", [f"{FLAG}{upstream}"], [f"{cond}|not"]))
                    nodes.append(helper.make_node("And", [flag, f"{cond}|not"], [cond]))
                rounded = f"{source}|read@{index}.{slot}"
                nodes.append(self._if(cond, source, rounded, f"{index}.in{slot}"))
                node.input[slot] = rounded
            outputs = []
            for slot in sorted(op.follow_outputs):
                output = node.output[slot] if slot < len(node.output) else ""
                if output and types.get(output) == F32:
                    node.output[slot] = f"{output}|raw"
                    outputs.append(self._if(flag, f"{output}|raw", output, f"{index}.out{slot}"))
            nodes.append(node)
            nodes.extend(outputs)
        graph.node.extend(nodes)
        graph.initializer.extend(proto.graph.initializer)
        return model

    def _if(self, cond: str, source: str, output: str, tag: str) -> onnx.NodeProto:
        """``output`` = ``source`` rounded to the low type when ``cond``, else ``source``."""
        low, back = f"{FLAG}{tag}|low", f"{FLAG}{tag}|back"
        rounded = helper.make_graph(
            [
                helper.make_node("Cast", [source], [low], to=self.low_code),
                helper.make_node("Cast", [low], [back], to=F32),
            ],
            f"round_{tag}",
            [],
            [helper.make_tensor_value_info(back, F32, None)],
        )
        same = helper.make_graph(
            [helper.make_node("Identity", [source], [f"{FLAG}{tag}|same"])],
            f"keep_{tag}",
            [],
            [helper.make_tensor_value_info(f"{FLAG}{tag}|same", F32, None)],
        )
        return helper.make_node(
            "If", [cond], [output], name=f"{FLAG}{tag}", then_branch=rounded, else_branch=same
        )
