"""Declared types and shapes that type inference contradicts, repaired before converting.

A model's ``value_info`` and graph outputs declare each value's type and shape. When a
declaration contradicts what ONNX type inference derives from the graph (a damaged dim, a
wrong rank, element type or kind of type), or a graph output's type lost its ``shape``,
its element type or everything it held, ``onnx.checker.check_model(full_check=True)``
refuses the model, and a converted copy would be refused too. Inference settles such a
declaration, so the model is repaired before it is read: a contradicted ``value_info`` entry
is dropped (inference gives the value its type again), a graph output takes the inferred type
and shape, and one line says which values' declarations were overridden (an output that only
lacked a part gets the inferred one without a line: nothing it said is undone). An IR-3 model
whose initializers are not graph inputs is inferred as the IR-4 model it is written as (onnx
infers such a model's Slice without its stored axes: a wrong shape, written into the output
as a contradiction). Only the main graph's declarations are repaired
(a body's or function's are read as they are); what inference cannot settle (a
contradiction that stays) is refused with exit status 2, and so is a node whose types or
shapes its schema refuses (strict inference with type checks: onnxruntime refuses it too),
once the readers, who name the common cases better, have read the model.

The check costs nothing extra on a sound model: strict inference runs once, and its result
is the one the readers use; so it does for a model whose outputs lack a shape and that
declares no ``value_info`` (the outputs get the types of that one inference).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import onnx

from graphamp.errors import GraphampError, RepairWarning

# what ONNX inference says when a declaration contradicts it
CONTRADICTIONS = ("Inferred shape and existing shape differ", "Inferred elem type differs")
# what ONNX inference says when a node's types or shapes break its schema's rules
INFERENCE_ERRORS = ("[TypeInferenceError]", "[ShapeInferenceError]")
REFUSED = "refused: "  # a note that is an error: raised by :func:`warn` once the model is read


def checked(
    proto: onnx.ModelProto,
    where: str,
    light: Callable[[onnx.ModelProto], onnx.ModelProto],
    *,
    data_prop: bool = True,
) -> tuple[onnx.ModelProto, onnx.ModelProto | None, str]:
    """(``proto`` or a repaired copy, its inferred types or None where inference gives up,
    the note that says what was repaired, to show once the model is read: "" for none);
    ``light(proto)`` is ``proto`` without large weights, for inference."""
    failure = ""
    light = _as_written(light)
    if not any(_incomplete(output) for output in proto.graph.output):
        try:
            return proto, _strict(light(proto), data_prop), ""
        except GraphampError as exc:  # a contradiction, or an op inference cannot take
            failure = str(exc)
    # nothing declared but the outputs (the chain of tools/bench, a hand-made model): strict
    # inference of the bare model is the one inference, and its result the readers' too
    bare_only = not failure and not proto.graph.value_info
    alone = _strict_alone(light(proto), data_prop) if bare_only else None
    own = alone or _inferred_alone(light(proto), data_prop)
    if own is None:
        return proto, _inferred(light(proto), data_prop), ""
    # inference's entries of the values the model declares (an output's last: it wins); a
    # model that declares no value_info needs none of the others (one per value of the graph)
    declared_names = {info.name for info in proto.graph.value_info}
    inferred = (
        {info.name: info for info in own.graph.value_info if info.name in declared_names}
        if declared_names
        else {}
    )
    inferred.update((info.name, info) for info in own.graph.output)
    repaired = onnx.ModelProto()
    repaired.CopyFrom(proto)
    graph, names = repaired.graph, []
    kept = []
    for info in graph.value_info:
        if info.name in inferred and _contradicts(info, inferred[info.name]):
            names.append(info.name)
        else:
            kept.append(info)
    if len(kept) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept)
    filled = []  # outputs that lacked a shape inference gives: nothing they said is undone
    for output in graph.output:
        found = inferred.get(output.name)
        if found is not None and _contradicts(output, found):
            names.append(output.name)
        elif _incomplete(output) and found is not None and not _incomplete(found):
            filled.append(output.name)
            if output.type.HasField("tensor_type") and output.type.tensor_type.HasField("shape"):
                output.type.tensor_type.elem_type = found.type.tensor_type.elem_type
                continue  # only the element type was missing: the dims stay as declared
        else:
            continue
        output.type.CopyFrom(found.type)
    if alone is not None and not names and filled and _as_inferred(graph.output, inferred):
        # what strict inference of ``repaired`` would infer: its outputs now declare just what
        # inference gave them and it declares nothing else, as the model ``alone`` inferred
        return repaired, alone, ""
    if not names and not filled:
        if not failure:  # strict inference was skipped for an output without a shape
            try:
                _strict(light(proto), data_prop)
            except GraphampError as exc:
                failure = str(exc)
        refusal = f"{where}: type inference refuses the model: {_first(failure)}"
        if any(sign in failure for sign in CONTRADICTIONS) and not _a_node_refused(failure):
            raise GraphampError(refusal)  # in a function
        if _a_node_refused(failure):  # a body's contradiction too: its reader names the value
            # a node whose types its schema refuses (float axes, a Reshape whose dims
            # overflow): onnxruntime refuses such a model. The readers go first (they name
            # the common cases better); what they let through is refused once read
            return proto, _inferred(light(proto), data_prop), REFUSED + refusal
        return proto, _inferred(light(proto), data_prop), ""  # the readers name what is wrong
    try:
        result = _strict(light(repaired), data_prop)
    except GraphampError as exc:
        failure = str(exc)
        if _a_node_refused(failure) and not any(sign in failure for sign in CONTRADICTIONS):
            refusal = f"{where}: type inference refuses the model: {_first(failure)}"
            return repaired, _inferred(light(repaired), data_prop), REFUSED + refusal
        refusal = f"{where}: type inference refuses the model: {_first(failure)}"
        raise GraphampError(refusal) from None
    if not names:
        return repaired, result, ""
    shown = ", ".join(repr(name) for name in names[:5]) + (" ..." if len(names) > 5 else "")
    note = (
        f"{where}: {len(names)} declared type(s) contradicted type inference ({shown}): "
        "repaired with the inferred ones"
    )
    return repaired, result, note


def _strict(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto:
    """Strict inference with type checks; where only the type checks fail inside an expanded
    function body (see :func:`_a_node_refused`), strict inference without them. Its failure
    as a GraphampError holding onnx's message."""
    try:
        return onnx.shape_inference.infer_shapes(
            proto, strict_mode=True, check_type=True, data_prop=data_prop
        )
    except Exception as exc:
        failure = str(exc).strip() or type(exc).__name__
        if _a_node_refused(failure):
            raise GraphampError(failure) from None
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=data_prop)
    except Exception as exc:
        raise GraphampError(str(exc).strip() or type(exc).__name__) from None


