"""fp8: which matrix ops decided low compute on float8 operands, and where their scales come from.

Float8 is an overlay on the low type (``Options.fp8``, a :class:`graphamp.Float8`): it runs
after the decide step and before ``casts``, and changes no node's own decision. For every matrix
op (a node whose dialect recorded its :class:`~graphamp.core.graph.MatrixDims`, or whose op is
one of the dialect's matrix ops) decided in the low type, it records one
:class:`~graphamp.plans.records.Fp8Decision`, the first rule that holds:

1. ``fp8_deny`` (policy): its name or module matches the settings' ``deny_names``; it is the
   last matrix op of the graph (the LM head or output layer, with ``keep_last``); or it is a
   MoE router (its output reaches a TopK through ops that keep the order of values).
2. ``fp8_operands``: both operands are activations (attention's products, Q x K^T and P x V):
   float8 kernels and every recipe quantise a stored or trained weight against an activation;
   or, under static scaling in a dialect that stores the weight a product reads itself
   (``Dialect.float8_weights == "stored"``: ONNX), the weight is computed from stored values
   at run time (a Transpose the exporter did not fold).
3. ``fp8_shape``: K or N unknown or not a multiple of 16 (what CUDA's float8 GEMMs need), or
   under the size table (``sizes = "torchao"``: torchao's auto-filter, K <= 4096 and N <= 1024
   tensorwise; N <= 2048, K <= 1024, or N <= 4096 and K <= 2048 rowwise), where float8's
   quantisation costs more than its faster product gains.
4. ``fp8_range`` (calibration): a static recipe has no calibrated range of the activation, or
   it was zero or not finite; or its binade histogram shows more than ``max_underflow`` of its
   non-zero values below half of float8's smallest subnormal at its scale (amax * 2**margin /
   448), where they would flush to zero.
5. ``fp8_tuned``: ``graphamp tune --fp8`` found the model misses its tolerance with it in
   float8 (``Options.fp8_tuned``: the node and the error the search measured).
6. ``fp8`` (chosen): both operands quantised to E4M3, the output in the low type.

With ``embeddings`` (a static recipe's opt-in), every Gather decided low whose data is a stored
table, and every Add decided low that adds a stored 2-D table to such a lookup (a position table
the exporter folded into a constant), gets a decision too: ``fp8_table`` (chosen: the table
stored int8 with one scale per row, read as ``weight``, granularity ``row``), or the low type
with ``fp8_deny`` (a deny name; another op reads the table as it is, so the low copy would stay
beside the 8-bit one) or ``fp8_shape`` (not a 2-D table indexed on axis 0, where one scale per
row is one per gathered row). Matrix-op counts and ``--from-plan``'s coverage check count these
decisions apart.

With ``kept_int8`` (a static recipe's opt-in), a product kept by ``fp8_shape``, ``fp8_range``,
``fp8_tuned`` or as the last matrix op keeps its rule, and its weight (its B operand, a stored
value itself that only such kept products read, as their B) gets a record of format ``int8`` per
output channel: stored int8, dequantised to the low type before the product (weight-only). Its
reason says so. Deny names and routers keep their weights as they are: the user or the router's
order asked for the low type.

Each chosen node's operands get a :class:`~graphamp.plans.records.ScaleRecord` (one per value,
shared by every float8 op reading it): an activation's source is the recipe's (calibration,
current, delayed), a stored weight's is ``weight`` per output channel under a static recipe.
Every chosen product is checked against what CUDA accepts (:mod:`graphamp.passes.fp8_gemm`);
one it would refuse is an internal error, since the rules above should have kept it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math

from graphamp.core.graph import MatrixDims, NodeKind, OpNode
from graphamp.core.vocab import Precision, Rule
from graphamp.dialects.registry import float8_weights_for, matrix_ops_for
from graphamp.errors import GraphampError, InternalError
from graphamp.numerics.ranges import Ranges, underflow_share
from graphamp.passes.base import Fact, Pass, PassResult
from graphamp.passes.context import PassContext
from graphamp.passes.fp8_gemm import ScaledGemm, problems
from graphamp.plans.plan import Plan
from graphamp.plans.records import Fp8Decision, ScaleRecord
from graphamp.training.float8 import Float8

# Half of float8_e4m3fn's smallest subnormal (2**-9): a quantised value below it rounds to 0.
E4M3_FLUSH = 2.0**-10
# What a chosen decision's rule stores, as an error names it.
_CHOSEN = {Rule.FP8: "float8", Rule.FP8_TABLE: "an 8-bit table"}
# Ops between a router's product and its TopK that keep the order of values.
_ORDER_KEEPING = frozenset(
    {"softmax", "sigmoid", "cast", "reshape", "view", "_to_copy", "to", "add"}
)


class Fp8Pass(Pass):
    """Decide float8 operands for matrix ops already decided low (module docstring)."""

    name = "fp8"
    requires = frozenset({Fact.DECIDED})
    gives = frozenset({Fact.FP8_DECIDED})

    def applies(self, context: PassContext) -> bool:
        return context.options.fp8 is not None

    def run(self, context: PassContext) -> PassResult:
        settings = context.options.fp8
        assert settings is not None  # applies() checked it
        reviewed = context.options.reviewed
        if reviewed is not None and reviewed.fp8_settings is not None:
            return _apply_reviewed(context, settings, reviewed)
        decider = _Decider(context, settings, context.options.ranges)
        chosen = 0
        for node in decider.matrix_nodes:
            decision = decider.decide(node)
            context.fp8_decisions[node.name] = decision
            if decision.rule is Rule.FP8:
                decider.record_scales(node)
                chosen += 1
        int8_weights = 0
        if settings.kept_int8:
            int8_weights = decider.record_kept_weights(context.fp8_decisions)
        tables = 0
        for node in decider.table_nodes:
            decision = decider.decide_table(node)
            context.fp8_decisions[node.name] = decision
            if decision.rule is Rule.FP8_TABLE:
                decider.record_table(node)
                tables += 1
        context.scales = sorted(decider.scales.values(), key=lambda r: (r.tensor, r.format))
        considered = len(decider.matrix_nodes)
        note = f"{chosen} of {considered} matrix ops float8"
        if settings.embeddings:
            note += f", {tables} of {len(decider.table_nodes)} embedding lookups 8-bit"
        if settings.kept_int8:
            note += f", {int8_weights} kept products' weights int8"
        return PassResult(modified=False, note=note)


def _apply_reviewed(context: PassContext, settings: Float8, plan: Plan) -> PassResult:
    """A reviewed float8 plan's decisions and scales, its calibrated amax included (``convert
    --from-plan``: no data is given). It must decide exactly the matrix ops decided low, and
    each node it chose must still pass every rule but the calibration one; else the model
    moved since the review, and it is refused naming the node."""
    where = context.options.reviewed_where or plan.model or "the plan"
    decider = _Decider(context, settings, None, structural=True)
    names = {node.name for node in (*decider.matrix_nodes, *decider.table_nodes)}
    if names != set(plan.fp8):
        name = sorted(names ^ set(plan.fp8))[0]
        side = "the model decides it low" if name in names else "the model does not decide it low"
        raise GraphampError(
            f"{where}: the plan's float8 decisions do not cover the model's matrix ops: "
            f"{name!r} ({side})"
        )
    tables = {node.name for node in decider.table_nodes}
    for node in (*decider.matrix_nodes, *decider.table_nodes):
        reviewed = plan.fp8[node.name]
        if reviewed.rule in _CHOSEN:
            now = decider.decide_table(node) if node.name in tables else decider.decide(node)
            if now.rule is not reviewed.rule:
                raise GraphampError(
                    f"{where}: the plan puts {node.name!r} in {_CHOSEN[reviewed.rule]}, but the "
                    f"model now keeps it (rule {now.rule}: {now.reason})"
                )
        context.fp8_decisions[node.name] = dataclasses.replace(reviewed)
    context.scales = [dataclasses.replace(record) for record in plan.scales]
    return PassResult(modified=False, note="float8 decisions from the reviewed plan")


class _Decider:
    """The rules of one graph under one :class:`Float8` (module docstring); ``structural``
    leaves out the calibration rule (a reviewed plan's nodes, checked without data)."""

    def __init__(
        self,
        context: PassContext,
        settings: Float8,
        ranges: Ranges | None,
        *,
        structural: bool = False,
    ) -> None:
        self.structural = structural
        self.tuned = context.options.fp8_tuned
        self.graph, self.settings, self.ranges = context.graph, settings, ranges
        self.low = context.policy.dtype
        matrix_ops = matrix_ops_for(context.policy.dialect)
        # whether a static weight must be the stored value the product reads (ONNX), or the
        # dialect finds the parameter behind casts and transposes (FX)
        self.stores_weights_read = float8_weights_for(context.policy.dialect) == "stored"
        every = [
            node
            for node in context.graph
            if node.kind is NodeKind.OP and (node.matrix is not None or node.op in matrix_ops)
        ]
        main = [node for node in every if not node.body]
        self.last = main[-1].name if settings.keep_last and main else None
        self.matrix_nodes = [
            node
            for node in every
            if (decision := context.decisions.get(node.name)) is not None
            and decision.precision == self.low
        ]
        self.table_nodes = self._table_nodes(context) if settings.embeddings else []
        if settings.kept_int8 and not self.stores_weights_read:
            raise GraphampError(
                "Float8(kept_int8=True) stores kept products' weights at conversion: ONNX "
                "models with the static recipe only (graphamp convert --fp8 --fp8-kept-int8)"
            )
        self.scales: dict[str, ScaleRecord] = {}
        self._stored: dict[str, bool] = {}

    def _table_nodes(self, context: PassContext) -> list[OpNode]:
        """The Gathers decided low whose data (slot 0) is a stored table, with
        ``embeddings``: only a dialect that stores the values a node reads writes them."""
        if self.settings.recipe != "static" or not self.stores_weights_read:
            raise GraphampError(
                "Float8(embeddings=True) stores embedding tables at conversion: ONNX models "
                "with the static recipe only (graphamp convert --fp8 --fp8-embeddings)"
            )
        found = []
        for node in self.graph:
            if node.kind is not NodeKind.OP or node.op not in ("Gather", "Add") or node.domain:
                continue
            decision = context.decisions.get(node.name)
            if decision is None or decision.precision != self.low or not node.inputs:
                continue
            lookup = node.op == "Gather" and self._is_table(node.inputs[0])
            if lookup or (node.op == "Add" and self._table_slot(node) is not None):
                found.append(node)
        return found

    def _table_slot(self, node: OpNode) -> int | None:
        """The input slot of the table ``node`` reads: a Gather's data (slot 0); an Add's
        stored 2-D operand where the other operand is an embedding lookup (a position table
        the exporter folded into a constant); None for any other node."""
        if node.op == "Gather":
            return 0
        if node.op != "Add" or len(node.inputs) != 2:
            return None
        for slot, other in ((0, 1), (1, 0)):
            value = node.inputs[slot]
            shape = self.graph.tensors[value].shape if value in self.graph.tensors else None
            if (
                self._is_table(value)
                and shape is not None
                and len(shape) == 2
                and self._from_lookup(node.inputs[other])
            ):
                return slot
        return None

    def _is_table(self, value: str) -> bool:
        """Whether ``value`` is a stored value (loaded with the model, made by no node)."""
        info = self.graph.tensors.get(value)
        return info is not None and info.is_constant and info.producer is None

    def _from_lookup(self, value: str, depth: int = 4) -> bool:
        """Whether ``value`` is an embedding lookup (a Gather of a stored table) or a sum of
        one with other values (BERT's word + token type + position embeddings)."""
        producer = self.graph.tensors[value].producer if value in self.graph.tensors else None
        if producer is None or depth == 0:
            return False
        node = self.graph.nodes[producer]
        if node.op == "Gather" and not node.domain:
            return bool(node.inputs) and self._is_table(node.inputs[0])
        return node.op == "Add" and any(self._from_lookup(v, depth - 1) for v in node.inputs)

    # -- the rules ---------------------------------------------------------------------------

    def decide(self, node: OpNode) -> Fp8Decision:
        dims = node.matrix
        operands = _operands(node, dims)
        low = Precision(self.low)

        def kept(rule: Rule, reason: str) -> Fp8Decision:
            return Fp8Decision(low, rule, f"{reason}: kept {self.low}", operands)

        pattern = self._denied_name(node)
        if pattern is not None:
            return kept(Rule.FP8_DENY, f"its name matches the float8 deny rule {pattern!r}")
        if node.name == self.last:
            return kept(
                Rule.FP8_DENY, "the last matrix op of the graph (the LM head or output layer)"
            )
        topk = self._router_of(node)
        if topk is not None:
            return kept(Rule.FP8_DENY, f"a MoE router: its output picks experts in {topk!r}")
        if node.body:  # as for a lookup: the scales and quantisers are written in the main graph
            return kept(
                Rule.FP8_SHAPE,
                f"it lies inside the body {node.body!r} (a branch or loop body: float8 operands"
                " are written in the main graph only)",
            )
        if dims is None and "attention" in node.op.lower():
            return kept(
                Rule.FP8_OPERANDS,
                f"an attention op ({node.op}): its products' operands are activations (float8"
                " attention is a fused kernel, not a cast plan)",
            )
        if dims is None or len(operands) < 2:
            return kept(Rule.FP8_SHAPE, "its matrix dimensions are unknown")
        if not any(self._is_stored(value) for value in operands):
            return kept(
                Rule.FP8_OPERANDS,
                f"both operands ({operands[0]!r}, {operands[1]!r}) are activations "
                "(an attention product)",
            )
        computed = self._computed_weight(operands)
        if computed:
            return kept(Rule.FP8_OPERANDS, computed)
        shape = self._shape_problem(dims)
        if shape:
            return kept(Rule.FP8_SHAPE, shape)
        for value in operands:
            if not self._is_stored(value):
                problem = self._range_problem(value)
                if problem:
                    return kept(Rule.FP8_RANGE, problem)
        tuned = self.tuned.get(node.name)
        if tuned:
            return Fp8Decision(low, Rule.FP8_TUNED, tuned, operands)
        self._validate(node, dims)
        return Fp8Decision(
            Precision.FLOAT8_E4M3FN,
            Rule.FP8,
            f"K = {dims.k}, N = {dims.n}: both operands e4m3fn ({self.settings.describe()}), "
            f"output {self.low}",
            operands,
        )

    def decide_table(self, node: OpNode) -> Fp8Decision:
        """An embedding lookup's table, or a position table an Add adds to a lookup: stored
        int8 per row, or why it keeps the low type."""
        slot = self._table_slot(node)
        assert slot is not None  # _table_nodes found it
        table = node.inputs[slot]
        low = Precision(self.low)

        def kept(rule: Rule, reason: str) -> Fp8Decision:
            return Fp8Decision(low, rule, f"{reason}: its table kept {self.low}", [table])

        problem = self._lookup_problem(node)
        if problem is not None:
            return kept(*problem)
        for reader, read_slot in self.graph.consumers(table):
            if reader == node.name:
                continue
            other = self.graph.nodes[reader]
            if (
                reader not in self._table_names
                or read_slot != self._table_slot(other)
                or self._lookup_problem(other)
            ):
                return kept(
                    Rule.FP8_DENY,
                    f"{reader!r} reads {table!r} as it is too: its low copy would stay beside "
                    "an 8-bit one",
                )
        shape = self.graph.tensors[table].shape
        assert shape is not None  # _lookup_problem checked it
        if node.op == "Add":
            return Fp8Decision(
                low,
                Rule.FP8_TABLE,
                f"a position table {shape[0]} x {shape[1]} added to an embedding lookup: "
                "stored int8 with one scale per row (max |row| / 127, at conversion), "
                f"dequantised to {self.low} before the Add (Float8 embeddings, "
                "--fp8-embeddings)",
                [table],
            )
        return Fp8Decision(
            low,
            Rule.FP8_TABLE,
            f"an embedding table {shape[0]} x {shape[1]}: stored int8 with one scale per row "
            f"(max |row| / 127, at conversion); the gathered rows and their scales are "
            f"multiplied back to {self.low} (Float8 embeddings, --fp8-embeddings)",
            [table],
        )

    def _lookup_problem(self, node: OpNode) -> tuple[Rule, str] | None:
        """Why this lookup (or position Add) itself cannot read an 8-bit table (its name,
        its shape, its place), None when it can."""
        slot = self._table_slot(node)
        if slot is None:
            return Rule.FP8_SHAPE, "it reads no table"
        table = node.inputs[slot]
        pattern = self._denied_name(node)
        if pattern is not None:
            return Rule.FP8_DENY, f"its name matches the float8 deny rule {pattern!r}"
        if node.body:
            return Rule.FP8_SHAPE, f"it lies inside the body {node.body!r}"
        shape = self.graph.tensors[table].shape
        if node.op == "Add":
            return None  # _table_slot checked the table is 2-D
        axis = node.params.get("axis", 0)
        if shape is None or len(shape) != 2 or not isinstance(axis, int) or axis % 2:
            return (
                Rule.FP8_SHAPE,
                f"it indexes axis {axis} of {table!r} (shape {shape}): one scale per row needs "
                "a 2-D table gathered on axis 0, so that each gathered row has its one scale",
            )
        return None

    @functools.cached_property
    def _table_names(self) -> set[str]:
        return {node.name for node in self.table_nodes}

    def _denied_name(self, node: OpNode) -> str | None:
        for pattern in self.settings.deny_names:
            for name in (node.name, node.scope):
                if name and fnmatch.fnmatchcase(name, pattern):
                    return pattern
        return None

    def _router_of(self, node: OpNode) -> str | None:
        """The TopK this node's output reaches through order-keeping ops, if any."""
        pending, seen = list(node.outputs), set()
        while pending:
            value = pending.pop()
            if not value or value in seen:
                continue
            seen.add(value)
            for reader, _ in self.graph.consumers(value):
                op = self.graph.nodes[reader].op.lower()
                if op == "topk":
                    return reader
                if op in _ORDER_KEEPING:
                    pending.extend(self.graph.nodes[reader].outputs)
        return None

    def _is_stored(self, value: str) -> bool:
        """Whether ``value`` is a stored value or computed from stored values only (a
        transposed or reshaped weight): what a weight operand is."""
        known = self._stored.get(value)
        if known is not None:
            return known
        info = self.graph.tensors.get(value)
        result = False
        if info is not None and not info.is_graph_input:
            # a stored value: loaded with the model, or (a PyTorch parameter cast at run
            # time from its master) made by no node and given by no caller
            if info.is_constant or info.producer is None:
                result = True
            elif info.producer is not None:
                producer = self.graph.nodes[info.producer]
                given = [name for name in producer.inputs if name]
                result = producer.kind is NodeKind.CONSTANT or (
                    bool(given) and all(self._is_stored(name) for name in given)
                )
        self._stored[value] = result
        return result

    def _computed_weight(self, operands: list[str]) -> str:
        """Under static scaling in a dialect that quantises the stored value a product reads
        (ONNX), why a weight operand computed from stored values (a Transpose or Reshape of
        a weight the exporter did not fold) cannot be stored in float8: it is made by a node
        at run time; "" when each weight operand is stored itself."""
        if self.settings.recipe != "static" or not self.stores_weights_read:
            return ""
        for value in operands:
            info = self.graph.tensors.get(value)
            if info is None or info.is_constant or info.producer is None:
                continue
            producer = self.graph.nodes[info.producer]
            if producer.kind is not NodeKind.CONSTANT and self._is_stored(value):
                return (
                    f"its weight {value!r} is computed from stored values (by {producer.op} "
                    f"node {producer.name!r}), not stored: static scaling stores a weight in "
                    "float8 at conversion; fold the computation into the weight (constant "
                    "folding, e.g. the exporter's) to put it in float8"
                )
        return ""

    def _shape_problem(self, dims: MatrixDims) -> str:
        k, n = dims.k, dims.n
        if k is None or n is None:
            return f"K = {k}, N = {n}: a dimension is unknown (float8 needs multiples of 16)"
        if k % 16 or n % 16:
            return f"K = {k}, N = {n}: not both multiples of 16 (what float8 GEMMs need)"
        if self.settings.sizes == "torchao":
            if self.settings.granularity == "row":
                small = n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)
                table = "N <= 2048, K <= 1024, or N <= 4096 and K <= 2048 (rowwise)"
            else:
                small = k <= 4096 and n <= 1024
                table = "K <= 4096 and N <= 1024 (tensorwise)"
            if small:
                return (
                    f"K = {k}, N = {n}: under torchao's size table, {table}, where float8 "
                    "does not pay"
                )
        return ""

    def _range_problem(self, value: str) -> str:
        if self.structural:
            return ""
        ranges, static = self.ranges, self.settings.recipe == "static"
        found = ranges.tensors.get(value) if ranges is not None else None
        if found is None:
            return f"no calibrated range of {value!r} for its static scale" if static else ""
        if found.nonfinite:
            return f"{value!r} held {found.nonfinite} inf/NaN values on the calibration data"
        if found.max_abs <= 0 or not math.isfinite(found.max_abs):
            return f"{value!r} was 0 on every calibration batch: no scale fits it"
        threshold = self.settings.scale_of(found.max_abs) * E4M3_FLUSH
        share = underflow_share(found, threshold)
        if share is not None and share > self.settings.max_underflow:
            return (
                f"{share:.1%} of {value!r}'s non-zero values lie below {threshold:.3g}, where "
                f"they flush to zero at its scale ({self.settings.scale_of(found.max_abs):.3g}); "
                "at most "
                f"{self.settings.max_underflow:.1%} may"
            )
        return ""

    def _validate(self, node: OpNode, dims: MatrixDims) -> None:
        """The product the dialect will emit, checked against CUDA's rules (per-channel
        weight scales of a static recipe are a dequantised weight, not a scaled GEMM's)."""
        granularity = self.settings.granularity
        gemm = ScaledGemm(
            "e4m3fn", "e4m3fn", dims.m, dims.k, dims.n, out_dtype=self.low,
            a_granularity=granularity, b_granularity=granularity,
        )  # fmt: skip
        found = problems(gemm)
        if found:
            raise InternalError(f"fp8 pass chose {node.name!r}, which CUDA refuses: {found[0]}")

    # -- scale records -----------------------------------------------------------------------

    def record_scales(self, node: OpNode) -> None:
        settings = self.settings
        for value in _operands(node, node.matrix):
            detail: dict[str, object]
            if self._is_stored(value) and settings.recipe == "static":
                granularity, source, detail = "channel", "weight", {"axis": _n_axis(node)}
            else:
                granularity, source = settings.granularity, settings.source()
                detail = dict(settings.source_detail())
                if source == "calibration" and self.ranges is not None:
                    detail.update(
                        amax=self.ranges.tensors[value].max_abs, batches=self.ranges.batches
                    )
            record = self.scales.get(value)
            if record is None:
                state = [f"{value}/amax_history", f"{value}/scale"] if source == "delayed" else []
                record = ScaleRecord(value, "e4m3fn", granularity, source, detail, [], state)
                self.scales[value] = record
            record.consumers.append(node.name)

    def record_kept_weights(self, decisions: dict[str, Fp8Decision]) -> int:
        """With ``kept_int8``: each weight read only as the B operand of products kept out of
        float8 by their shape, range, tuning or place (last), stored int8 per output channel,
        its readers' reasons saying so (module docstring); returns how many weights."""
        eligible = {
            node.name: node
            for node in self.matrix_nodes
            if (decision := decisions.get(node.name)) is not None
            and (
                decision.rule in (Rule.FP8_SHAPE, Rule.FP8_RANGE, Rule.FP8_TUNED)
                or (decision.rule is Rule.FP8_DENY and node.name == self.last)
            )
        }
        readers: dict[str, list[OpNode]] = {}
        for node in eligible.values():
            weight = _kept_weight(node)
            if weight is not None:
                readers.setdefault(weight, []).append(node)
        stored = 0
        for weight, nodes in readers.items():
            info = self.graph.tensors.get(weight)
            if info is None or not info.is_constant or info.producer is not None:
                continue  # computed at run time (a Transpose of a weight): nothing stored
            consumers = self.graph.consumers(weight)
            if len(consumers) != len(nodes) or any(
                reader not in eligible or _kept_weight(eligible[reader]) != weight
                for reader, _ in consumers
            ):
                continue  # another op reads it as it is: its low copy would stay
            if info.shape is None or len(info.shape) < 2:
                continue  # no output-channel axis to scale along
            axes = {_n_axis(node) % len(info.shape) for node in nodes}
            if len(axes) != 1:
                continue  # its readers disagree on its output-channel axis
            self.scales[weight] = ScaleRecord(
                weight, "int8", "channel", "weight", {"axis": axes.pop()},
                [node.name for node in nodes], [],
            )  # fmt: skip
            for node in nodes:
                decision = decisions[node.name]
                decision.reason += (
                    f"; its weight {weight!r} stored int8 with one scale per output channel "
                    f"(max |w| / 127, at conversion), dequantised to {self.low} before the "
                    "product (Float8 kept_int8, --fp8-kept-int8)"
                )
            stored += 1
        return stored

    def record_table(self, node: OpNode) -> None:
        """The table's record: int8, one scale per row (axis 0), from the weight at
        conversion; one record per table, shared by every Gather (or Add) reading it."""
        slot = self._table_slot(node)
        assert slot is not None  # _table_nodes found it
        table = node.inputs[slot]
        record = self.scales.get(table)
        if record is None:
            record = ScaleRecord(table, "int8", "row", "weight", {"axis": 0}, [], [])
            self.scales[table] = record
        record.consumers.append(node.name)


def _operands(node: OpNode, dims: MatrixDims | None) -> list[str]:
    """The values of the product's A and B slots (the first two inputs without dims)."""
    slots = (dims.a, dims.b) if dims is not None else (0, 1)
    return [node.inputs[s] for s in slots if s < len(node.inputs) and node.inputs[s]]


def _kept_weight(node: OpNode) -> str | None:
    """The value in a product's B slot (the weight an int8 copy would replace), None without
    known dimensions."""
    dims = node.matrix
    if dims is None or dims.b >= len(node.inputs) or not node.inputs[dims.b]:
        return None
    return node.inputs[dims.b]


def _n_axis(node: OpNode) -> int:
    """The axis of B that runs over N (its output channels), as the dialect recorded it."""
    return node.matrix.n_axis if node.matrix is not None else -1
