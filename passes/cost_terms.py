"""The costs the cost pass (:mod:`graphamp.passes.cost`) cuts, over numbered sides.

Every node gets a number once: a free op its own variable (2, 3, ... in the graph's order), a
fixed node the terminal of its side (:data:`LOW` or :data:`F32`); movable graph inputs and the
model's own Casts are variables numbered after the free ops, as the costs meet them. The costs
(rules 1-3 of the cost pass's docstring) and the prices of each free op's flip are then lists
indexed by those numbers, not dictionaries keyed by names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from graphamp.core.dtypes import estimated_elements, itemsize
from graphamp.core.graph import BodyKind, NodeKind, OpGraph, TensorInfo
from graphamp.core.vocab import Rule
from graphamp.passes.classify import SCALED_OPS
from graphamp.passes.min_cut import F32, LOW, Costs
from graphamp.passes.output_casts import cache_pairs
from graphamp.plans.records import NodeDecision
from graphamp.policy.policy import Policy

LOOP_RUNS = 10  # what a loop body's iterations count as, per enclosing loop
FREE_RULES = (Rule.INFER, Rule.CLEAR)


@dataclass
class CostTerms:
    """The cut's variables and the costs over them."""

    # by number: the terminals (0, 1), a free op's node name, "\0input:<value>", "\0cast:<node>"
    names: list[str]
    side_of: dict[str, int]  # every node's number: its variable, or its fixed side's terminal
    free: range  # the free ops' numbers, in the graph's order
    costs: Costs
    # by free op (``own[number - free.start]``): the bytes it reads and writes more in float32
    # than in the low type, through its computation-type slots, where a low op joins its
    # region (0 elsewhere, and for a body's boundary)
    own: list[int]

    def preferences(self) -> list[tuple[int, int]]:
        """(number, bytes) of each free op whose own traffic breaks a tie (rule 4)."""
        start = self.free.start
        return [(start + index, saved) for index, saved in enumerate(self.own) if saved]

    def prices(self, side: list[int]) -> tuple[list[int], list[int]]:
        """(what the costs of each free op cost with the cut ``side`` as it is, what they would
        cost were that op alone on the other side), by number. A cost is paid when a member is
        on another side than its head: with its members' sides counted once, a flip is priced
        in O(1) per cost; a cost of one member (most) is paid after a flip of either end
        exactly where it is not paid now."""
        count = len(self.names)
        now, other = [0] * count, [0] * count
        costs = self.costs
        for cost, head, member in zip(costs.amounts, costs.heads, costs.members, strict=True):
            if side[member] != side[head]:
                now[head] += cost
                now[member] += cost
            else:
                other[head] += cost
                other[member] += cost
        for cost, head, members in costs.hyperedges:
            head_side = side[head]
            low = sum(side[m] == LOW for m in members)
            wide = len(members) - low
            paid = wide > 0 if head_side == LOW else low > 0
            if paid:
                now[head] += cost
            flipped_head = F32 if head_side == LOW else LOW  # the head flips, the members stay
            if wide > 0 if flipped_head == LOW else low > 0:
                other[head] += cost
            for member in members:  # one member flips, the head stays
                step = 1 if side[member] == F32 else -1
                if paid:
                    now[member] += cost
                if wide - step > 0 if head_side == LOW else low + step > 0:
                    other[member] += cost
        return now, other  # (the terminals' and other variables' entries mean nothing)


