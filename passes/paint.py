"""paint: spread precisions along the dataflow, with TensorFlow's auto_mixed_precision rules.

Walks only ``graph.dataflow`` (edges between computation-type slots), so an integer shape input
or a Cast already in the model is a barrier. Rules, in order:

1. **Allow.** allow-class nodes run in low precision.
2. **Deny forward.** Mark every node from which a deny or infer node can be reached through
   clear nodes only (the roots included). From each deny node (deny list or a name/tensor
   rule) walk forward, entering only marked nodes: they become float32 (``deny_spread``). So
   deny spreads only along paths that *end* at a deny or infer op:
   ``deny->infer->clear->infer->clear->allow->infer`` gives
   ``deny,deny,deny,deny,clear,allow,infer``.
3. **Between allow.** A clear or infer node (not denied) that lies downstream of an allow node
   and upstream of an allow node, through clear/infer nodes only, runs in low precision.
4. **Allow through clear.** From every low-precision node, walk through clear nodes in both
   directions: they run in low precision.
5. Everything else keeps the decision classify gave it (float32 for infer/clear/deny).

Every node painted low records the low-precision node its colour came from (``via``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from graphamp.core.graph import OpGraph
from graphamp.core.vocab import DENY_SEEDS, Precision, Rule
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.plans.records import NodeDecision

log = logging.getLogger(__name__)

_FOLLOWERS = (Rule.INFER, Rule.CLEAR)


class PaintPass(Pass):
    """Spread precisions along the dataflow (see the module docstring)."""

    name = "paint"
    requires = frozenset({Fact.CLASSIFIED})
    gives = frozenset({Fact.DECIDED})

    def run(self, context: PassContext) -> PassResult:
        context.decisions = paint(context.graph, context.decisions, context.policy.dtype)
        return PassResult(modified=False)


def paint(graph: OpGraph, classes: dict[str, NodeDecision], low: str) -> dict[str, NodeDecision]:
    """Final precision of every node; ``classes`` comes from the classify pass."""
    flow = graph.dataflow
    order = list(graph.nodes)  # topological, the dialect's order: keeps the walks deterministic
    rule = {name: decision.rule for name, decision in classes.items()}
    decisions = dict(classes)
    low_precision = Precision(low)

    allow = {name for name in order if rule[name] in (Rule.ALLOW, Rule.ALLOW_NAME)}
    if not allow:
        log.info("no allow-list ops: nothing runs in %s", low)

    # 2. Deny forward, only along paths that end at a deny or infer node.
    spread = deny_spread_decisions(graph, classes)
    decisions.update(spread)
    denied = {name: str(d.via) for name, d in spread.items()}

    # 3. Clear and infer nodes between allow nodes.
    def can_join(name: str) -> bool:
        return rule[name] in _FOLLOWERS and name not in denied

    downstream_of_allow: set[str] = set()
    # one walk from every allow node: only the union of what they reach is wanted
    _walk(
        flow.successors,
        [n for n in order if n in allow],
        downstream_of_allow,
        enter=lambda n: n not in allow and can_join(n),
    )
    low_set = set(allow)
    source: dict[str, str] = {}
    upstream_of_allow: set[str] = set()
    for root in (n for n in order if n in allow):
        if root in upstream_of_allow:
            continue
        # walks that share what they have seen, inline: one per allow node
        upstream_of_allow.add(root)
        stack = [root]
        while stack:
            for near in flow.predecessors(stack.pop()):
                if (
                    near not in upstream_of_allow
                    and near in downstream_of_allow
                    and near not in allow
                ):
                    upstream_of_allow.add(near)
                    stack.append(near)
                    if near not in low_set:
                        low_set.add(near)
                        source[near] = root
    for name, root in source.items():
        decisions[name] = NodeDecision(
            op=classes[name].op,
            precision=low_precision,
            rule=rule[name],
            reason=_with_own_reason(
                classes[name], f"{rule[name]} list op between low-precision ops"
            ),
            via=root,
        )

    # 4. Allow through clear, both directions.
    position = {name: index for index, name in enumerate(order)}
    for root in [n for n in order if n in low_set]:
        # A walk per low node, inline: most have no clear neighbour outside low_set, and a
        # large graph has a great many low nodes.
        reached, stack = [], [root]
        while stack:
            for near in flow.neighbours(stack.pop()):
                if rule[near] is Rule.CLEAR and near not in low_set and near not in denied:
                    low_set.add(near)
                    reached.append(near)
                    stack.append(near)
        for name in sorted(reached, key=position.__getitem__) if reached else ():
            decisions[name] = NodeDecision(
                op=classes[name].op,
                precision=low_precision,
                rule=Rule.CLEAR,
                reason="clear list op joined to a low-precision neighbour",
                via=root,
            )

    for name in order:
        decision = decisions[name]
        if decision.rule in _FOLLOWERS and decision.precision != low:
            decisions[name] = NodeDecision(
                op=decision.op,
                precision=Precision.FLOAT32,
                rule=decision.rule,
                reason=_with_own_reason(
                    classes[name],
                    "infer list op not between low-precision ops"
                    if decision.rule is Rule.INFER
                    else "clear list op with no low-precision neighbour",
                ),
            )
    log.info("painted %d of %d nodes %s", len(low_set), len(order), low)
    return decisions


def deny_spread_decisions(
    graph: OpGraph, classes: dict[str, NodeDecision]
) -> dict[str, NodeDecision]:
    """Rule 2: the infer and clear nodes deny spreads to (float32, rule ``deny_spread``, via
    the deny node it came from), walking forward from each deny seed through nodes that lie
    upstream of a deny or infer node through clear nodes only. The cost pass keeps this rule
    too."""
    flow = graph.dataflow
    order = list(graph.nodes)
    rule = {name: decision.rule for name, decision in classes.items()}
    upstream_of_deny_or_infer: set[str] = set()
    roots = [n for n in order if rule[n] in DENY_SEEDS or rule[n] is Rule.INFER]
    _walk(
        flow.predecessors, roots, upstream_of_deny_or_infer, enter=lambda n: rule[n] is Rule.CLEAR
    )
    denied: dict[str, str] = {}
    for seed in (n for n in order if rule[n] in DENY_SEEDS):
        # a walk per seed, inline (most seeds reach nothing, and there may be thousands)
        reached, stack = {seed}, [seed]
        while stack:
            for near in flow.successors(stack.pop()):
                if (
                    near not in reached
                    and near in upstream_of_deny_or_infer
                    and near not in denied
                    and rule[near] in _FOLLOWERS
                ):
                    reached.add(near)
                    stack.append(near)
        reached.discard(seed)
        for name in reached:
            denied.setdefault(name, seed)
    return {
        name: NodeDecision(
            op=classes[name].op,
            precision=Precision.FLOAT32,
            rule=Rule.DENY_SPREAD,
            reason=f"{classes[name].rule} list op downstream of deny op {seed!r} on a path to a"
            " deny or infer op",
            via=seed,
        )
        for name, seed in denied.items()
    }


def _walk(
    step: Callable[[str], Iterable[str]],
    roots: list[str],
    seen: set[str],
    *,
    enter: Callable[[str], bool],
) -> set[str]:
    """Depth-first walk from ``roots`` (always entered) into nodes passing ``enter``.

    Adds every visited node to ``seen`` (shared between calls to walk from many roots once)
    and returns the nodes this call visited.
    """
    visited: set[str] = set()
    stack = [root for root in roots if root not in seen]
    for root in stack:
        seen.add(root)
    visited.update(stack)
    while stack:
        name = stack.pop()
        for nxt in step(name):
            if nxt not in seen and enter(nxt):
                seen.add(nxt)
                visited.add(nxt)
                stack.append(nxt)
    return visited


def _with_own_reason(decision: NodeDecision, painted: str) -> str:
    """``painted``, followed by the node's classify reason where that was more than its list
    entry (a pass moved it into the list: the saturation pass's ``Pow``, say)."""
    if decision.reason.startswith(f"{decision.rule} list"):
        return painted
    return f"{painted}; {decision.reason}"
