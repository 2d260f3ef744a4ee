"""The rules every pass keeps, checked between passes (in tests and under ``graphamp -v``).

* the graph's node order is topological;
* once classified, every node has a decision; once decided, no deny seed (deny list, deny_names,
  deny_tensors, tuned) or ``range`` node runs in low precision;
* once the edits exist, there is one cast per (tensor, dtype), no cast to the type its input
  already has, and no cast of a value another inserted cast produced.
"""

from __future__ import annotations

from graphamp.core.dtypes import LOW_TYPES
from graphamp.core.vocab import DENY_SEEDS, KEPT_FLOAT32
from graphamp.errors import InternalError
from graphamp.passes.context import PassContext
from graphamp.passes.facts import Fact


def check_invariants(context: PassContext, *, after: str) -> None:
    """Raise :class:`InternalError` naming the first broken rule and what broke it."""
    graph = context.graph
    problem = graph.first_out_of_order()
    if problem is not None:
        node, tensor = problem
        _fail(after, f"node {node!r} reads {tensor!r} before anything produces it")
    decided = Fact.DECIDED in context.facts
    if decided or Fact.CLASSIFIED in context.facts:
        for name in graph.nodes:
            decision = context.decisions.get(name)
            if decision is None:
                _fail(after, f"node {name!r} has no decision")
            elif decided and decision.rule in KEPT_FLOAT32 and decision.precision in LOW_TYPES:
                kind = "deny seed" if decision.rule in DENY_SEEDS else "float32 rule"
                _fail(after, f"{kind} {name!r} ({decision.rule}) runs in {decision.precision}")
    if Fact.EDITS in context.facts:
        _check_casts(context, after)


def _check_casts(context: PassContext, after: str) -> None:
    script = context.script
    original = {name: tensor.dtype for name, tensor in context.graph.tensors.items()}
    has = {**original, **script.retype}
    seen: set[tuple[str, str]] = set()
    outputs = {cast.output for cast in script.casts}
    for cast in script.casts:
        key = (cast.tensor, cast.dst)
        if key in seen:
            _fail(after, f"two casts of {cast.tensor!r} to {cast.dst}")
        seen.add(key)
        if has.get(cast.tensor) == cast.dst or cast.src == cast.dst:
            _fail(after, f"cast of {cast.tensor!r} to {cast.dst}, the type it already has")
        if cast.tensor in outputs:
            _fail(after, f"cast of {cast.tensor!r}, itself the output of an inserted cast")
    for cast in script.output_casts:
        if cast.src == cast.dst:
            _fail(after, f"output cast of {cast.output!r} to {cast.dst}, the type it has")


def _fail(after: str, message: str) -> None:
    raise InternalError(f"after {after}: {message}")
