"""Graph outputs cast back to their original type, and the names that read them.

A graph output computed in low precision that ``keep_io_types`` keeps (or a KV cache's present
output whose past input stays float32) is cast back under its own name; the low value is
renamed ``<name>__<dtype>``. In an edit script, a slot rewired to the output's *name* reads
the Cast back (a float32 reader shares it); one that reads the low value must be rewired to
the renamed value instead (:func:`read_low_values`), or a float16 node would read float32.

Used by :mod:`casts`; helpers, not a pass.
"""

from __future__ import annotations

from graphamp.core.dtypes import LOW_TYPES, cast_bytes
from graphamp.core.graph import OpGraph
from graphamp.core.names import Names
from graphamp.plans.edits import EditScript
from graphamp.plans.records import CastRecord
from graphamp.policy.policy import Policy


def cache_pairs(graph: OpGraph) -> dict[str, str]:
    """A decoder's KV cache: past input -> the present output it pairs with, matched by name
    (``past_key_values.0.key`` / ``present.0.key``, ``past_key_0`` / ``present_key_0``)."""

    def key(name: str, *prefixes: str) -> str:
        lowered = name.lower()
        for prefix in prefixes:
            lowered = lowered.replace(prefix, "")
        return "".join(ch for ch in lowered if ch.isalnum())

    presents = {
        key(name, "present"): name for name in graph.graph_outputs if "present" in name.lower()
    }
    pairs = {}
    for name in graph.graph_inputs:
        if name.lower().startswith("past"):
            present = presents.get(key(name, "past_key_values", "past"))
            if present is not None:
                pairs[name] = present
    return pairs


def outputs_cast_back(
    graph: OpGraph, policy: Policy, has: dict[str, str], caches: dict[str, str]
) -> dict[str, str]:
    """Graph outputs computed in low precision that are cast back to their original type
    under their own name (output -> that type): the kept ones, and a KV cache's present output
    whose past input stays in its original type (a generation loop feeds present back)."""
    past_of = {present: past for past, present in caches.items()}
    cast_back = {}
    for name in graph.graph_outputs:
        original = graph.tensors[name].dtype
        if has[name] == original or has[name] not in LOW_TYPES:
            continue
        past = past_of.get(name)
        if policy.keeps_io(name) or (past is not None and has[past] != has[name]):
            cast_back[name] = original
    return cast_back


def plan_output_casts(
    graph: OpGraph,
    has: dict[str, str],
    edits: EditScript,
    names: Names,
    cast_back: dict[str, str],
    shared: dict[str, list[str]],
) -> None:
    """The Casts back of :func:`outputs_cast_back`, read by the graph and by ``shared``."""
    for name in graph.graph_outputs:
        if name not in cast_back:
            continue
        renamed = names.derived(name, f"__{has[name]}")
        # The Cast keeps the output's name for its value; its node needs a name no node has
        # (a Keras-converted model names the output's producer after it).
        node = names.node(graph.local_name(name), body=graph.tensors[name].body)
        if node != name:
            edits.cast_nodes[name] = node
        edits.output_casts.append(
            CastRecord(
                tensor=renamed,
                src=has[name],
                dst=cast_back[name],
                output=name,
                consumers=sorted(set(shared.get(name, []))),
                purpose="graph output kept in its original type",
                bytes=cast_bytes(graph.tensors[name].shape, has[name], cast_back[name]),
            )
        )


def read_low_values(edits: EditScript, as_is: list[tuple[str, int]]) -> None:
    """Slots in ``as_is`` (rewired to a value they read in the type it has) that were rewired
    to an output cast back read its renamed low value (module docstring)."""
    low_name = {record.output: record.tensor for record in edits.output_casts}
    for slot_key in as_is:
        target = edits.rewire.get(slot_key)
        if target in low_name:
            edits.rewire[slot_key] = low_name[target]
