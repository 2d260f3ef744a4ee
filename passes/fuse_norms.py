"""fuse_norms: a decomposed RMSNorm replaced by the fused op the target has.

Exporters write an RMSNorm (LLaMA, Mistral, Gemma, Phi-3, T5) below opset 23 as its ops::

    p = Pow(x, 2)  or  Mul(x, x)
    m = ReduceMean(p) over the last axis, dims kept
    a = Add(m, eps)                      (eps a stored scalar, either side)
    s = Sqrt(a)
    n = Mul(x, Reciprocal(s))  or  Mul(x, Div(1, s))  or  Div(x, s)
    y = Mul(n, w)  or  Mul(w, n)         (w one value per channel: x's last dimension)

Squaring x overflows float16 past |x| = 256 (the hidden states of trained LLMs carry such
channels), so these ops keep float32 statistics, a Cast in and a Cast out per norm. A fused
kernel that accumulates in float32 (``stash_type=1``: ONNX ``RMSNormalization`` at opset 23,
onnxruntime's ``SimplifiedLayerNormalization`` for ``--target cuda|cpu``; the dialect says
which in ``graph.fused_kernels``) takes the low type in and out with no Cast, and stays right
on such values. Rules:

1. Only with ``policy.fuse`` (``--no-fuse`` keeps the model's ops) and a fused kernel.
2. The pattern must match exactly: every intermediate value has one reader and is no graph
   output, shapes are known (the mean keeps every dimension but the last), the exponent is 2
   and the constants are stored scalars. Where x is the model's own Cast of a value of x's
   type (T5 casts its float32 hidden states to float32), the fused op reads that value, and
   the Cast goes when the pattern was its only reader.
3. The user's rules on the model's ops win: no node of the pattern is named by ``deny_names``
   or reads or writes a ``deny_tensors`` value, and no op of it was moved by the user.
4. Only in the main graph: a pattern inside a control-flow body or function is left as it is.
5. The fused node must run low under the policy (classify would give it the low type: listed
   allow, its schema and the target's kernel admit the type); otherwise the model's ops stay.

Each rewrite is a record in the plan (``rewrites``: rule ``fuse_norm`` and the reason) and in
the edit script, which the dialect writes: the fused node in place of the pattern's last op,
under its output's name.
"""

from __future__ import annotations

import math

import numpy as np

from graphamp.graph import NodeKind, OpGraph, OpNode
from graphamp.names import Names
from graphamp.passes.base import Pass, PassContext, PassResult, register
from graphamp.passes.classify import classify_node
from graphamp.policy import Policy
from graphamp.records import RewriteRecord

RULE = "fuse_norm"


@register
class FuseNormsPass(Pass):
    """Replace decomposed RMSNorms by a fused op (see the module docstring)."""

    name = "fuse_norms"
    before = ("policy_check", "reviewed_decisions", "classify", "saturation")

    def applies(self, context: PassContext) -> bool:
        return context.policy.fuse and "rms_norm" in context.graph.fused_kernels

    def run(self, context: PassContext) -> PassResult:
        graph, policy = context.graph, context.policy
        kernel = graph.fused_kernels["rms_norm"]
        names = Names(graph)
        for final in [n for n in graph if n.op == "Mul" and not n.domain]:
            if final.name not in graph.nodes:
                continue
            match = match_rms_norm(graph, final)
            if match is None or not _user_allows(graph, policy, match.nodes):
                continue
            if any(graph.nodes[n].body for n in match.nodes):
                continue  # in a control-flow body: fused nodes are written in the main graph
            name = names.node(f"{final.name}__rms_norm")
            fused = kernel.build(name, [match.x, match.scale], [final.outputs[0]])
            low = policy.dtype
            if classify_node(fused, policy, context.weights).precision != low:
                continue
            ops = ", ".join(graph.nodes[n].op for n in match.nodes)
            replaced, dropped = _with_own_constants(graph, match.nodes, {match.x, match.scale})
            graph.replace_nodes(replaced, fused)
            context.rewrites.append(
                RewriteRecord(
                    node=name,
                    op=kernel.op,
                    domain=kernel.domain,
                    inputs=[match.x, match.scale],
                    outputs=[final.outputs[0]],
                    attributes={"axis": -1, "epsilon": match.epsilon, "stash_type": 1},
                    replaces=replaced,
                    drops=dropped,
                    rule=RULE,
                    reason=(
                        f"decomposed RMSNorm ({ops}) replaced by {kernel.op}, whose kernel "
                        f"accumulates the mean of squares in float32 (stash_type=1): it reads "
                        f"and writes {low} with no Cast, where the decomposed ops would keep "
                        "float32 statistics (x squared overflows float16 past |x| = 256)"
                    ),
                )
            )
        count = len(context.rewrites)
        return PassResult(modified=bool(count), note=f"{count} RMSNorms fused")


class _Match:
    def __init__(self, x: str, scale: str, epsilon: float, nodes: list[str]) -> None:
        self.x, self.scale, self.epsilon, self.nodes = x, scale, epsilon, nodes


