"""fuse_norms: a decomposed RMSNorm or LayerNorm replaced by the fused op the target has.

Exporters write norms as their ops below the opsets that have them (the patterns:
:mod:`norm_patterns`). Squaring x overflows float16 past |x| = 256 (the hidden states of
trained LLMs carry such channels), so such ops keep float32 statistics, a Cast in and a Cast
out per norm. A fused kernel that accumulates in float32 (``stash_type=1``) takes the low type
in and out with no Cast, and stays right on such values: for an RMSNorm ONNX
``RMSNormalization`` (opset 23), for a LayerNorm ONNX ``LayerNormalization`` (opset 17), and
for either after a residual Add a runtime's kernel taking the Add in too (onnxruntime's Skip
norms for ``--target cuda|cpu``, at any opset); the dialect says which in
``graph.fused_kernels``. Where the opset has no plain fused op but a Skip one exists, a norm
with no residual Add before it is the Skip op with the norm's input as both input and skip and
epsilon x4: it normalises x + x = 2x, exact in floating point, and RMSNorm(2x) with 4 eps is
x / sqrt(mean(x^2) + eps) (LayerNorm: (2x - 2 mean) / sqrt(4 var + 4 eps)). Rules:

1. Only with ``policy.fuse`` (``--no-fuse`` keeps the model's ops) and a fused kernel: the
   plain one, or the Skip one where a residual Add produces the norm's input; the Skip ones
   only on inputs of the ranks their kernels take (2 or 3: ``FusedKernel.ranks``).
2. The pattern must match exactly (:mod:`norm_patterns`); a LayerNorm is tried before an
   RMSNorm (an RMSNorm of x - mean(x) is the LayerNorm's inner part), and with its bias first.
3. The user's rules on the model's ops win: no node of the pattern is named by ``deny_names``
   or reads or writes a ``deny_tensors`` value, and no op of it was moved by the user.
4. In the main graph and in If/Loop/Scan bodies (the fused op written in the pattern's own
   body, an If branch's norm as the main graph's); every op of the pattern in one scope; a
   pattern inside a model-local function is left as it is (a function's body is written once
   per distinct content, not per call).
5. The fused node must run low under the policy (classify would give it the low type: listed
   allow, its schema and the target's kernel admit the type); otherwise the model's ops stay.

Each rewrite is a record in the plan (``rewrites``: rule ``fuse_norm`` and the reason) and in
the edit script, which the dialect writes: the fused node in place of the pattern's last op,
under its output's name.
"""

from __future__ import annotations

from graphamp.core.graph import BodyKind, NodeKind, OpGraph, OpNode
from graphamp.core.names import Names
from graphamp.passes.base import Pass, PassResult
from graphamp.passes.classify import classify_node
from graphamp.passes.context import PassContext
from graphamp.passes.norm_patterns import NormMatch, match_layer_norm, match_rms_norm
from graphamp.plans.records import RewriteRecord
from graphamp.policy.policy import Policy

RULE = "fuse_norm"


