"""Casts already in the model that give a tensor the type a slot needs: shared, not doubled.

A model may already hold ``Cast(x -> float16)`` (an export under autocast, a float16 island)
where the conversion wants ``x`` in float16 for other readers too. One Cast per (tensor, dtype)
holds for the model's own Casts as well:

* when the model's Cast comes before every slot that needs it, those slots read it;
* otherwise the inserted Cast (placed right after the producer of ``x``) takes the model
  Cast's readers too and the model Cast is removed;
* unless the model Cast's output is a graph output or is read in any other way than as it is:
  then the model Cast moves up, right after the producer of ``x``, and every slot reads it;
* two Casts of the model that the conversion made equal (``Cast(Cast(x -> float16) ->
  float32)`` and ``Cast(x -> float32)`` once ``x`` is float16) become one where they can.

Used by :mod:`casts`; a helper, not a pass.
"""

from __future__ import annotations

from graphamp.core.graph import OpGraph, OpNode
from graphamp.plans.edits import EditScript

Slot = tuple[str, int]


def share_model_casts(
    graph: OpGraph,
    cast_readers: dict[tuple[str, str], list[Slot]],
    model_casts: list[OpNode],
    alias: dict[str, str],
    removed: set[str],
    has: dict[str, str],
    edits: EditScript,
    still_read: set[str],
    cast_back: dict[str, str],
) -> None:
    """Rewire ``cast_readers`` (slots that would get a new Cast, by (tensor, dtype)) to a Cast
    of the model that gives the same, or hand that Cast's readers to the new one (module
    docstring). ``model_casts``: the graph's Cast nodes, in graph order; ``alias``/``removed``:
    Casts the casts pass already removed as no-ops; ``cast_back``: graph outputs cast back to
    their type, whose float32 readers share that."""
    order: dict[str, int] = {}  # graph positions, numbered when a Cast first needs them
    existing: dict[tuple[str, str], OpNode] = {}
    for node in model_casts:
        if node.name not in removed and node.inputs[0]:
            # what it reads after the casts pass (rerouted before a lossless widening, say)
            source = _resolve(alias, edits.rewire.get((node.name, 0), node.inputs[0]))
            first = existing.setdefault((source, has[node.outputs[0]]), node)
            if first is not node:  # two Casts of the model that now give the same value
                _merge_into(graph, node, first, cast_readers, alias, removed, edits, still_read)
    for key, slots in list(cast_readers.items()):
        cast = existing.get(key)
        if cast is None or cast_back.get(key[0]) == key[1]:  # the output's own Cast back
            continue
        if not order:
            order.update((node.name, index) for index, node in enumerate(graph))
        if all(order[reader] > order[cast.name] for reader, _ in slots):
            for slot_key in slots:
                edits.rewire[slot_key] = cast.outputs[0]
            still_read.add(cast.outputs[0])
            del cast_readers[key]
        elif (own_readers := _plain_readers(graph, cast, cast_readers, alias, edits)) is not None:
            slots.extend(own_readers)
            edits.remove_nodes.append(cast.name)
            edits.retarget_casts.pop(cast.name, None)
            removed.add(cast.name)
        else:  # the model's Cast must stay: it moves up to where the new one would go
            for slot_key in slots:
                edits.rewire[slot_key] = cast.outputs[0]
            edits.hoist_casts.append(cast.name)
            still_read.add(cast.outputs[0])
            del cast_readers[key]


def _merge_into(
    graph: OpGraph,
    cast: OpNode,
    first: OpNode,
    cast_readers: dict[tuple[str, str], list[Slot]],
    alias: dict[str, str],
    removed: set[str],
    edits: EditScript,
    still_read: set[str],
) -> None:
    """Let ``cast``'s readers read the earlier ``first`` and remove ``cast`` (a model's
    ``Cast(Cast(x -> float16) -> float32)`` and ``Cast(x -> float32)`` once ``x`` is float16),
    unless its output is a graph output or read another way."""
    readers = _plain_readers(graph, cast, cast_readers, alias, edits)
    if readers is None:
        return
    for slot_key in readers:
        edits.rewire[slot_key] = first.outputs[0]
    still_read.add(first.outputs[0])
    edits.remove_nodes.append(cast.name)
    edits.retarget_casts.pop(cast.name, None)
    removed.add(cast.name)


def _plain_readers(
    graph: OpGraph,
    cast: OpNode,
    cast_readers: dict[tuple[str, str], list[Slot]],
    alias: dict[str, str],
    edits: EditScript,
) -> list[Slot] | None:
    """The slots reading ``cast``'s output as it is, or None when it is also a graph output
    or read any other way (through a removed Cast, cast again, a slot rewired to it)."""
    output = cast.outputs[0]
    if graph.tensors[output].is_graph_output or output in alias.values():
        return None
    if output in edits.rewire.values() or any(source == output for source, _ in cast_readers):
        return None
    # a slot already rewired (to the widened source, say) no longer reads the output
    return [slot_key for slot_key in graph.consumers(output) if slot_key not in edits.rewire]


def _resolve(alias: dict[str, str], name: str) -> str:
    while name in alias:
        name = alias[name]
    return name