def match_rms_norm(graph: OpGraph, final: OpNode) -> _Match | None:
    """The RMSNorm ending at ``final`` (the Mul by the weight, on either side), or None."""
    if len(final.inputs) != 2:
        return None
    for normed, scale in (final.inputs, final.inputs[::-1]):
        found = _normalised(graph, normed)
        if found is None:
            continue
        x, epsilon, nodes = found
        x_shape = graph.tensors[x].shape
        scale_info = graph.tensors.get(scale)
        if (
            scale_info is None
            or scale_info.dtype != graph.tensors[x].dtype
            or not x_shape
            or not isinstance(x_shape[-1], int)
            or scale_info.shape != (x_shape[-1],)
            or graph.tensors[final.outputs[0]].shape != x_shape
        ):
            return None
        nodes = [*nodes, final.name]
        x, nodes = _through_model_cast(graph, x, nodes)
        return _Match(x, scale, epsilon, nodes)
    return None


def _through_model_cast(graph: OpGraph, x: str, nodes: list[str]) -> tuple[str, list[str]]:
    """Where x is the model's own Cast of a value already of x's type (T5's
    ``hidden_states.to(torch.float32)`` on a float32 model), the fused op reads that value:
    the Cast would keep the norm's input float32 whatever runs before it. The Cast goes too
    when the pattern was its only reader."""
    producer = graph.tensors[x].producer
    cast = graph.nodes[producer] if producer is not None else None
    if cast is None or cast.kind is not NodeKind.CAST or not cast.inputs or not cast.inputs[0]:
        return x, nodes
    source = graph.tensors.get(cast.inputs[0])
    if source is None or source.dtype != graph.tensors[x].dtype:
        return x, nodes
    readers = {name for name, _ in graph.consumers(x)}
    if readers <= set(nodes) and not graph.tensors[x].is_graph_output:
        nodes = [cast.name, *nodes]
    return source.name, nodes


def _normalised(graph: OpGraph, value: str) -> tuple[str, float, list[str]] | None:
    """(x, eps, the nodes in graph order) when ``value`` is x / sqrt(mean(x**2) + eps)."""
    node = _only_producer(graph, value)
    if node is None or node.op not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    if node.op == "Div":
        x, root_value = node.inputs
        inverse: list[str] = []
    else:
        for candidate, other in (node.inputs, node.inputs[::-1]):
            inv = _only_producer(graph, other)
            if inv is not None and inv.op == "Reciprocal":
                x, root_value, inverse = candidate, inv.inputs[0], [inv.name]
                break
            if inv is not None and inv.op == "Div" and _scalar(graph, inv.inputs[0]) == 1.0:
                x, root_value, inverse = candidate, inv.inputs[1], [inv.name]
                break
        else:
            return None
    root = _only_producer(graph, root_value)
    add = _only_producer(graph, root.inputs[0]) if root is not None and root.op == "Sqrt" else None
    if add is None or add.op != "Add" or len(add.inputs) != 2:
        return None
    for mean_value, eps_value in (add.inputs, add.inputs[::-1]):
        epsilon = _scalar(graph, eps_value)
        mean = _only_producer(graph, mean_value)
        if epsilon is not None and mean is not None and mean.op == "ReduceMean":
            break
    else:
        return None
    if not (0 < epsilon < 1) or not _last_axis_mean(graph, mean):
        return None
    square = _only_producer(graph, mean.inputs[0])
    if square is None or not _squares(graph, square, x):
        return None
    nodes = [square.name, mean.name, add.name, root.name, *inverse, node.name]
    return x, epsilon, nodes


def _only_producer(graph: OpGraph, value: str) -> OpNode | None:
    """The plain op producing ``value`` when it is that value's only reader's input: one
    reader, no graph output."""
    tensor = graph.tensors.get(value)
    if tensor is None or tensor.producer is None or tensor.is_graph_output:
        return None
    if len(graph.consumers(value)) != 1:
        return None
    node = graph.nodes[tensor.producer]
    return None if node.domain or len(node.outputs) != 1 else node


def _squares(graph: OpGraph, node: OpNode, x: str) -> bool:
    if node.op == "Mul":
        return node.inputs == [x, x]
    return node.op == "Pow" and node.inputs[0] == x and _scalar(graph, node.inputs[1]) == 2.0


def _last_axis_mean(graph: OpGraph, mean: OpNode) -> bool:
    """The mean keeps every dimension of its input and reduces the last to 1 (read from the
    shapes, which say it whatever the opset writes the axes as)."""
    before = graph.tensors[mean.inputs[0]].shape
    after = graph.tensors[mean.outputs[0]].shape
    return (
        before is not None
        and after is not None
        and len(before) == len(after) >= 1
        and after[-1] == 1
        and before[-1] != 1
        and before[:-1] == after[:-1]
    )


def _scalar(graph: OpGraph, name: str) -> float | None:
    """The value of a stored one-element float value (not an overridable input), or None."""
    tensor = graph.tensors.get(name)
    if tensor is None or not tensor.is_constant or tensor.is_graph_input:
        return None
    values = np.asarray(tensor.load_value())  # type: ignore[misc]
    if values.size != 1 or not np.issubdtype(values.dtype, np.floating):
        return None
    value = float(values.reshape(-1)[0])
    return value if math.isfinite(value) else None


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


def _user_allows(graph: OpGraph, policy: Policy, nodes: list[str]) -> bool:
    """No name rule names a node of the pattern and the user moved none of its ops."""
    for name in nodes:
        node = graph.nodes[name]
        if policy.denied_name(node.name, node.scope) is not None or node.op in policy.moved_ops:
            return False
        if any(t and t in policy.deny_tensors for t in (*node.inputs, *node.outputs)):
            return False
    return True
