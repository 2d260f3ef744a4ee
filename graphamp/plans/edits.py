"""EditScript: the exact slot-level changes a dialect applies to its model.

The casts pass (and the training passes) derive it from the graph and the decisions; it refers
to the same cast and weight records the plan holds, and adds what only a dialect needs: which
tensors change type, which input slots read another tensor, which nodes and graph inputs a
pass added. It is never written to a file: a reviewed plan is applied by deriving the script
again (see :mod:`graphamp.plans.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphamp.plans.records import CastRecord, RewriteRecord, ScaleRecord, WeightRecord


@dataclass
class Fp8Edits:
    """The float8 part of a conversion: the low type and the plan's scale records (a dialect
    quantises each record's value for its consumers)."""

    dtype: str
    scales: list[ScaleRecord] = field(default_factory=list)


@dataclass
class EditScript:
    """Changes in the order a dialect applies them: rewrites (fused ops in place of the
    model's patterns, first: later edits may name the fused node), weights, retypes, casts,
    rewiring,
    retargeted and removed Casts, added nodes, graph inputs and outputs, output casts."""

    rewrites: list[RewriteRecord] = field(default_factory=list)
    retype: dict[str, str] = field(default_factory=dict)  # tensor -> new dtype
    # (node, input slot) -> tensor it reads instead (a cast output, a weight copy, a source)
    rewire: dict[tuple[str, int], str] = field(default_factory=dict)
    casts: list[CastRecord] = field(default_factory=list)
    output_casts: list[CastRecord] = field(default_factory=list)  # keep_io_types outputs
    # an output Cast's node name where it cannot be its output's (a node has that name)
    cast_nodes: dict[str, str] = field(default_factory=dict)
    weights: list[WeightRecord] = field(default_factory=list)
    retarget_casts: dict[str, str] = field(default_factory=dict)  # Cast node -> new target
    remove_nodes: list[str] = field(default_factory=list)  # pre-existing Casts made redundant
    # Casts of the model moved right after the producer of their input (after rewiring), so
    # that earlier readers can share them: one Cast per (tensor, dtype).
    hoist_casts: list[str] = field(default_factory=list)
    # Nodes the conversion runs in low precision, and in which type: a dialect sets what such
    # an op needs there (ONNX Attention's softmax_precision, say).
    low_nodes: dict[str, str] = field(default_factory=dict)
    # Nodes a pass added to the OpGraph (training steps), in graph order; each dialect knows
    # how to build every NodeKind a pass can add.
    new_nodes: list[str] = field(default_factory=list)
    # Nodes of the model a pass replaced by one it added (every reader rewired): removed.
    erase_nodes: list[str] = field(default_factory=list)
    # Graph inputs a pass added (state such as the loss scale): tensor -> initial value, every
    # element of the tensor's shape (a scalar when it has none).
    new_inputs: dict[str, float] = field(default_factory=dict)
    removed_inputs: list[str] = field(default_factory=list)  # graph inputs nothing reads now
    new_outputs: list[str] = field(default_factory=list)  # graph outputs a pass added
    replace_outputs: dict[str, str] = field(default_factory=dict)  # output -> value it returns
    fp8: Fp8Edits | None = None  # float8 quantisers and weights (the fp8 pass's records)

    @property
    def empty(self) -> bool:
        """Whether applying it changes nothing."""
        return not any(getattr(self, name) for name in self.__dataclass_fields__)
