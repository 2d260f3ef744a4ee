"""Reading a torch.fx GraphModule into the neutral OpGraph.

Each node's computation-type slots come from its aten schema (:mod:`graphamp.fx.dialect.ops`).
Names are stable identities, so that a plan survives edits elsewhere in the model: an op is
``<module path>/<op>`` (``layers.0.attention.query/linear``; ``_1``, ``_2`` for repeats in one
module, in graph order), a parameter its module path, an input its argument name.

The bodies of ``torch.cond``, ``torch.while_loop`` and ``torch.map`` calls are read into the
same graph as scopes (DESIGN.md, "Scopes"; docs/ARCHITECTURE.md, "Bodies are scopes of the
same graph"): a body's nodes and values are named ``<call>/<attribute>/<name>``
(``cond/true_graph_0/linear``) and decided by the same passes. A body placeholder bound to an
operand of the call is not a value of its own: an op inside reads the operand by its name, an
edge that crosses scopes, so a Cast it needs is made once, outside, and passed in (the writer
threads it through every call on the way). What must agree across the boundary goes through a
``BOUNDARY`` node: each output of a cond reads both branches' results, each loop-carried value
of a while_loop reads its initial value and, as a back input, the body's next value, and gives
the body's parameter and the loop's output; a map's sliced input and each map output read one
value and give the other.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from graphamp.core.dtypes import FLOAT_TYPES
from graphamp.core.graph import Body, BodyKind, NodeKind, OpGraph, OpNode, Role, TensorInfo
from graphamp.dialects.base import ReadGraph
from graphamp.errors import BodyWarning, GraphampError
from graphamp.fx.dialect import hops
from graphamp.fx.dialect.ops import (
    SCHEMA_SOURCE,
    attribute_of,
    flat,
    module_scope,
    op_name,
    outputs_of,
    read_op,
    tensor_info,
    value_arg,
)
from graphamp.fx.dialect.types import dtype_name


@dataclass
class FxHandles:
    """The fx nodes the OpGraph's tensor names stand for (each value is the node producing it),
    and the program they were captured from, if any.

    Bodies of higher-order calls add: ``placeholders``, the node holding a value in a body
    that receives it as a placeholder, by (name, body graph); ``calls`` by the name of the
    call's ``CONTROL_FLOW`` node; and ``boundaries``, where each boundary node's slots are."""

    nodes: dict[str, fx.Node]
    program: Any = None
    placeholders: dict[tuple[str, fx.Graph], fx.Node] = field(default_factory=dict)
    calls: dict[str, hops.HopCall] = field(default_factory=dict)
    boundaries: dict[str, Boundary] = field(default_factory=dict)


@dataclass
class Boundary:
    """Where a boundary node's slots are in the fx graphs. ``carried``: slot 0 is the
    ``index``-th value the loop starts from, slot 1 what its body returns there; ``slice``:
    slot 0 is the ``index``-th input a map slices; ``output``: slot k is what the k-th body
    of ``call.results`` returns as the call's ``index``-th output."""

    call: str
    role: str
    index: int


def read(
    module: fx.GraphModule,
    *,
    master_weights: bool,
    roles: dict[str, tuple[Role, str | None]] | None = None,
) -> ReadGraph:
    """The OpGraph of ``module``'s graph and its bodies. With master weights, parameters are
    not stored values to convert but inputs to cast at run time. ``roles`` marks values of a
    training step (fx node name -> role and, for updates, the name of the value replaced)."""
    reader = _Reader(OpGraph("fx"), master_weights)
    names = reader.read_graph(module, "", {}, "")
    graph = reader.graph
    output = next(n for n in module.graph.nodes if n.op == "output")
    for arg in flat(output.args[0]):
        if isinstance(arg, fx.Node) and names.get(arg.name) in graph.tensors:
            graph.graph_outputs.append(names[arg.name])
            graph.tensors[names[arg.name]].is_graph_output = True
    graph.graph_inputs = [names[n.name] for n in module.graph.nodes if n.op == "placeholder"]
    for fx_name, (role, replaces) in (roles or {}).items():
        tensor = graph.tensors[names.get(fx_name, fx_name)]
        tensor.role = role
        tensor.replaces = names.get(replaces, replaces) if replaces else None
    if not any(t.is_float for t in graph.tensors.values()):
        raise GraphampError("the module computes on no floating-point tensor: nothing to convert")
    return ReadGraph(graph, module, reader.handles)


