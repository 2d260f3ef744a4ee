"""``calibrate``: run the float32 model on data and record every value's range.

The statistics are reduced inside the graph (:mod:`graphamp.onnx.numerics.statgraph`): one run per
batch, and memory that of the model whatever its number of intermediates. With
``histograms=True`` (float8) the activations the main graph's matrix ops read are also
fetched, one batch at a time, for their binade histograms (``TensorRange.log2_counts``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import onnx

from graphamp.errors import DataWarning, warn
from graphamp.lists import matrix_ops
from graphamp.numerics.batches import DataSource, Feeds, as_batches
from graphamp.numerics.ranges import Ranges, TensorRange, log2_counts
from graphamp.onnx.numerics.body_stats import with_body_stats
from graphamp.onnx.numerics.runtime import input_specs
from graphamp.onnx.numerics.session import Session, as_proto
from graphamp.onnx.numerics.statgraph import (
    RANGE_STATS,
    float32_values,
    stat_name,
    with_range_stats,
)


def calibrate(
    model: object, data: DataSource, *, label: str = "", histograms: bool = False
) -> Ranges:
    """The :class:`~graphamp.numerics.ranges.Ranges` of ``model``'s float32 values (graph inputs and
    node outputs, those inside bodies and model-local functions by their OpGraph names) over
    ``data``: a DATA path (``.npz`` or a folder of them),
    one dict of arrays, or an iterable of such dicts."""
    proto = as_proto(model)
    batches = as_batches(data, input_specs(proto))
    return calibrate_proto(proto, batches, label=label or _label(model), histograms=histograms)


def calibrate_proto(
    proto: onnx.ModelProto,
    batches: Iterable[Feeds],
    *,
    label: str = "",
    histograms: bool = False,
) -> Ranges:
    if proto.functions:  # each call's values, named as the reader names them
        proto = functions_inlined(proto)
    tensors = float32_values(proto)
    # the values inside If/Loop/Scan bodies too, by their OpGraph names (body_stats)
    work = onnx.ModelProto()
    work.CopyFrom(proto)
    inner = with_body_stats(work)
    stats_model = with_range_stats(work, tensors)
    for name in (stat_name(t, s) for t in inner for s in RANGE_STATS):
        stats_model.graph.output.append(onnx.ValueInfoProto(name=name))
    tensors += inner
    counted = _matrix_activations(proto, set(tensors)) if histograms else []
    inputs = {v.name for v in proto.graph.input}
    for name in counted:
        if name not in inputs:
            stats_model.graph.output.append(onnx.ValueInfoProto(name=name))
    session = Session(stats_model, what="the calibration model")
    ranges = Ranges(model=label)
    warned: set[str] = set()
    for number, feeds in enumerate(batches, 1):
        _warn_nan(feeds, number, warned)
        values = session.run(feeds)
        found = {t: _range(values, t) for t in tensors}
        for name in counted:
            value = feeds[name] if name in inputs else values[name]
            found[name] = dataclasses.replace(found[name], log2_counts=log2_counts(value))
        ranges.update(Ranges(found, batches=1))
    return ranges


def _warn_nan(feeds: Feeds, number: int, warned: set[str]) -> None:
    """One DataWarning per input whose calibration arrays hold NaN (an infinity is a mask's
    value, taken as it is)."""
    for name, array in feeds.items():
        values = np.asarray(array)
        if name in warned or values.dtype.kind != "f":
            continue
        count = int(np.isnan(values).sum())
        if not count:
            continue
        warned.add(name)
        warn(
            f"calibration data: input {name!r} holds {count} NaN values "
            f"(batch {number}): every range computed from it is NaN, so the range rules and "
            "float8's keep what it reaches; calibrate on finite data",
            DataWarning,
        )


def _matrix_activations(proto: onnx.ModelProto, measured: set[str]) -> list[str]:
    """The measured values the main graph's matrix ops read, in graph order, once each."""
    stored = {init.name for init in proto.graph.initializer}
    found: dict[str, None] = {}
    for node in proto.graph.node:
        if node.op_type in matrix_ops("onnx") and node.domain in ("", "ai.onnx"):
            for name in node.input[:2]:
                if name in measured and name not in stored:
                    found[name] = None
    return list(found)


def functions_inlined(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with every call of a model-local function replaced by its body, the body's
    values and nodes named by their OpGraph paths (``<call>/<function>/<name>``), as
    ``--inline-functions`` writes them: their ranges then meet the nodes that read them."""
    from graphamp.onnx.dialect import reader, writer
    from graphamp.onnx.io import files
    from graphamp.plans.edits import EditScript

    model = files.read_proto(proto)
    model.inline_functions = True
    inlined = writer.apply(reader.read(model, "float32"), EditScript())
    assert isinstance(inlined, onnx.ModelProto)  # a proto in memory stays one
    return inlined


def _range(values: dict[str, np.ndarray], tensor: str) -> TensorRange:
    smallest = float(values[stat_name(tensor, "min_abs")])
    return TensorRange(
        max_abs=float(values[stat_name(tensor, "max_abs")]),
        min_abs=smallest if np.isfinite(smallest) else None,
        nonfinite=int(values[stat_name(tensor, "nonfinite")]),
    )


def _label(model: object) -> str:
    return str(model) if not isinstance(model, onnx.ModelProto) else (model.graph.name or "")
