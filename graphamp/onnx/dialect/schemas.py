"""Per-slot type rules from ONNX op schemas.

A schema names, per formal input and output, a type string: a type variable (``T``) bound by
a constraint to the types it admits, or a fixed type (``tensor(int64)``). The slots bound to the
type variable of a node's first float input carry its *computation type*: they are what changes
type when the node runs in low precision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import onnx

from graphamp.core.dtypes import FLOAT_TYPES
from graphamp.onnx.dialect.types import type_str_dtype

# Inputs a runtime needs in float32 even when the op runs in low precision (onnxruntime's
# float16 tool ALWAYS_FLOAT_INPUTS; onnxruntime #8327, onnxconverter-common #306).
FLOAT32_INPUTS: dict[str, frozenset[int]] = {
    "Resize": frozenset({1, 2}),
    "Upsample": frozenset({1}),
}


# Outputs whose presence keeps an op in float32: Attention's qk_matmul_output exposes the
# masked scores, whose masked entries hold float32's lowest value (a float16 cannot hold it),
# and its type follows the softmax precision in the op's function body.
FLOAT32_WHEN_OUTPUT: dict[str, tuple[int, str]] = {
    "Attention": (3, "its qk_matmul_output requested (masked scores need float32's range)"),
}


def float32_output_note(op_type: str, domain: str, outputs: list[str]) -> str:
    """Why an output this node writes keeps it float32 (" with ..."), or ""."""
    needs = FLOAT32_WHEN_OUTPUT.get(op_type) if domain in ("", "ai.onnx") else None
    if needs is None or len(outputs) <= needs[0] or not outputs[needs[0]]:
        return ""
    return f" with {needs[1]}"


# Attributes whose value keeps an op in float32: op -> (attribute, its default, the value that
# keeps it, why). LayerNormalization and RMSNormalization accumulate mean and variance in the
# type stash_type names: float32 by default (1), the input type with stash_type=0.
FLOAT32_WHEN_ATTRIBUTE: dict[str, tuple[str, int, int, str]] = {
    "LayerNormalization": ("stash_type", 1, 0, "stash_type=0 (statistics in the input type)"),
    "RMSNormalization": ("stash_type", 1, 0, "stash_type=0 (statistics in the input type)"),
    # from opset 23 an output_dtype fixes the output's type apart from its scale's
    "DequantizeLinear": ("output_dtype", 0, 1, "output_dtype=FLOAT (its output type fixed)"),
}


def float32_attribute_note(op_type: str, domain: str, attribute: Callable[[str], object]) -> str:
    """Why an attribute of this node keeps it float32 (" with ..."), or "". ``attribute``
    gives an attribute's value by name, None when the node has none."""
    rule = FLOAT32_WHEN_ATTRIBUTE.get(op_type)
    if rule is None or domain not in ("", "ai.onnx"):
        return ""
    name, default, keeps, why = rule
    value = attribute(name)
    return f" with {why}" if (default if value is None else value) == keeps else ""


# Slots a runtime binds to another slot's type though the schema gives each its own type
# variable. From opset 23: QuantizeLinear's y_scale (T2) and x (T1), whose onnxruntime kernels
# read a float scale in x's type (a float16 x beside a float32 scale loads, then fails on its
# first run); DequantizeLinear's y (T3) and x_scale (T2), "the same as x_scale's" type when no
# output_dtype is set. And onnxruntime's GroupQueryAttention, whose present_key/present_value
# (T_CACHE, a type of their own for a quantised cache) it types after past_key/past_value, and
# after the query when no past is given (a prompt-only model): a float16 query beside float32
# present outputs is refused on load. (domain, op) -> rules ((kind, slot) bound, (kind, slot)
# it is bound to, an input slot that must be absent for the rule to hold, or None).
Slot = tuple[str, int]
RUNTIME_BOUND: dict[tuple[str, str], tuple[tuple[Slot, Slot, int | None], ...]] = {
    ("", "QuantizeLinear"): ((("input", 1), ("input", 0), None),),
    ("", "DequantizeLinear"): ((("output", 0), ("input", 1), None),),
    ("com.microsoft", "GroupQueryAttention"): (
        (("output", 1), ("input", 0), 3),
        (("output", 2), ("input", 0), 4),
    ),
}


def runtime_bound(
    found: Schema, op: str, domain: str, input_types: tuple[str, ...], output_types: tuple[str, ...]
) -> Schema:
    """``found`` with each slot of :data:`RUNTIME_BOUND` given its partner's type variable,
    where the node holds one float type in both (a float8e8m0 scale, an ``output_dtype`` that
    fixes another type, or a given past cache keeps the schema's own reading)."""
    rules = RUNTIME_BOUND.get(("" if domain == "ai.onnx" else domain, op), ())
    types = {"input": input_types, "output": output_types}
    for (kind, slot), (to_kind, to_slot), absent in rules:
        if absent is not None and absent < len(input_types) and input_types[absent]:
            continue
        params = {"input": found.input_param, "output": found.output_param}  # as rebound so far
        dtype = types[kind][slot] if slot < len(types[kind]) else ""
        partner = types[to_kind][to_slot] if to_slot < len(types[to_kind]) else ""
        own, to = params[kind](slot), params[to_kind](to_slot)
        if own == to or to is None or dtype not in FLOAT_TYPES or dtype != partner:
            continue
        formal = found.inputs if kind == "input" else found.outputs
        rebound = tuple((to, f[1]) if i == slot else f for i, f in enumerate(formal))
        if kind == "input":
            found = dataclasses.replace(found, inputs=rebound)
        else:
            found = dataclasses.replace(found, outputs=rebound)
    return found


