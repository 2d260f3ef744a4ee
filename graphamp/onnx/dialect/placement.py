"""Where the ONNX writer puts what it adds when a model has If, Loop and Scan bodies.

* A Cast goes in the scope that reads it: starting from the graph that defines the value, it
  moves down into the body that holds every reader as long as that body is an If branch (a
  branch not taken then casts nothing), never into a Loop or Scan body (the value is the same
  in every iteration: the Cast is hoisted out, once per run instead of once per iteration).
  In the graph that defines the value it goes right after the producer; in a body, first.
* A boundary slot is an input of the body's owner (rewired like any input) or a result of a
  body graph. A body graph may only return a value it produces or takes as a parameter
  (``onnx.checker``), so where the value comes from an enclosing scope (a Cast shared with
  other readers there) the body returns it through an Identity of its own.
"""

from __future__ import annotations

from collections import defaultdict

from graphamp.core.graph import BodyKind
from graphamp.onnx.dialect.handles import ProtoHandles, Scope
from graphamp.plans.edits import EditScript


def reading_scopes(
    script: EditScript, handles: ProtoHandles, main: Scope
) -> dict[str, list[Scope]]:
    """For every value a slot is rewired to read: the graphs those slots read it in."""
    found: dict[str, list[Scope]] = defaultdict(list)
    for (node, slot), tensor in script.rewire.items():
        if node in handles.boundaries:
            scope, _, _ = handles.boundaries[node][slot]
            found[tensor].append(scope)
        else:
            placed = handles.nodes.get(node)
            found[tensor].append(placed[0] if placed is not None else main)
    return found


def place(home: Scope, readers: list[Scope]) -> Scope | None:
    """The body a Cast of a value ``home`` defines goes first in, read in ``readers``
    (module docstring); None: in ``home``, right after the value's producer."""
    if not readers:
        return None
    common = _chain(readers[0])
    for scope in readers[1:]:
        chain = _chain(scope)
        length = 0
        while length < min(len(common), len(chain)) and common[length] is chain[length]:
            length += 1
        common = common[:length]
    base = _chain(home)
    if len(common) < len(base) or any(a is not b for a, b in zip(base, common, strict=False)):
        return None  # a reader outside the value's scope: cannot be; keep it safe
    where = home
    for scope in common[len(base) :]:
        if scope.body is None or scope.body.kind is BodyKind.LOOP:
            break
        where = scope
    return None if where is home else where


def _chain(scope: Scope) -> list[Scope]:
    """The graphs from the main graph down to ``scope``."""
    chain = [scope]
    while scope.parent is not None:
        scope = scope.parent
        chain.append(scope)
    return chain[::-1]