class FuseNormsPass(Pass):
    """Replace decomposed norms by a fused op (see the module docstring)."""

    name = "fuse_norms"
    dialect = "onnx"  # ONNX's norm patterns and the fused ops ONNX and onnxruntime offer

    def applies(self, context: PassContext) -> bool:
        # every pattern of norm_patterns takes a plain ReduceMean: a graph with none has no
        # norm to fuse, and its Adds and Muls need not be matched one by one
        return (
            context.policy.fuse
            and bool(context.graph.fused_kernels.keys() & _KINDS)
            and any(node.op == "ReduceMean" and not node.domain for node in context.graph)
        )

    def run(self, context: PassContext) -> PassResult:
        graph = context.graph
        names = Names(graph)
        # a LayerNorm's bias Add first, then the Muls (a LayerNorm without bias, an RMSNorm)
        finals = [n.name for n in graph if n.op == "Add" and not n.domain]
        finals += [n.name for n in graph if n.op == "Mul" and not n.domain]
        for name in finals:
            final = graph.nodes.get(name)
            if final is None:  # replaced by an earlier rewrite
                continue
            for match in (match_layer_norm(graph, final), match_rms_norm(graph, final)):
                if match is not None and self._fuse(context, names, final, match):
                    break
        count = len(context.rewrites)
        return PassResult(modified=bool(count), note=f"{count} norms fused")

    @staticmethod
    def _fuse(context: PassContext, names: Names, final: OpNode, match: NormMatch) -> bool:
        graph, policy = context.graph, context.policy
        kernel = graph.fused_kernels.get(match.kind)
        skip = graph.fused_kernels.get(f"skip_{match.kind}")
        if skip is not None and not skip.takes(graph.tensors[match.x]):
            skip = None  # (onnxruntime's Skip norms: inputs of rank 2 or 3)
        if (kernel is None and skip is None) or not _user_allows(graph, policy, match.nodes):
            return False
        body = _one_body(graph, match.nodes)
        if body is None:
            return False
        low = policy.dtype
        inputs, outputs, nodes = match.inputs, [final.outputs[0]], match.nodes
        attributes: dict[str, float | int] = {"axis": -1, "epsilon": match.epsilon, "stash_type": 1}
        add = _residual_add(graph, policy, match) if skip is not None else None
        fused = None
        if skip is not None and add is not None:  # the residual Add joins the fused op
            name = names.node(f"{final.name}__skip_{match.kind}")
            total = add.outputs[0]
            read_elsewhere = graph.tensors[total].is_graph_output or any(
                reader not in nodes for reader, _ in graph.consumers(total)
            )
            outputs += ["", "", total] if read_elsewhere else []
            inputs = [*add.inputs, *match.inputs[1:]]
            fused = skip.build(name, inputs, outputs)
            fused.body = body
            in_order = not read_elsewhere or _read_after(graph, total, [add.name, *nodes])
            if in_order and classify_node(fused, policy, context.weights).precision == low:
                kernel, nodes, attributes = skip, [add.name, *nodes], {"epsilon": match.epsilon}
            else:
                fused, inputs, outputs = None, match.inputs, [final.outputs[0]]
        self_skip = fused is None and kernel is None and skip is not None
        if self_skip:  # no plain fused op at this opset: the Skip op with skip = x, eps x4
            assert skip is not None  # self_skip says so
            kernel, inputs = skip, [match.x, *match.inputs]
            attributes = {"epsilon": match.epsilon * SELF_SKIP_EPSILON}
            name = names.node(f"{final.name}__skip_{match.kind}")
            fused = skip.build(name, inputs, outputs)
            fused.body = body
            if classify_node(fused, policy, context.weights).precision != low:
                return False
        if fused is None:
            if kernel is None:  # no fused op at this opset: the model's ops stay
                return False
            name = names.node(f"{final.name}__{match.kind}")
            fused = kernel.build(name, inputs, outputs)
            fused.body = body
            if classify_node(fused, policy, context.weights).precision != low:
                return False
        assert kernel is not None  # each way to a fused op above set it
        ops = ", ".join(graph.nodes[n].op for n in nodes)
        replaced, dropped = _with_own_constants(graph, nodes, set(inputs))
        graph.replace_nodes(replaced, fused)
        what, statistics = _WHAT[match.kind]
        with_add = " and the residual Add before it" if len(nodes) > len(match.nodes) else ""
        written = ""
        if self_skip:
            written = (
                f" with the norm's input as both input and skip and epsilon x{SELF_SKIP_EPSILON}"
                f" (no plain {what} op below opset {_OPSET[match.kind]} that onnx.checker "
                f"accepts: the kernel normalises x + x = 2x, exact in floating point, and "
                f"{what}(2x) with 4 x epsilon equals {what}(x))"
            )
        context.rewrites.append(
            RewriteRecord(
                node=name,
                op=kernel.op,
                domain=kernel.domain,
                inputs=inputs,
                outputs=outputs,
                attributes=attributes,
                replaces=replaced,
                drops=dropped,
                rule=RULE,
                reason=(
                    f"decomposed {what}{with_add} ({ops}) replaced by {kernel.op}{written}, whose "
                    f"kernel accumulates {statistics} in float32: it reads and writes {low} "
                    "with no Cast, where the decomposed ops would keep float32 statistics "
                    "(x squared overflows float16 past |x| = 256)"
                ),
            )
        )
        return True