# Low types an op's schema admits before onnxruntime can load the op in them: with no kernel
# it expands the op's function body, whose ops do not admit the type at that opset yet (Clip's
# body uses Where, which takes bfloat16 from opset 16). (op, type) -> first opset that loads.
RUNTIME_TYPE_SINCE: dict[tuple[str, str], int] = {
    ("Clip", "bfloat16"): 16,
}


@dataclass(frozen=True)
class Schema:
    """The parts of an op schema the reader uses."""

    inputs: tuple[tuple[str, bool], ...]  # (type string, variadic) per formal input
    outputs: tuple[tuple[str, bool], ...]
    allowed: dict[str, frozenset[str]]  # type variable -> dtype names it admits
    # type variables of a variadic slot whose values may differ in type (Adam's T3)
    heterogeneous: frozenset[str] = frozenset()

    def input_param(self, slot: int) -> str | None:
        return _formal(self.inputs, slot)

    def output_param(self, slot: int) -> str | None:
        return _formal(self.outputs, slot)


# Domains whose schemas onnxruntime registers (its contrib and fused ops), not onnx.
RUNTIME_DOMAINS = frozenset({"com.microsoft", "com.microsoft.nchwc", "com.ms.internal.nhwc"})
# Ops onnxruntime registers in ONNX's own domain where onnx has no schema, and that its
# transformer optimizer writes there: the fused RMSNorm, and LayerNormalization before opset 17
# (onnx's arrived at 17). Its other registrations there (ImageScaler, Crop, *_TRT, Memcpy...)
# are experimental leftovers or internal, which it may not load: they stay unknown.
RUNTIME_OPS_IN_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization", "LayerNormalization"})


@cache
def schema(op: str, opset: int, domain: str) -> Schema | None:
    """The schema of ``domain::op`` at ``opset``: from onnx for ONNX domains, from
    onnxruntime's registrations for its own (``com.microsoft``); None when neither knows it."""
    if domain in RUNTIME_DOMAINS:
        return _runtime_schemas().get((domain, op, opset)) or _newest_before(domain, op, opset)
    try:
        found = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        # onnxruntime registers a few ops in ONNX's own domain that onnx does not define;
        # its transformer optimizer writes one of them (SimplifiedLayerNormalization, the
        # fused RMSNorm of every LLaMA-like model) into the models people deploy.
        if domain in ("", "ai.onnx") and op in RUNTIME_OPS_IN_ONNX_DOMAIN:
            return _newest_before("", op, opset)
        return None
    return _schema_of(found, onnx.defs.OpSchema.FormalParameterOption.Variadic)


def _schema_of(
    found: Any, variadic: object, type_str: str = "type_str", homogeneous: str = "is_homogeneous"
) -> Schema:
    """A :class:`Schema` from an onnx ``OpSchema`` or one of onnxruntime's registrations (the
    same fields, spelt ``typeStr``/``isHomogeneous`` there; onnxruntime is untyped, hence
    ``Any``)."""
    return Schema(
        inputs=tuple((getattr(p, type_str), p.option == variadic) for p in found.inputs),
        outputs=tuple((getattr(p, type_str), p.option == variadic) for p in found.outputs),
        allowed={
            c.type_param_str: frozenset(type_str_dtype(t) for t in c.allowed_type_strs)
            for c in found.type_constraints
        },
        heterogeneous=frozenset(
            getattr(p, type_str)
            for p in (*found.inputs, *found.outputs)
            if p.option == variadic and not getattr(p, homogeneous)
        ),
    )


@cache
def _runtime_schemas() -> dict[tuple[str, str, int], Schema]:
    """onnxruntime's registered schemas of its own domains, and of ONNX's ("") where onnx has
    none, by (domain, op, since_version). They come with the installed onnxruntime
    (``get_all_operator_schema``) on any machine."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    table: dict[tuple[str, str, int], Schema] = {}
    for found in get_all_operator_schema():
        if found.domain not in RUNTIME_DOMAINS and found.domain != "":
            continue
        variadic = found.FormalParameterOption.Variadic
        table[(found.domain, found.name, found.since_version)] = _schema_of(
            found, variadic, "typeStr", "isHomogeneous"
        )
    return table


def _newest_before(domain: str, op: str, opset: int) -> Schema | None:
    """The schema in force at ``opset``: the newest registered at or before it."""
    versions = [v for d, o, v in _runtime_schemas() if d == domain and o == op and v <= opset]
    return _runtime_schemas()[(domain, op, max(versions))] if versions else None


def _formal(params: tuple[tuple[str, bool], ...], index: int) -> str | None:
    if index < len(params):
        return params[index][0]
    if params and params[-1][1]:  # the last formal parameter is variadic
        return params[-1][0]
    return None


def any_type_inputs(found: Schema, inputs: list[str], outputs: int, target: str) -> frozenset[int]:
    """Input slots whose type variable appears at no other input or output and admits float32
    and ``target``: such a slot reads the value in either type as it is (Shape and Size read
    only a shape; before opset 13 their schemas admit float16 but not bfloat16, and a Cast
    just to feed them would move a whole tensor for nothing)."""
    uses: dict[str, int] = {}
    for slot in range(len(inputs)):
        param = found.input_param(slot)
        if param in found.allowed:
            uses[param] = uses.get(param, 0) + 1
    for slot in range(outputs):
        param = found.output_param(slot)
        if param in found.allowed:
            uses[param] = uses.get(param, 0) + 1
    return frozenset(
        slot
        for slot, name in enumerate(inputs)
        if name
        and (param := found.input_param(slot)) in found.allowed
        and uses[param] == 1
        and {"float32", target} <= found.allowed[param]
    )


def float_types(found: Schema, param: str) -> frozenset[str]:
    return frozenset(found.allowed[param] & FLOAT_TYPES)