class _Reader:
    """Reads a GraphModule and, recursively, the bodies of its higher-order calls (see the
    module docstring)."""

    def __init__(self, graph: OpGraph, master_weights: bool) -> None:
        self.graph, self.master_weights = graph, master_weights
        self.handles = FxHandles({})

    def read_graph(
        self, module: fx.GraphModule, body: str, bound: dict[str, str], scope: str
    ) -> dict[str, str]:
        """Read ``module``'s nodes; returns its fx names -> OpGraph names. For a body,
        ``body`` is its path, ``bound`` maps its placeholders to the OpGraph names of their
        values and ``scope`` is the module path of the call (what name rules match)."""
        graph, nodes = self.graph, self.handles.nodes
        names = stable_names(module, body)
        for node in module.graph.nodes:
            if node.op == "placeholder" and body:
                names[node.name] = bound[node.name]
                self.handles.placeholders[(bound[node.name], module.graph)] = node
                continue
            name = names.get(node.name, node.name)
            nodes.setdefault(name, node)
            if _entered_body(module, node):
                continue  # read with its call
            if node.op in ("placeholder", "get_attr"):
                graph.add_tensor(_leaf(module, node, name, self.master_weights))
                graph.tensors[name].body = body
            elif (call := hops.call_of(module, node)) is not None:
                self._read_call(call, name, names, scope or module_scope(node), body)
            elif node.op == "call_function" and node.target is not operator.getitem:
                outputs = outputs_of(node, names)
                for output in outputs:
                    output.body = body
                    graph.add_tensor(output)
                op_node = read_op(node, name, [t.name for t in outputs], graph, names)
                op_node.body = body
                if body:
                    op_node.scope = scope
                if hops.is_higher_order(node):  # one graphamp does not enter (scan, ...)
                    op_node.kind = NodeKind.CONTROL_FLOW
                    warnings.warn(
                        f"node {name!r}: graphamp does not enter the bodies of "
                        f"{node.target}: they run as they are, in float32",
                        BodyWarning,
                        stacklevel=2,
                    )
                graph.add_node(op_node)
            elif node.op == "call_module" and not node.name.startswith("_guards"):
                raise GraphampError(
                    f"node {node.name!r}: call_module {node.target!r} is not supported "
                    "after torch.export"
                )
        return names

    def _read_call(
        self, call: hops.HopCall, name: str, names: dict[str, str], scope: str, parent: str
    ) -> None:
        """A higher-order call: its ``CONTROL_FLOW`` node, the boundary nodes of the values
        entering its bodies, the bodies, then the boundary nodes of its outputs."""
        graph, handles = self.graph, self.handles
        handles.calls[name] = call
        paths = {attribute_name: f"{name}/{attribute_name}" for attribute_name, _ in call.bodies}
        kind = BodyKind.BRANCH if call.node.target is hops.COND else BodyKind.LOOP
        condition = [names[value_arg(call.node).name]] if call.node.target is hops.COND else []
        graph.add_node(
            OpNode(
                name,
                call.op,
                condition,
                [],
                kind=NodeKind.CONTROL_FLOW,
                bodies=tuple(paths.values()),
                body=parent,
                scope=scope,
                schema_source=SCHEMA_SOURCE,
            )
        )
        operands = [names[v.name] if isinstance(v, fx.Node) else "" for v in call.operands]
        # The values a loop carries or a map slices are parameters of the (last) body.
        main = call.results[0]
        main_module = dict(call.bodies)[main]
        values = call.node.meta.get("val") or ()
        role = "carried" if call.carried else "slice"
        for index in range(call.fixed):
            placeholder = hops.placeholders(main_module)[index]
            parameter = f"{paths[main]}/{placeholder.name}"
            graph.add_tensor(tensor_info(parameter, placeholder.meta.get("val")))
            graph.tensors[parameter].body = paths[main]
            inputs, outputs = [operands[index]], [parameter]
            back: frozenset[int] = frozenset()
            if call.carried:  # the body's next value: set once the body is read
                inputs.append("")
                outputs.append(f"{name}.{index}")
                graph.add_tensor(tensor_info(outputs[1], values[index]))
                graph.tensors[outputs[1]].body = parent
                back = frozenset({1})
            what = f"{call.op} {'carried value' if call.carried else 'slice of input'} {index}"
            self._boundary(f"{name}/{role}:{index}", call.op, what, inputs, outputs, parent)
            graph.nodes[f"{name}/{role}:{index}"].back_inputs = back
            handles.boundaries[f"{name}/{role}:{index}"] = Boundary(name, role, index)
            operands[index] = parameter
        results: dict[str, list[str]] = {}
        for attribute_name, module in call.bodies:
            path = paths[attribute_name]
            bound = dict(zip((p.name for p in hops.placeholders(module)), operands, strict=True))
            body_names = self.read_graph(module, path, bound, scope)
            results[attribute_name] = [
                body_names[v.name] if isinstance(v, fx.Node) else "" for v in hops.returned(module)
            ]
            graph.add_body(
                Body(
                    path,
                    kind,
                    owner=name,
                    parent=parent,
                    inputs=[bound[p.name] for p in hops.placeholders(module)],
                    outputs=results[attribute_name],
                )
            )
        for index in range(call.fixed):  # a cast of such a parameter goes into the body
            parameter = operands[index]
            handles.nodes[parameter] = handles.placeholders[(parameter, main_module.graph)]
            if call.carried:
                carried, following = graph.nodes[f"{name}/{role}:{index}"], results[main][index]
                graph.replace_input(carried.name, 1, following)
                if carried.follow_inputs and following and graph.tensors[following].is_float:
                    carried.follow_inputs |= {1}
        if call.carried:
            return
        for index, value in enumerate(values):
            output = f"{name}.{index}"
            graph.add_tensor(tensor_info(output, value))
            graph.tensors[output].body = parent
            inputs = [results[body][index] for body in call.results]
            what = f"{call.op} {'output' if call.node.target is hops.COND else 'stacked output'}"
            boundary = f"{name}/output:{index}"
            self._boundary(boundary, call.op, f"{what} {index}", inputs, [output], parent)
            handles.boundaries[f"{name}/output:{index}"] = Boundary(name, "output", index)

    def _boundary(
        self, name: str, op: str, what: str, inputs: list[str], outputs: list[str], body: str
    ) -> None:
        """A boundary node (in the call's scope, ``body``): every slot holds one value across
        the boundary, in one type; ``what`` names that value for reasons."""
        graph = self.graph
        floats = [s for s, value in enumerate(inputs) if value and graph.tensors[value].is_float]
        float_outputs = [s for s, value in enumerate(outputs) if graph.tensors[value].is_float]
        first = graph.tensors[inputs[floats[0]]].dtype if floats else None
        graph.add_node(
            OpNode(
                name,
                op,
                inputs,
                outputs,
                kind=NodeKind.BOUNDARY,
                follow_inputs=frozenset(floats if float_outputs else ()),
                follow_outputs=frozenset(float_outputs if floats else ()),
                allowed_types=FLOAT_TYPES,
                compute_type=first,
                body=body,
                schema_source=SCHEMA_SOURCE,
                params={"boundary": what},
            )
        )


