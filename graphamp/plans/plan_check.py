"""Checking a plan file's JSON before anything reads it.

A plan file is data from a review (or a stranger): every field is checked for its JSON type
and, where the vocabulary fixes it, its value, before :meth:`Plan.from_dict` builds records
from it. A wrong type anywhere (a number among ``casts_removed``, a string for ``flops``, a
list of numbers for ``keep_io_types``) is one line naming the field, never an error deep in a
diff, an explanation or the reviewed-plan check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn, cast

from graphamp.core.dtypes import LOW_TYPES
from graphamp.core.vocab import FP8_RULES, ListName, Precision, Rule
from graphamp.errors import GraphampError
from graphamp.plans.records import SCALE_FORMATS, SCALE_GRANULARITIES, SCALE_SOURCES

Check = Callable[[object, str], None]


class _Refused(Exception):
    """A field that is not what the plan format says: (path, what it must be, the value,
    whether the value is a word a later graphamp may have added to the vocabulary)."""


def check_plan_data(data: dict[str, object], where: str) -> None:
    """Raise a GraphampError naming the first field of ``data`` (a plan's JSON, format and
    version already checked) whose type or value the plan format does not allow."""
    try:
        _record(data, "", _PLAN, optional=_PLAN_OPTIONAL, open_keys=True)
        _vias_name_nodes(cast(dict[str, dict[str, object]], data["nodes"]))  # checked just above
        _fp8_sections_together(data)
    except _Refused as refused:
        path, expected, value, newer = refused.args
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        hint = " (a word this graphamp does not know: a plan from a newer one?)" if newer else ""
        raise GraphampError(f"{where}: {path} must be {expected}, not {shown}{hint}") from None


def _vias_name_nodes(nodes: dict[str, dict[str, object]]) -> None:
    """Every ``via`` names a node of the plan: ``explain`` follows them from node to node."""
    for name, decision in nodes.items():
        via = decision.get("via")
        if via is not None and via not in nodes:
            _fail(f"nodes[{name!r}].via", "the name of a node of the plan", via)


def _fp8_sections_together(data: dict[str, object]) -> None:
    """A float8 plan holds its settings, decisions and scales together, and decides only nodes
    of the plan."""
    present = [key for key in _FP8_KEYS if key in data]
    if present and len(present) != len(_FP8_KEYS):
        missing = next(key for key in _FP8_KEYS if key not in data)
        _fail(missing, f"present with {present[0]!r} (a float8 plan holds all three)", "nothing")
    decided = cast(dict[str, object], data.get("fp8", {}))  # both objects, as _record checked
    nodes = cast(dict[str, object], data["nodes"])
    for name in decided:
        if name not in nodes:
            _fail(f"fp8[{name!r}]", "a node of the plan", name)


def _fail(path: str, expected: str, value: object, newer: bool = False) -> NoReturn:
    raise _Refused(path, expected, value, newer)


def _string(value: object, path: str) -> None:
    if not isinstance(value, str):
        _fail(path, "a string", value)


def _count(value: object, path: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail(path, "a whole number >= 0", value)


def _number(value: object, path: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        _fail(path, "a number", value)


def _flag(value: object, path: str) -> None:
    if not isinstance(value, bool):
        _fail(path, "true or false", value)


def _one_of(kind: str, allowed: frozenset[str]) -> Check:
    def check(value: object, path: str) -> None:
        if not isinstance(value, str) or value not in allowed:
            newer = isinstance(value, str) and value.isidentifier()
            _fail(path, f"{kind} ({', '.join(sorted(allowed))})", value, newer)

    return check


def _optional(check: Check) -> Check:
    def optional(value: object, path: str) -> None:
        if value is not None:
            check(value, path)

    return optional


def _strings(value: object, path: str) -> None:
    if not isinstance(value, list):
        _fail(path, "a list of strings", value)
    for index, item in enumerate(value):
        _string(item, f"{path}[{index}]")


def _mapping(check: Check) -> Check:
    def mapping(value: object, path: str) -> None:
        if not isinstance(value, dict):
            _fail(path, "an object", value)
        for key, item in value.items():
            check(item, f"{path}[{key!r}]")

    return mapping


def _records(fields: Mapping[str, Check], optional: Mapping[str, Check]) -> Check:
    def records(value: object, path: str) -> None:
        if not isinstance(value, list):
            _fail(path, "a list", value)
        for index, item in enumerate(value):
            _record(item, f"{path}[{index}]", fields, optional=optional)

    return records


def _record(
    value: object,
    path: str,
    fields: Mapping[str, Check],
    *,
    optional: Mapping[str, Check],
    open_keys: bool = False,
) -> None:
    """``value`` is an object with every key of ``fields``, maybe those of ``optional``, and
    (unless ``open_keys``) no other."""
    if not isinstance(value, dict):
        _fail(path or "the plan", "an object", value)
    prefix = f"{path}." if path else ""
    for key, check in fields.items():
        if key not in value:
            _fail(f"{prefix}{key}", "present", "nothing")
        check(value[key], f"{prefix}{key}")
    for key, check in optional.items():
        if key in value:
            check(value[key], f"{prefix}{key}")
    unknown = sorted(set(value) - set(fields) - set(optional))
    if unknown and not open_keys:
        _fail(f"{prefix}{unknown[0]}", "absent (no such field)", value[unknown[0]])


def _keep_io_types(value: object, path: str) -> None:
    if not isinstance(value, bool):
        _strings(value, path)


def _policy(value: object, path: str) -> None:
    lists: dict[str, Check] = {name: _strings for name in ListName}
    _record(value, path, {"dtype": _DTYPE, "dialect": _string}, optional={
        "lists": lambda v, p: _record(v, p, lists, optional={}),
        "spread": _string,
        "target": _one_of("a target", frozenset({"cuda", "cpu", "any"})),
        "deny_names": _strings,
        "deny_tensors": _strings,
        "keep_io_types": _keep_io_types,
    }, open_keys=True)  # fmt: skip


_DTYPE = _one_of("a low-precision type", LOW_TYPES)
_NODE = {
    "op": _string,
    "precision": _one_of("a precision", frozenset(Precision)),
    "rule": _one_of("a rule", frozenset(Rule)),
    "reason": _string,
}
_NODE_OPTIONAL = {
    "via": _optional(_string),
    "flops": _optional(_count),
    "module": _optional(_string),
}
_CAST = {name: _string for name in ("tensor", "from", "to", "output", "purpose")} | {
    "consumers": _strings
}
_WEIGHT = {name: _string for name in ("name", "src", "dst", "stored_as")} | {
    "in_place": _flag,
    "elements": _count,
    "bytes_before": _count,
    "bytes_after": _count,
    "flushed_to_zero": _count,
}
_WEIGHT_OPTIONAL = {"consumers": _strings, "out_of_range": _count, "at_limit": _count}
_PLAN: dict[str, Check] = {
    "dtype": _DTYPE,
    "policy": _policy,
    "nodes": _mapping(lambda v, p: _record(v, p, _NODE, optional=_NODE_OPTIONAL)),
    "casts": _records(_CAST, {"bytes": _count}),
    "weights": _records(_WEIGHT, _WEIGHT_OPTIONAL),
}
_REWRITE = (
    {name: _string for name in ("node", "op", "domain", "rule", "reason")}
    | {name: _strings for name in ("inputs", "outputs", "replaces")}
    | {"attributes": _mapping(_number)}
)
_FP8_DECISION = {
    "precision": _one_of("a precision", frozenset(Precision)),
    "rule": _one_of("a float8 rule", FP8_RULES),
    "reason": _string,
}
_SCALE = {
    "tensor": _string,
    "format": _one_of("a scale format", frozenset(SCALE_FORMATS)),
    "granularity": _one_of("a granularity", frozenset(SCALE_GRANULARITIES)),
    "source": _one_of("a scale source", frozenset(SCALE_SOURCES)),
}
_SCALE_OPTIONAL = {
    "detail": lambda v, p: _record(v, p, {}, optional={}, open_keys=True),
    "consumers": _strings,
    "state": _strings,
}
_FP8_KEYS = ("fp8_settings", "fp8", "scales")
_PLAN_OPTIONAL: dict[str, Check] = {
    "fp8_settings": lambda v, p: _record(v, p, {"recipe": _string}, optional={}, open_keys=True),
    "fp8": _mapping(lambda v, p: _record(v, p, _FP8_DECISION, optional={"operands": _strings})),
    "scales": _records(_SCALE, _SCALE_OPTIONAL),
    "model": _string,
    "rewrites": _records(_REWRITE, {"drops": _strings}),
    "casts_retargeted": _mapping(_string),
    "casts_removed": _strings,
}