def cost_terms(graph: OpGraph, decisions: dict[str, NodeDecision], policy: Policy) -> CostTerms:
    """Number the sides and list every cost that depends on a free op (rules 1-3 of the cost
    pass's docstring)."""
    low = policy.dtype
    low_bytes, wide = itemsize(low), itemsize("float32")
    names = ["\0low", "\0float32"]
    side_of: dict[str, int] = {}
    computes: list[bool] = []  # by free op: an op (a body's boundary computes nothing)
    for node in graph:
        decision = decisions[node.name]
        if decision.rule in FREE_RULES and node.kind in (NodeKind.OP, NodeKind.BOUNDARY):
            side_of[node.name] = len(names)
            names.append(node.name)
            computes.append(node.kind is NodeKind.OP)
        elif decision.precision == low and decision.rule is not Rule.ALREADY_LOW:
            side_of[node.name] = LOW
        else:
            side_of[node.name] = F32
    free = range(F32 + 1, len(names))
    variables: dict[str, int] = {}  # movable inputs and model Casts, by name

    def variable(name: str) -> int:
        number = variables.get(name)
        if number is None:
            number = variables[name] = len(names)
            names.append(name)
        return number

    nodes = graph.nodes

    def reader_side(node_name: str, slot: int) -> int | None:
        """The side a slot's reader is on, None when it reads any type."""
        node = nodes[node_name]
        if slot >= 0 and (
            slot in node.any_type_inputs or (node.kind is NodeKind.CAST and slot == 0)
        ):
            return None
        if slot < 0 or slot not in node.follow_inputs:
            return F32
        if slot in node.float32_params:
            return None  # a norm's float32 weight: read as it is on either side (casts.py)
        return side_of[node_name]

    def producer_side(tensor: TensorInfo) -> int:
        if tensor.is_graph_input:
            movable = not (
                tensor.type_fixed or policy.keeps_io(tensor.name) or tensor.is_graph_output
            )
            return variable(f"\0input:{tensor.name}") if movable else F32
        if tensor.producer is None:  # a master weight (fx): float32, cast at each use
            return F32
        node = nodes[tensor.producer]
        if node.kind is NodeKind.CAST:  # a Cast of the model to float32: retargetable
            return F32 if tensor.is_graph_output else variable(f"\0cast:{node.name}")
        outputs = node.outputs
        for slot in node.follow_outputs:
            if outputs[slot] == tensor.name:
                return side_of[node.name]
        return F32

    # a kept output reads float32 (a Cast back); a KV cache's present output reads the type
    # its past input takes (a Cast back where they differ: a generation loop feeds it back)
    past_of = {present: past for past, present in cache_pairs(graph).items()}
    output_side = {
        name: F32 if policy.keeps_io(name) else producer_side(graph.tensors[past_of[name]])
        for name in graph.graph_outputs
        if policy.keeps_io(name) or name in past_of
    }
    costs = Costs()
    joins = _Joins(len(names))
    first, stop = free.start, free.stop
    elements = [0] * len(free)  # by free op: the elements it reads and writes per run
    consumers = graph.consumers
    for name, tensor in graph.tensors.items():
        if tensor.dtype != "float32":
            continue
        readers = consumers(name)
        stored = tensor.is_constant and not tensor.is_graph_input
        producer = tensor.producer
        head_is_terminal = stored or (
            producer is not None
            and side_of[producer] <= F32
            and nodes[producer].kind is not NodeKind.CAST
        )
        if head_is_terminal and name not in output_side and not _any_free(readers, side_of):
            continue  # every end is a terminal: the cost decides nothing (_add)
        sides = [reader_side(n, k) for n, k in readers]
        count = estimated_elements(tensor.shape) or 1
        # (a main-graph value runs once: most of a graph's values)
        runs = _runs(graph, tensor.body) if tensor.body else 1
        for number in sides:  # what each free op reading it reads (rule 4)
            if number is not None and first <= number < stop:
                elements[number - first] += count * runs
        if name in output_side:
            sides.append(output_side[name])
        if stored:
            if _only_scales(graph, name):
                continue  # a quantisation scale's bytes decide nothing (module docstring)
            _add(costs, count * low_bytes, F32, sides)  # stored low for some reader
            _add(costs, count * wide, LOW, sides)  # stored float32 for some reader
            continue
        head = producer_side(tensor)
        if first <= head < stop:  # what the free op that writes it writes
            elements[head - first] += count * runs
        _add(costs, count * (low_bytes + wide) * runs, head, sides)
        joins.add(head, sides)
    joined = joins.low_regions()
    own = [
        count * (wide - low_bytes) if computes[index] and joins.find(first + index) in joined else 0
        for index, count in enumerate(elements)
    ]
    return CostTerms(names, side_of, free, costs, own)


class _Joins:
    """Which free ops a low op reaches through values (union-find over the numbers that share
    a value's Cast cost): rule 4's preferences count only there. A region of free ops that no
    low op reads or writes (float ops between quantisers, whose scales cost nothing either way)
    is a tie that stays float32, as TensorFlow's colouring leaves it."""

    def __init__(self, numbers: int) -> None:
        self.parent = list(range(numbers))  # grown as inputs and model Casts get numbers
        self.low: list[int] = []  # members of the regions a low op joins

    def find(self, number: int) -> int:
        parent = self.parent
        while parent[number] != number:
            parent[number] = parent[parent[number]]  # path halving
            number = parent[number]
        return number

    def add(self, head: int, sides: list[int | None]) -> None:
        """A value's cost: its producer's ``head`` and its readers' ``sides``."""
        low = head == LOW
        first = head if head > F32 else -1
        for member in sides:
            if member is None or member == F32:
                continue
            if member == LOW:
                low = True
            elif first < 0:
                first = member
            elif member != first:
                self._union(first, member)
        if first >= 0 and low:
            self.low.append(first)

    def _union(self, a: int, b: int) -> None:
        parent = self.parent
        if len(parent) <= max(a, b):
            parent.extend(range(len(parent), max(a, b) + 1))
        a, b = self.find(a), self.find(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    def low_regions(self) -> set[int]:
        """The roots of the regions a low op joins."""
        parent = self.parent
        return {self.find(n) if n < len(parent) else n for n in self.low}


def _runs(graph: OpGraph, body: str) -> int:
    """What one run of ``body`` counts as: :data:`LOOP_RUNS` per enclosing loop."""
    loops = sum(b.kind is BodyKind.LOOP for b in graph.enclosing(body))
    runs: int = LOOP_RUNS**loops
    return runs


def _add(costs: Costs, cost: int, head: int, sides: list[int | None]) -> None:
    """Add the cost of ``head`` and its readers' ``sides`` (None: one that reads any type)
    where it can be paid or not depending on a free op (the rest decide nothing: paid always,
    never, or only by a variable no free op shares a cost with, which the region search finds
    anyway). (Built-ins over the whole list rather than generators: there is one per value.)"""
    readers = dict.fromkeys(sides)
    readers.pop(None, None)  # reads any type: pays nothing
    members = cast(dict[int, None], readers)
    members.pop(head, None)  # on the head's side whatever the cut
    if members and (head > F32 or max(members) > F32):  # a variable is a number above both
        costs.add(cost, head, members)  # terminals


def _any_free(readers: list[tuple[str, int]], side_of: dict[str, int]) -> bool:
    """Whether a free op is among ``readers`` (its number is a variable's). (A loop, not
    any() over a generator: one per value, and most values have one reader.)"""
    for reader, _ in readers:  # noqa: SIM110
        if side_of[reader] > F32:
            return True
    return False


def _only_scales(graph: OpGraph, name: str) -> bool:
    """Whether every reader of ``name`` reads it as a quantisation scale."""
    readers = graph.consumers(name)
    return bool(readers) and all(
        slot == 1 and graph.nodes[node].op in SCALED_OPS for node, slot in readers
    )