SELF_SKIP_EPSILON = 4  # Skip(x, x) normalises 2x: mean(4x^2) + 4 eps = 4 (mean(x^2) + eps)
_OPSET = {"rms_norm": 23, "layer_norm": 17}
_KINDS = frozenset({"rms_norm", "layer_norm", "skip_rms_norm", "skip_layer_norm"})
_WHAT = {
    "rms_norm": ("RMSNorm", "the mean of squares"),
    "layer_norm": ("LayerNorm", "the mean and variance"),
}


def _with_own_constants(
    graph: OpGraph, nodes: list[str], kept: set[str]
) -> tuple[list[str], list[str]]:
    """``nodes`` with the Constant nodes only they read, in graph order, and the stored
    initializers only they read (the exponent, epsilon, the 1 of 1/sqrt): gone with them.
    ``kept``: the values the fused op reads."""
    inside = set(nodes)
    constants, dropped = [], []
    for name in nodes:
        for value in graph.nodes[name].inputs:
            tensor = graph.tensors.get(value)
            if value in kept:
                continue
            if tensor is None or not tensor.is_constant or tensor.is_graph_input:
                continue
            if tensor.is_graph_output or any(r not in inside for r, _ in graph.consumers(value)):
                continue
            if tensor.producer is None:
                dropped.append(value)
            elif graph.nodes[tensor.producer].kind is NodeKind.CONSTANT:
                constants.append(tensor.producer)
    position = {name: index for index, name in enumerate(graph.nodes)}
    replaced = sorted(inside | set(constants), key=position.__getitem__)
    return replaced, sorted(set(dropped))


def _residual_add(graph: OpGraph, policy: Policy, match: NormMatch) -> OpNode | None:
    """The plain Add producing the norm's input from two values of its shape and type (a
    residual connection), where a fused op may take it in: in the norm's scope, named by no
    rule, no graph input of its own."""
    producer = graph.tensors[match.x].producer
    add = graph.nodes.get(producer) if producer is not None else None
    if add is None or add.op != "Add" or add.domain or len(add.inputs) != 2:
        return None
    if add.body != graph.nodes[match.nodes[-1]].body:  # the Add in the norm's own scope
        return None
    x = graph.tensors[match.x]
    for value in add.inputs:
        tensor = graph.tensors.get(value)
        if tensor is None or tensor.shape != x.shape or tensor.dtype != x.dtype:
            return None
    return add if _user_allows(graph, policy, [add.name]) else None


def _one_body(graph: OpGraph, nodes: list[str]) -> str | None:
    """The scope every node of the pattern sits in ("" for the main graph), or None where they
    sit in several or inside a function: a function's body is written once per distinct
    content (graphamp.onnx.dialect.functions), with no place for a rewrite of one call's copy."""
    bodies = {graph.nodes[name].body for name in nodes}
    if len(bodies) != 1:
        return None
    (body,) = bodies
    if any(scope.kind is BodyKind.FUNCTION for scope in graph.enclosing(body)):
        return None
    return body


def _read_after(graph: OpGraph, value: str, nodes: list[str]) -> bool:
    """Whether every reader of ``value`` outside ``nodes`` comes after the last of them: the
    fused op is written where the pattern's last op was, so a reader of the residual sum
    before it (T5's own Cast of the sum, kept for another reader) would read it too early."""
    position = {name: index for index, name in enumerate(graph.nodes)}
    last = max(position[name] for name in nodes)
    return all(
        position[reader] > last for reader, _ in graph.consumers(value) if reader not in nodes
    )


def _user_allows(graph: OpGraph, policy: Policy, nodes: list[str]) -> bool:
    """No name rule names a node of the pattern and the user moved none of its ops."""
    for name in nodes:
        node = graph.nodes[name]
        if policy.denied_name(node.name, node.scope) is not None or node.op in policy.moved_ops:
            return False
        if any(t and t in policy.deny_tensors for t in (*node.inputs, *node.outputs)):
            return False
    return True
