"""policy_check: say so when a rule of the policy matches nothing in the model.

``--deny Softmx`` (a typo), ``--deny softmax`` (the wrong case), a ``deny_names`` glob that
names no node (or a float8 one, ``--fp8-deny-names``), a ``deny_tensors`` or ``keep_io_types``
name that is no tensor of the graph: each would otherwise be accepted and do nothing. Each
becomes a warning with the closest names the model has; with the ``strict`` option the first
one is an error.
"""

from __future__ import annotations

import fnmatch

from graphamp.core.dtypes import LOW_TYPES
from graphamp.errors import GraphampError, did_you_mean
from graphamp.passes.base import Pass, PassResult
from graphamp.passes.context import PassContext


class PolicyCheckPass(Pass):
    """Warn about policy rules that match nothing (see the module docstring)."""

    name = "policy_check"

    def run(self, context: PassContext) -> PassResult:
        problems = unmatched_rules(context)
        if problems and context.options.strict:
            raise GraphampError(f"{problems[0]} (--strict)")
        context.warnings.extend(problems)
        return PassResult(modified=False, note=f"{len(problems)} unmatched rules")


def unmatched_rules(context: PassContext) -> list[str]:
    graph, policy = context.graph, context.policy
    problems: list[str] = []
    # (each table is built only where a rule needs it: most policies name no node or tensor,
    # and a large graph has a name per node and per value to sort)
    ops = sorted({node.op for node in graph}) if policy.moved_ops else []
    for op in policy.moved_ops:
        if op not in ops:
            list_name, _ = policy.list_of(op)
            problems.append(
                f"op {op!r} (moved to {list_name}) is the type of no node of the model"
                + did_you_mean(op, ops)
            )
    fp8 = context.options.fp8
    fp8_deny = fp8.deny_names if fp8 is not None else ()
    names = (
        sorted({n for node in graph for n in (node.name, node.scope) if n})
        if policy.deny_names or policy.allow_names or fp8_deny
        else []
    )
    name_rules = (
        ("deny_names", policy.deny_names),
        ("allow_names", policy.allow_names),
        ("float8 deny_names", fp8_deny),
    )
    for key, patterns in name_rules:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                problems.append(
                    f"{key} rule ({_FLAGS[key]}) {pattern!r} matches no node"
                    + _hint(pattern, names)
                )
    if policy.deny_tensors:
        tensors = sorted(graph.tensors)
        # a body's value by its path or by its own name in the body
        local = {graph.local_name(t) for t in tensors if graph.tensors[t].body}
        for tensor in sorted(policy.deny_tensors):
            if tensor not in graph.tensors and tensor not in local:
                problems.append(
                    f"deny_tensors name (--deny-tensor) {tensor!r} is no tensor"
                    + did_you_mean(tensor, tensors)
                )
    if policy.keep_io_types:
        io = [*graph.graph_inputs, *graph.graph_outputs]
        keep = policy.keep_io_types
        named = io if isinstance(keep, bool) else [n for n in keep if n in io]
        low = [n for n in dict.fromkeys(named) if graph.tensors[n].dtype in LOW_TYPES]
        if low:
            shown = ", ".join(repr(n) for n in low[:3]) + (
                f" and {len(low) - 3} more" if low[3:] else ""
            )
            one = len(low) == 1
            problems.append(
                f"keep_io_types (--keep-io-types, --keep-io) keeps the model's own input and "
                f"output types, and {shown} {'is' if one else 'are'} already "
                f"{graph.tensors[low[0]].dtype} in the model: nothing widens "
                f"{'it' if one else 'them'} to float32"
            )
        for name in () if isinstance(keep, bool) else keep:
            if name not in io:
                problems.append(
                    f"keep_io_types name (--keep-io) {name!r} is no graph input or output"
                    + did_you_mean(name, io)
                )
    return problems


# The command-line flag of each policy setting a message names (the setting is the Python
# API's and the policy file's name)
_FLAGS = {
    "deny_names": "--deny-name",
    "allow_names": "--allow-name",
    "float8 deny_names": "--fp8-deny-names",
}


def _hint(pattern: str, names: list[str]) -> str:
    """What a name rule that matched nothing may mean: a node's own name that holds glob
    characters (``blk[0]/act``: ``[0]`` is a set of one character, so it matches ``blk0/act``)
    is matched as itself with them escaped; else the names closest to it."""
    if pattern in names:
        literal = "".join(f"[{c}]" if c in "*?[" else c for c in pattern)
        return f"; it is a glob, where [ ] * ? are special: {literal!r} matches that node"
    return did_you_mean(pattern.replace("*", "").replace("?", ""), names)