def _entered_body(module: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` reads a body that its calls have the reader enter (the body of a
    higher-order op it does not enter stays a value of the graph, of no float type)."""
    return (
        node.op == "get_attr"
        and isinstance(attribute_of(module, node), fx.GraphModule)
        and all(hops.call_of(module, user) is not None for user in node.users)
    )


def _leaf(module: fx.GraphModule, node: fx.Node, name: str, master_weights: bool) -> TensorInfo:
    """A placeholder (a caller's argument: its type is fixed) or a stored attribute."""
    tensor = tensor_info(name, node.meta.get("val"))
    tensor.is_graph_input = tensor.type_fixed = node.op == "placeholder"
    if node.op == "get_attr":
        stored = attribute_of(module, node)
        tensor.dtype = dtype_name(getattr(stored, "dtype", None))
        if isinstance(stored, torch.Tensor):
            tensor.shape = tuple(int(d) for d in stored.shape)
            if not master_weights:
                tensor.load_value = lambda v=stored: v.detach().cpu().float().numpy()
    return tensor


def stable_names(module: fx.GraphModule, prefix: str = "") -> dict[str, str]:
    """fx node name -> stable identity (see the module docstring); a body's names start with
    ``prefix`` (its call and attribute)."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    # An op's name never takes an input's (a forward argument called ``index`` and the
    # aten.index op after it): an fx node and its value share a name in the OpGraph.
    taken = {node.name for node in module.graph.nodes if node.op == "placeholder"}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            names[node.name] = f"{prefix}/{node.target}" if prefix else str(node.target)
        elif node.op == "placeholder":
            names[node.name] = node.name
        elif node.op == "call_function" and node.target is operator.getitem:
            source = node.args[0].name
            names[node.name] = f"{names.get(source, source)}.{node.args[1]}"
        elif node.op == "call_function":
            where = module_scope(node) if not prefix else ""
            base = f"{where}/{op_name(node)}" if where else op_name(node)
            base = f"{prefix}/{base}" if prefix else base
            count = seen.get(base, 0)
            name = base if count == 0 else f"{base}_{count}"
            while name in taken:
                count += 1
                name = f"{base}_{count}"
            seen[base] = count + 1
            names[node.name] = name
            taken.add(name)
    return names
