"""Per-slot type rules from ONNX op schemas.

A schema names, per formal input and output, a type string: a type variable (``T``) bound by
a constraint to the types it admits, or a fixed type (``tensor(int64)``). The slots bound to the
type variable of a node's first float input carry its *computation type*: they are what changes
type when the node runs in low precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import onnx

from graphamp.dtypes import FLOAT_TYPES
from graphamp.onnx.types import type_str_dtype

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


@cache
def schema(op: str, opset: int, domain: str) -> Schema | None:
    """The schema of ``domain::op`` at ``opset``, or None when onnx knows none."""
    try:
        found = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return Schema(
        inputs=tuple((p.type_str, p.option == variadic) for p in found.inputs),
        outputs=tuple((p.type_str, p.option == variadic) for p in found.outputs),
        allowed={
            c.type_param_str: frozenset(type_str_dtype(t) for t in c.allowed_type_strs)
            for c in found.type_constraints
        },
        heterogeneous=frozenset(
            p.type_str
            for p in (*found.inputs, *found.outputs)
            if p.option == variadic and not p.is_homogeneous
        ),
    )


def _formal(params: tuple[tuple[str, bool], ...], index: int) -> str | None:
    if index < len(params):
        return params[index][0]
    if params and params[-1][1]:  # the last formal parameter is variadic
        return params[-1][0]
    return None


def any_type_inputs(found: Schema, inputs: list[str], outputs: int) -> frozenset[int]:
    """Input slots whose type variable appears at no other input or output and admits all the
    float types: such a slot reads any float type as it is."""
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
        and {"float32", "float16", "bfloat16"} <= found.allowed[param]
    )


def float_types(found: Schema, param: str) -> frozenset[str]:
    return frozenset(found.allowed[param] & FLOAT_TYPES)
