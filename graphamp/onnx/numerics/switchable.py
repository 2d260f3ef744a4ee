"""A faithful evaluator whose precision decisions are inputs: one session for many plans.

Searching for the nodes that must stay float32 (``graphamp tune``) evaluates dozens of plans.
Converting, emulating and loading each would cost more than running it. The switchable model is
built once from the float32 model: every op that a plan can make low has a boolean input (its
*flag*); when the flag is set, the values in the op's computation-type slots are rounded to the
low type (a round trip Cast float32 -> low -> float32, inside an ``If`` so that an op left
float32 costs no rounding). That is what the faithful evaluator
(:mod:`graphamp.onnx.numerics.emulate`) does to the converted model, where every low value is
rounded where it is made and a float32 op reads low values through an exact Cast:

* a low op's outputs are rounded;
* a low op reads its float32 inputs rounded (in the converted model, through a Cast to low);
  a value a low op produced is rounded already and not rounded again. A graph input or a weight
  the conversion makes low is one all of whose readers are low, so rounding it at each reader
  is the same.

So it differs from the converted model only where the conversion's own edits round a value a
float32 op reads (none that graphamp makes today); :func:`graphamp.onnx.numerics.tuning.tune` checks
its result on the real conversion all the same.

A weight a switched op reads is rounded once, when the model is built (by onnxruntime's own
Cast, as the ``If`` would; a value at float32's limit goes to the low type's, as the conversion
stores it), and the ``If`` picks the rounded copy or the weight. The weights
and their copies live in a :class:`~graphamp.onnx.numerics.session.Weights` store, as arrays: the
model holds stubs, its sessions (the comparison model's too) share the one copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper

from graphamp.core import dtypes
from graphamp.core.graph import NodeKind, OpGraph
from graphamp.onnx.io.files import inferred_types
from graphamp.onnx.io.subgraphs import bodies, element_types, twinned_bodies
from graphamp.onnx.numerics.calibration import functions_inlined
from graphamp.onnx.numerics.session import Session, Weights
from graphamp.onnx.numerics.statgraph import model_shell, named
from graphamp.passes.numerics import to_target_limit

F32 = onnx.TensorProto.FLOAT
FLAG = "graphamp.low/"


class Switchable:
    """The switchable model of the float32 ``proto``, read by graphamp as ``graph``; ``run``
    evaluates it with a given set of nodes low."""

    def __init__(
        self, proto: onnx.ModelProto, graph: OpGraph, dtype: str, weights: Weights | None = None
    ) -> None:
        self.graph = graph
        # its large weights, the float32 model's and their rounded copies: the model holds
        # stubs (run it with a Session given this store), and its comparison model shares them
        self.weights = weights if weights is not None else Weights()
        self.dtype = dtype
        self.low_code = dtypes.BY_NAME[dtype].onnx
        # Every op a plan may put low: float32 ops with computation-type slots.
        self.switched = [
            node.name
            for node in graph
            if node.kind is NodeKind.OP
            and node.compute_type == "float32"
            and (node.follow_inputs or node.follow_outputs)
        ]
        if proto.functions:  # each call's ops switched by their own flags, named by call path
            proto = functions_inlined(proto)
        proto = named(self.weights.stubbed(proto))
        self.proto = self._build(proto, inferred_types(proto))
        self._session: Session | None = None

    def flags(self, low: Iterable[str]) -> dict[str, np.ndarray]:
        """The flag inputs that make the model compute with the nodes ``low`` in low precision
        (names that are not switched are ignored: they have nothing to round)."""
        low = set(low)
        return {f"{FLAG}{name}": np.array(name in low) for name in self.switched}

    def run(self, feeds: dict[str, np.ndarray], low: Iterable[str]) -> dict[str, np.ndarray]:
        """The graph outputs on ``feeds`` with the nodes ``low`` rounding as low ops."""
        if self._session is None:
            self._session = Session(
                self.proto, what="the switchable model", weights=self.weights, fold=False
            )
        outputs = [o.name for o in self.proto.graph.output]
        return self._session.run({**feeds, **self.flags(low)}, outputs)

    # -- building ------------------------------------------------------------------------------

    def _build(self, proto: onnx.ModelProto, types: dict[str, int]) -> onnx.ModelProto:
        model = model_shell(proto)
        graph = model.graph
        graph.input.extend(proto.graph.input)
        graph.output.extend(proto.graph.output)
        # the values a switched op rounds when low: its computation-type outputs
        self._producer = {
            node.outputs[slot]: node.name
            for node in self.graph
            for slot in node.follow_outputs
            if slot < len(node.outputs) and node.outputs[slot]
        }
        self._stored = {init.name: init for init in proto.graph.initializer}
        self._weights: dict[str, str] = {}  # a weight a switched op reads -> its rounded copy
        for name in self.switched:
            graph.input.append(
                helper.make_tensor_value_info(f"{FLAG}{name}", onnx.TensorProto.BOOL, [])
            )
        inferred = None
        if any(bodies(node) for node in proto.graph.node):
            inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False).graph
        graph.node.extend(self._switch(proto.graph, inferred, types, ""))
        graph.initializer.extend(proto.graph.initializer)
        stored, weights = self._stored, self._weights
        graph.initializer.extend(self._rounded(model, [stored[w] for w in weights], weights))
        graph.sparse_initializer.extend(proto.graph.sparse_initializer)
        return model

    def _switch(
        self,
        graph: onnx.GraphProto,
        inferred: onnx.GraphProto | None,
        types: dict[str, int],
        body: str,
    ) -> list[onnx.NodeProto]:
        """The nodes of ``graph`` (the main graph, or the body at OpGraph path ``body``) with
        each switched op rounding as its flag says, bodies included; ``inferred``: the graph
        after type inference, for its bodies' types."""
        switched = set(self.switched)
        nodes: list[onnx.NodeProto] = []
        twins = list(inferred.node) if inferred is not None else []
        for index, original in enumerate(graph.node):
            path = f"{body}/{original.name}" if body else original.name
            twin = twins[index] if index < len(twins) else None
            if bodies(original):
                nodes.append(self._switch_bodies(original, twin, types, path))
                continue
            op = self.graph.nodes.get(path)
            if op is None or path not in switched:
                nodes.append(original)
                continue
            node = onnx.NodeProto()
            node.CopyFrom(original)
            flag = f"{FLAG}{path}"
            where = f"{index}" if not body else f"{path}."  # tags: new in the whole model
            for slot in sorted(op.follow_inputs):
                source = node.input[slot] if slot < len(node.input) else ""
                if not source or types.get(source) != F32:
                    continue
                cond = flag
                upstream = self._producer.get(op.inputs[slot])
                tag = f"{where}.in{slot}"
                if upstream in switched:  # a low producer's value is rounded already
                    cond = f"{FLAG}{tag}|cond"
                    nodes.append(helper.make_node("Not", [f"{FLAG}{upstream}"], [f"{cond}|not"]))
                    nodes.append(helper.make_node("And", [flag, f"{cond}|not"], [cond]))
                rounded = f"{FLAG}{tag}|read"
                if source in self._stored and not body:  # a weight: rounded once, here
                    low = self._weights.setdefault(source, f"{FLAG}{source}|{self.dtype}")
                    nodes.append(self._choose(cond, low, source, rounded, tag))
                else:
                    nodes.append(self._if(cond, source, rounded, tag))
                node.input[slot] = rounded
            outputs = []
            for slot in sorted(op.follow_outputs):
                output = node.output[slot] if slot < len(node.output) else ""
                if output and types.get(output) == F32:
                    raw = f"{FLAG}{where}.out{slot}|raw"
                    node.output[slot] = raw
                    outputs.append(self._if(flag, raw, output, f"{where}.out{slot}"))
            nodes.append(node)
            nodes.extend(outputs)
        return nodes

    def _switch_bodies(
        self,
        original: onnx.NodeProto,
        twin: onnx.NodeProto | None,
        types: dict[str, int],
        path: str,
    ) -> onnx.NodeProto:
        """A copy of a node that owns bodies, each switched as the main graph is (an op in a
        body reads its flag from the main graph, an enclosing scope's value)."""
        node = onnx.NodeProto()
        node.CopyFrom(original)
        for attribute, sub, inner in twinned_bodies(node, twin):
            sub_types = {
                **types,
                **element_types(sub),
                **(element_types(inner) if inner else {}),
            }
            switched = self._switch(sub, inner, sub_types, f"{path}/{attribute}")
            del sub.node[:]
            sub.node.extend(switched)
        return node

    def _rounded(
        self, shell: onnx.ModelProto, weights: list[onnx.TensorProto], names: dict[str, str]
    ) -> list[onnx.TensorProto]:
        """``weights`` rounded to the low type and back (named as ``names`` says), by
        onnxruntime's own Cast, as it would round them in the switched ops (and as its
        constant folding did when the model rounded them itself, at every session's start)."""
        if not weights:
            return []
        model = model_shell(shell)
        del model.graph.input[:], model.graph.output[:]
        model.graph.node.extend(
            [
                helper.make_node("Cast", ["x"], ["low"], to=self.low_code),
                helper.make_node("Cast", ["low"], ["y"], to=F32),
            ]
        )
        model.graph.input.append(helper.make_tensor_value_info("x", F32, None))
        model.graph.output.append(helper.make_tensor_value_info("y", F32, None))
        session = Session(model, what="the rounding model")
        # values at float32's limit (a mask's -inf) round to the low type's, as the conversion
        # stores them (passes.numerics.to_target_limit), not to inf
        return [
            self.weights.stub(
                names[init.name],
                session.run({"x": to_target_limit(self.weights.array(init), self.dtype)})["y"],
            )
            for init in weights
        ]

    def _choose(self, cond: str, low: str, source: str, output: str, tag: str) -> onnx.NodeProto:
        """``output`` = ``low`` (``source`` rounded already) when ``cond``, else ``source``."""
        branches = [
            helper.make_graph(
                [helper.make_node("Identity", [value], [f"{FLAG}{tag}|{kind}"])],
                f"{kind}_{tag}",
                [],
                [helper.make_tensor_value_info(f"{FLAG}{tag}|{kind}", F32, None)],
            )
            for value, kind in ((low, "low"), (source, "same"))
        ]
        return helper.make_node(
            "If",
            [cond],
            [output],
            name=f"{FLAG}{tag}",
            then_branch=branches[0],
            else_branch=branches[1],
        )

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