def _a_node_refused(failure: str) -> bool:
    """Whether inference's ``failure`` is one node's types or shapes breaking its schema's
    rules (onnx writes a line per node). An error inside an expanded function body (a line
    naming two op_types: onnx's inference of a node test's MeanVarianceNormalization fails
    where onnxruntime loads it) is not."""
    return any(
        line.count("op_type:") == 1 and any(sign in line for sign in INFERENCE_ERRORS)
        for line in failure.splitlines()
    )


def _first(failure: str) -> str:
    """The line of an inference error that names the node (onnx prefixes a summary line)."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    named = [line for line in lines if "node name" in line or "op_type" in line]
    return (named or lines or ["(no message)"])[0][:300]


def warn(note: str) -> None:
    """Say what :func:`checked` repaired (once the model was read without error), or refuse
    what it found inference refuses and the readers did not."""
    if note.startswith(REFUSED):
        raise GraphampError(note.removeprefix(REFUSED))
    if note:
        warnings.warn(note, RepairWarning, stacklevel=3)


def _incomplete(info: onnx.ValueInfoProto) -> bool:
    """Whether a graph output declares less than the checker requires of one: a tensor type
    without ``shape`` or element type, or no type at all (an empty one included)."""
    kind = info.type.WhichOneof("value")
    if kind is None:
        return True
    tensor = info.type.tensor_type
    return kind == "tensor_type" and not (tensor.HasField("shape") and tensor.elem_type)


def _as_written(
    light: Callable[[onnx.ModelProto], onnx.ModelProto],
) -> Callable[[onnx.ModelProto], onnx.ModelProto]:
    """``light``, its result said to be IR version 4 where it is an IR-3 model whose
    initializers are not all graph inputs (the version the converted model says:
    ``OnnxDialect``); onnx infers such an IR-3 model wrongly."""

    def inferable(proto: onnx.ModelProto) -> onnx.ModelProto:
        result = light(proto)
        if result.ir_version >= 4:
            return result
        inputs = {value.name for value in result.graph.input}
        if all(tensor.name in inputs for tensor in result.graph.initializer):
            return result
        if result is proto:  # no large weights (light copies those): a small copy
            result = onnx.ModelProto()
            result.CopyFrom(proto)
        result.ir_version = 4
        return result

    return inferable


def _inferred(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto | None:
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=data_prop)
    except Exception:  # inference gives up on some contrib ops: the readers' local rules
        return None


def _inferred_alone(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto | None:
    """Inference's own view: ``proto``'s types inferred with its value_info left out and its
    outputs' declarations reduced to their element types."""
    return _inferred(_bare(proto), data_prop)


def _bare(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` without value_info, its outputs' declarations reduced to their
    kinds of type."""
    bare = onnx.ModelProto()
    bare.CopyFrom(proto)
    del bare.graph.value_info[:]
    for output in bare.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
            output.type.tensor_type.elem_type = 0
    return bare


def _strict_alone(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto | None:
    """:func:`_inferred_alone` by strict inference (the same types where it passes: nothing
    failed to be inferred), or None where strict inference refuses the model."""
    try:
        return _strict(_bare(proto), data_prop)
    except GraphampError:
        return None


def _as_inferred(
    outputs: Iterable[onnx.ValueInfoProto], inferred: dict[str, onnx.ValueInfoProto]
) -> bool:
    """Whether every output declares exactly the type inference gave it."""
    return all(
        output.name in inferred and output.type == inferred[output.name].type for output in outputs
    )


def _contradicts(declared: onnx.ValueInfoProto, inferred: onnx.ValueInfoProto) -> bool:
    """Whether a declared type disagrees with an inferred one (its kind, element type, rank,
    or a dimension both give as a number)."""
    kinds = declared.type.WhichOneof("value"), inferred.type.WhichOneof("value")
    if None not in kinds and kinds[0] != kinds[1]:  # a sequence declared for a tensor
        return True
    if kinds != ("tensor_type", "tensor_type"):
        return False
    mine, theirs = declared.type.tensor_type, inferred.type.tensor_type
    if mine.elem_type and theirs.elem_type and mine.elem_type != theirs.elem_type:
        return True
    if not (mine.HasField("shape") and theirs.HasField("shape")):
        return False
    if len(mine.shape.dim) != len(theirs.shape.dim):
        return True
    return any(
        a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value
        for a, b in zip(mine.shape.dim, theirs.shape.dim, strict=True)
    )
