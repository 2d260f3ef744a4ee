"""A whole training step as one static mixed-precision graph, loss scaling inside it.

The forward pass is converted by the engine (float32 master weights, cast once per step);
backward follows the casts through autograd. The step (forward, loss, backward, optimizer
update) is traced once with ``make_fx`` into a GraphModule with its values marked
(:mod:`graphamp.fx.training.marks`), read into the neutral graph, and the ``step`` pipeline of
passes (:mod:`graphamp.passes.loss_scale`) adds loss scaling, unscaling, the finite check, the step
guard and the scale update as nodes the plan records. State lives in tensors, so a step never
waits for the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import fx, nn

from graphamp.errors import GraphampError
from graphamp.fx.conversion import converted_for_step, fx_policy
from graphamp.fx.dialect import reader, writer
from graphamp.fx.dialect.float8_step import check_lowered, read_marks, step_scales
from graphamp.fx.dialect.ops import known_shape
from graphamp.fx.dialect.types import torch_dtype
from graphamp.fx.distributed import data_parallel
from graphamp.fx.distributed.fsdp import local
from graphamp.fx.training import differentiate, eager, marks, optim, signatures
from graphamp.fx.training.signatures import CapturedStep, StepGraphs
from graphamp.passes import PassContext, PassManager
from graphamp.passes.options import Options
from graphamp.passes.pipeline import STEP
from graphamp.plans import report
from graphamp.plans.plan import Plan
from graphamp.policy.policy import Policy
from graphamp.training.distributed import GradientClipping, GradientReduce
from graphamp.training.scaling import LossScaling


class TrainStep:
    """``step(*batch) -> loss``: ``batch[:-1]`` feeds the model, ``loss_fn(output, batch[-1])``
    gives the loss. Owns the optimizer state and loss-scaling state (tensors); the parameters
    and buffers it trains are the model's own (its float32 masters), updated in place, or with
    ``keep_model`` copies of its own that reach the model only through :meth:`copy_to`."""

    write_back = True  # a compiled graph writes new state into the old: eager.write_back
    float8_weights = "master"  # what a float8 layer quantises: the float32 master weight

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        optimizer: torch.optim.Optimizer,
        policy: Policy | None,
        loss_scaling: LossScaling | None,
        accumulate: int,
        overrides: dict[str, Any],
        reduce: GradientReduce | None = None,
        clipping: GradientClipping | None = None,
        fp8: Any = None,
        keep_model: bool = False,
        recompute_casts: bool | None = None,
    ) -> None:
        if accumulate < 1:
            raise GraphampError(f"accumulate must be at least 1, got {accumulate}")
        self.model, self.loss_fn, self.accumulate = model, loss_fn, accumulate
        self.optimizer, self.kind = optimizer, type(optimizer).__name__
        self.groups = optim.optimizer_groups(optimizer, model)
        self.policy, self.overrides = policy, overrides
        self.loss_scaling = loss_scaling
        self.reduce, self.clipping, self.fp8 = reduce, clipping, fp8
        self.keep_model = keep_model
        self.recompute_casts = recompute_casts  # eager.for_eager: memory for time
        # The model's own tensors that hold the trained parameters (none with keep_model):
        # where an update makes a new tensor, __call__ copies it into them.
        self._model_params: dict[str, torch.Tensor] = {}
        self.plan: Plan | None = None  # the first batch signature's
        # The batch signature's graphs in use, and every signature's (fx/signatures.py).
        self.graph: Callable[..., Any] | None = None
        self.accumulate_graph: Callable[..., Any] | None = None
        self.captured: dict[str, CapturedStep] = {}
        self._graphs: dict[signatures.BatchSignature, StepGraphs] = {}
        self._signature: signatures.BatchSignature | None = None
        self._compile_options: dict[str, Any] | None = None
        self.state: dict[str, torch.Tensor] = {}  # what the passes added: scale, skip count
        self._micro = 0
        self._rates: list[float] = []
        self._rate_tensors: list[torch.Tensor] = []

    # building -------------------------------------------------------------------------------

    def _build(self, batch: Sequence[torch.Tensor]) -> None:
        overrides = dict(self.overrides)
        self._policy = fx_policy(self._source(), self.policy, None, overrides, "train_step()")
        self.forward, forward_plan = self._converted(batch)
        self.params = self._own_params()
        # Buffers (batch-norm running statistics) are updated by the forward pass as in eager
        # PyTorch, on skipped steps too; in place, in the model's own unless keep_model.
        self.buffers = self._model_tensors(
            self.forward.named_buffers(), dict(self.model.named_buffers())
        )
        # Trainable: in an optimizer group, requiring grad and reached by the loss's gradient.
        # The others (frozen) are read by the forward pass but get no gradient and no update.
        # The candidates: every parameter the optimizer would step; each batch signature is
        # probed for the ones its loss reaches, which must be the first signature's.
        self._candidates = [name for group in self.groups for name in group.names]
        if not self._candidates:
            raise GraphampError("the optimizer holds no parameter that requires grad")
        missing = [name for name in self._candidates if name not in self.params]
        if missing:
            raise GraphampError(f"parameter {missing[0]!r} is not in the captured module")
        self.groups = optim.without(self.groups, self._without_gradient(batch))
        self.trainable = [name for group in self.groups for name in group.names]
        if not self.trainable:
            raise GraphampError(
                "the loss has no gradient path to any parameter the optimizer holds (each is "
                "read through a detach or a comparison, or not at all)"
            )
        initial = optim.initial_state(self.kind, self.groups, self.params)
        resumed = optim.resume_state(
            self.kind, self.groups, initial, self.optimizer, self.model, not self.keep_model
        )
        self.opt_state = {k: local(v) for k, v in resumed.items()}  # a shard's own part
        # All state lives where the parameters do, so no step copies between host and device.
        self.device = next(iter(self.params.values())).device
        self.opt_state = {k: v.to(self.device) for k, v in self.opt_state.items()}
        if self.reduce is not None:  # replicas start from the first rank's state
            state = [*self.params.values(), *self.opt_state.values(), *self.buffers.values()]
            data_parallel.broadcast_from_first(self.reduce, state)
        # Gradients are carried between calls only when micro-batches accumulate, in float32
        # whatever the parameters' type (the optimizer reads their average in that type).
        carried = self.trainable if self.accumulate > 1 else []
        self.grad_acc = {n: torch.zeros_like(self.params[n], dtype=torch.float32) for n in carried}

        self._use(signatures.batch_signature(batch), self._capture_graphs(batch))
        decisions = {k: v for step in self.captured.values() for k, v in step.decisions.items()}
        scales = step_scales(forward_plan, self.captured["update"].scales)
        nodes = {**forward_plan.nodes, **decisions}
        self.plan = dataclasses.replace(forward_plan, nodes=nodes, scales=scales)

    def _without_gradient(self, batch: Sequence[torch.Tensor]) -> frozenset[str]:
        """The optimizer's parameters the loss has no gradient path from (read through a
        ``detach`` or a comparison only, or not at all: an unused pooler, a frozen backbone
        left in the optimizer). torch.optim skips a parameter whose ``.grad`` is None, so
        these get no update, no weight decay and no state, here as there. Found for each
        batch signature, by tracing autograd: nothing is computed."""
        tensors, traced_batch, faked = self._probe_arguments(batch)
        return differentiate.unreached(
            self.forward,
            self._loss,
            tensors,
            self._candidates,
            traced_batch,
            faked=faked,
            outside=self._outside(),
        )

    def _probe_arguments(
        self, batch: Sequence[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], list[Any], bool]:
        """What :meth:`_without_gradient` traces the loss on: the parameters and buffers, the
        batch, and whether they are fake tensors already (the trace fakes them otherwise)."""
        return {**self.params, **self.buffers}, list(batch), False

    def _outside(self) -> dict[int, str]:
        """The model's own parameters the optimizer steps, by ``id``: the loss must reach them
        through the forward pass, not read them itself (:func:`differentiate.unreached`)."""
        candidates = set(self._candidates)
        return {id(p): n for n, p in self.model.named_parameters() if n in candidates}

    def _check_reached(self, batch: Sequence[torch.Tensor]) -> None:
        """Refuse a batch signature whose loss reaches other parameters than the first
        signature's (a branch on a size): the step trains the first one's, and would leave a
        parameter this batch reaches untrained, or step one it does not reach with a zero
        gradient, where torch.optim steps exactly the parameters each batch reaches."""
        unreached = self._without_gradient(batch)
        reached = [name for name in self._candidates if name not in unreached]
        if reached == self.trainable:
            return
        gained = [name for name in reached if name not in self.trainable]
        lost = [name for name in self.trainable if name in unreached]
        parts = []
        if gained:
            parts.append(f"reaches {_names(gained)}, which the first batch's loss did not")
        if lost:
            parts.append(f"does not reach {_names(lost)}, which the first batch's loss did")
        raise GraphampError(
            f"the loss on this batch {' and '.join(parts)}; the step trains the parameters the "
            "first batch reached, where torch.optim steps those each batch reaches: pad "
            "batches to the first batch's shape, or build a train_step per kind of batch"
        )

    def _capture_graphs(self, batch: Sequence[torch.Tensor]) -> StepGraphs:
        """The step graphs for ``batch``'s signature, traced through ``self.forward``."""
        with torch.no_grad():
            captured = {"update": self._capture(self._update_fn, batch)}
            if self.accumulate > 1:
                captured["accumulate"] = self._capture(self._accumulate_fn, batch)
        accumulate = captured["accumulate"].module if "accumulate" in captured else None
        return StepGraphs(captured, captured["update"].module, accumulate)

    def _converted(self, batch: Sequence[torch.Tensor]) -> tuple[fx.GraphModule, Plan]:
        """The model converted on ``batch``'s inputs (float32 master weights): the forward
        module a capture traces through, and its plan."""
        batch_inputs = tuple(batch[:-1])  # captured per batch signature, float8 layers marked
        args = (self._source(), batch_inputs, self._policy, self.fp8, self.float8_weights)
        return converted_for_step(*args)

    def _source(self) -> nn.Module:
        """The module the forward pass is captured from."""
        return self.model

    def _own_params(self) -> dict[str, torch.Tensor]:
        """The parameters the step trains (the graphs update them in place): the model's own
        tensors, so no second copy of the float32 masters lives beside the model's, or with
        ``keep_model`` the step's own copies."""
        params = self._model_tensors(
            self.forward.named_parameters(), dict(self.model.named_parameters())
        )
        if not self.keep_model:
            self._model_params = dict(params)
        return params

    def _model_tensors(
        self, converted: Iterable[tuple[str, torch.Tensor]], model: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The converted forward's parameters or buffers as the step holds them: the model's
        tensor of the same name and layout itself, or a copy (with ``keep_model``, or where
        the model has no such tensor)."""
        held = {}
        for name, tensor in converted:
            own = model.get(name)
            if not self.keep_model and own is not None and optim.same_layout(own, tensor):
                held[name] = own.detach()
            else:
                held[name] = tensor.detach().clone()
        return held

    def _use(self, signature: signatures.BatchSignature, graphs: StepGraphs) -> None:
        """Make ``graphs`` (captured for ``signature``) the ones the step runs."""
        self._graphs[signature], self._signature = graphs, signature
        self.captured = graphs.captured
        self.graph, self.accumulate_graph = graphs.update, graphs.accumulate

    def _specialise(self, batch: Sequence[torch.Tensor]) -> bool:
        """Switch to the graphs for ``batch``'s signature, capturing them (from the step's
        current parameters and state) the first time it is seen; the first builds the step.
        Whether it captured them now."""
        signature = signatures.batch_signature(batch)
        if signature == self._signature:
            return False
        graphs = self._graphs.get(signature)
        captured = graphs is None
        if graphs is None:
            with signatures.capturing(signature, first=self.graph is None):
                if self.graph is None:
                    self._build(batch)
                    return True
                self.forward = self._converted(batch)[0]  # only captures read it
                self._check_reached(batch)
                graphs = self._capture_graphs(batch)
            if self._compile_options is not None:
                graphs = signatures.compiled(graphs, self._compile_options, self.write_back)
            signatures.warn_if_many(len(self._graphs) + 1, signature)
        self._use(signature, graphs)
        return captured

    @contextmanager
    def _first_run(self, previous: signatures.BatchSignature | None) -> Iterator[None]:
        """The first run of graphs just captured, which finishes their capture: the trace ran
        on fake tensors, whose kernels check shapes but not every type rule (a float64 batch
        into float32 weights), so an error here is the capture's, one line naming the batch,
        and the step goes back to the graphs of ``previous`` (None: unbuilt)."""
        signature = self._signature
        assert signature is not None  # the graphs just captured are the ones in use
        with signatures.capturing(signature, first=False):
            try:
                yield
            except Exception:
                self._micro -= 1
                del self._graphs[signature]
                if previous is None:
                    self.graph = self.accumulate_graph = None
                    self._signature = None
                else:
                    self._use(previous, self._graphs[previous])
                raise

    def _capture(self, fn: Callable[..., list[torch.Tensor]], batch: Sequence) -> CapturedStep:
        """Trace ``fn`` (the plain step), then let the step passes add their nodes."""
        traced = self._trace(fn, batch)
        read = read_marks(reader.read(traced, master_weights=True, roles=marks.strip(traced)))
        context = PassContext(read.graph, self._policy, self._options(traced))
        context = PassManager(STEP).run(context)
        module = writer.apply(read, context.script)
        check_lowered(module)
        self._schedule(module)
        # last: its passes read the final order
        eager.for_eager(module, recompute_casts=self.recompute_casts)
        script, tensors = context.script, read.graph.tensors
        for name, initial in script.new_inputs.items():
            if name not in self.state:
                dtype, shape = torch_dtype(tensors[name].dtype), known_shape(tensors[name])
                self.state[name] = torch.full(shape, initial, dtype=dtype, device=self.device)
        return CapturedStep(
            module,
            read.graph,
            list(script.new_inputs),
            [(name, str(tensors[name].replaces)) for name in script.new_outputs],
            {name: context.decisions[name] for name in script.new_nodes},
            context.scales,
        )

    def _trace(self, fn: Callable[..., list[torch.Tensor]], batch: Sequence) -> fx.GraphModule:
        """``fn`` traced functionally (the forward's in-place buffer updates become functional
        ops and a copy back onto the buffer arguments) on fake tensors made from the state:
        the trace neither writes nor copies it (:func:`differentiate.tracing_mode`)."""
        state = self._flatten()
        return differentiate.trace(self.forward, fn, [*state, *self._learning_rates(), *batch])

    def _options(self, traced: fx.GraphModule) -> Options:
        """What the step pipeline's passes read."""
        return Options(
            loss_scaling=self.loss_scaling,
            all_reduce=self.reduce,
            clip_grad_norm=self.clipping,
            fp8=self.fp8,
        )

    def _schedule(self, module: fx.GraphModule) -> None:
        """Order the collectives of ``module``'s graph to overlap with the computation."""
        if self.reduce is not None:
            data_parallel.overlap_communication(module)

    def _flatten(self) -> list[torch.Tensor]:
        """The step's state as the graph's leading arguments; buffers come last."""
        return [
            *self.params.values(),
            *self.opt_state.values(),
            *self.grad_acc.values(),
            *self.buffers.values(),
        ]

    def _split(self, args: Sequence[torch.Tensor]) -> tuple[dict, dict, dict, list, list]:
        """The traced functions' arguments: (params, optimizer state, accumulated grads,
        learning rates, batch); the buffers behind them are kept for the forward pass (the
        graph writes them in place: functionalize's epilogue)."""
        parts, start = [], 0
        for state in (self.params, self.opt_state, self.grad_acc, self.buffers):
            parts.append(dict(zip(state.keys(), args[start : start + len(state)], strict=True)))
            start += len(state)
        params, opt_state, grad_acc, self._traced_buffers = parts
        lrs_end = start + len(self.groups)
        return params, opt_state, grad_acc, list(args[start:lrs_end]), list(args[lrs_end:])

    # the traced functions ---------------------------------------------------------------------

    def _gradients(
        self, params: dict[str, torch.Tensor], batch: Sequence[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The trainable parameters' gradients and the loss, with the loss multiplied by a
        marked seed of one before differentiation: the loss-scale pass scales that seed."""
        trainable = {name: params[name] for name in self.trainable}
        frozen = {n: p for n, p in params.items() if n not in trainable}

        def seeded_loss(
            p: dict[str, torch.Tensor], rest: dict[str, torch.Tensor]
        ) -> tuple[torch.Tensor, torch.Tensor]:
            loss = self._loss({**p, **rest}, batch)
            return loss * marks.mark(torch.ones_like(loss), "grad_seed"), loss

        # Buffers are an argument, not captured: torch.func refuses to mutate captured tensors.
        rest = {**frozen, **self._traced_buffers}
        grads, loss = differentiate.grad(self.forward, seeded_loss)(trainable, rest)
        return grads, marks.mark(loss, "loss")

    def _loss(
        self, tensors: dict[str, torch.Tensor], batch: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """The loss of the forward pass run with ``tensors`` (its parameters and buffers)."""
        output = torch.func.functional_call(self.forward, tensors, tuple(batch[:-1]))
        # The loss runs in float32, as every AMP list has it: low-precision outputs are
        # widened first (a bfloat16/float32 mix also trips inductor's loss lowerings).
        output = torch.utils._pytree.tree_map(
            lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            output,
        )
        return self.loss_fn(output, batch[-1]).float()

    def _accumulate_fn(self, *args: torch.Tensor) -> list[torch.Tensor]:
        params, opt_state, grad_acc, _, batch = self._split(args)
        grads, loss = self._gradients(params, batch)
        grad_acc = {n: grad_acc[n] + grads[n].float() for n in grad_acc}
        return [loss, *params.values(), *opt_state.values(), *grad_acc.values()]

    def _update_fn(self, *args: torch.Tensor) -> list[torch.Tensor]:
        params, opt_state, grad_acc, lrs, batch = self._split(args)
        grads, loss = self._gradients(params, batch)
        # Accumulated micro-batches share one scale: their sum is averaged (and unscaled by
        # the loss-scale pass) once.
        total = {n: g.float() for n, g in grads.items()}
        if self.accumulate > 1:
            total = {n: (grad_acc[n] + g) * (1.0 / self.accumulate) for n, g in total.items()}
        total = {n: marks.mark(self._as_read(g, params[n]), "gradient") for n, g in total.items()}
        new_params, new_opt = optim.update(self.kind, self.groups, lrs, params, total, opt_state)
        params = {**params, **{n: marks.mark_update(v, params[n]) for n, v in new_params.items()}}
        opt_state = {k: marks.mark_update(new_opt[k], opt_state[k]) for k in opt_state}
        grad_acc = {n: torch.zeros_like(g) for n, g in grad_acc.items()}
        return [loss, *params.values(), *opt_state.values(), *grad_acc.values()]

    def _as_read(self, gradient: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """A gradient as the optimizer reads it, for ``param`` (a sharded step: a shard)."""
        return gradient

    def _learning_rates(self) -> list[torch.Tensor]:
        """Each group's current ``lr``, read from the optimizer (schedulers change it); every
        other hyper-parameter is fixed into the graph, so a change to one is refused."""
        rates = []
        rebuild = (
            "call step.copy_to() first (it writes the step's optimizer state into the optimizer,"
            " which a new train_step then continues) and build a new train_step"
        )
        groups = self.optimizer.param_groups
        if len(groups) != len(self.groups):
            raise GraphampError(
                f"the optimizer has {len(groups)} parameter groups, {len(self.groups)} when the "
                f"step was captured (add_param_group after its first call); {rebuild}"
            )
        for group, captured in zip(groups, self.groups, strict=True):
            fixed = optim.fixed_hyper(group)
            if fixed != captured.hyper:
                changed = sorted(k for k in fixed if fixed[k] != captured.hyper.get(k))
                raise GraphampError(
                    f"optimizer hyper-parameter {', '.join(changed)} changed after the step was "
                    f"captured; only lr may change: {rebuild}"
                )
            rates.append(float(group["lr"]))
        # A new tensor only when a scheduler changed a rate: on a GPU, making one is a copy
        # from the host, which the step would otherwise wait for at every call.
        if rates != self._rates:
            self._rates = rates
            # float64, as torch.optim's Python floats: Adam's step size lr / (1 - beta1^t)
            # is then rounded to float32 once, as torch.optim rounds it.
            self._rate_tensors = [
                torch.tensor(rate, dtype=torch.float64, device=self.device) for rate in rates
            ]
        return self._rate_tensors

    # use --------------------------------------------------------------------------------------

    def __call__(self, *batch: torch.Tensor) -> torch.Tensor:
        if len(batch) < 2:
            raise GraphampError("step(*batch): pass the model inputs and then the target")
        signatures.refuse_nested_tensors(batch)
        previous = self._signature
        first_run = self._first_run(previous) if self._specialise(batch) else nullcontext()
        self._micro += 1
        last = self._micro % self.accumulate == 0
        captured = self.captured["update" if last else "accumulate"]
        graph = self.graph if last else self.accumulate_graph
        assert graph is not None  # _specialise captured both (accumulate > 1: the second)
        state = [self.state[name] for name in captured.state_inputs]
        # a GraphModule's forward itself: its __call__ prints the generated code's traceback
        # to stderr before an error leaves it, where a failed first run is one line
        run = graph.forward if isinstance(graph, fx.GraphModule) else graph
        with first_run:
            loss, *results = run(*self._flatten(), *self._learning_rates(), *batch, *state)
        start = 0
        for target in (self.params, self.opt_state, self.grad_acc):
            target.update(zip(target.keys(), results[start : start + len(target)], strict=True))
            start += len(target)
        self._into_model()
        for (_, replaces), value in zip(captured.state_outputs, results[start:], strict=True):
            self.state[replaces] = value
        if last:
            # What optimizer.step() records, so LR schedulers stepped after this call do not
            # warn that the optimizer never stepped.
            self.optimizer._opt_called = True  # type: ignore[attr-defined]  # (private: no stub)
        return loss

    def _into_model(self) -> None:
        """Keep the model's tensors the trained parameters: a new tensor an update made (where
        a graph could not write in place) is copied into the model's own, which stays held."""
        for name, own in self._model_params.items():
            if self.params[name] is not own:
                with torch.no_grad():
                    own.copy_(self.params[name])
                self.params[name] = own

    def compile(self, *batch: torch.Tensor, **options: Any) -> TrainStep:
        """Capture on ``batch`` (no step), compile the graphs: ``torch.compile(**options)``."""
        self._specialise(batch)
        self._compile_options = options  # a signature seen later is compiled when captured
        for signature, graphs in list(self._graphs.items()):
            self._graphs[signature] = signatures.compiled(graphs, options, self.write_back)
        assert self._signature is not None  # _specialise chose the batch's
        self._use(self._signature, self._graphs[self._signature])
        return self

    @property
    def loss_scale(self) -> torch.Tensor:
        if "loss_scale.scale" in self.state:
            return self.state["loss_scale.scale"]
        initial = self.loss_scaling.initial_scale if self.loss_scaling is not None else 1.0
        return torch.tensor(initial)

    @property
    def skipped_steps(self) -> torch.Tensor:
        return self.state.get("skipped_steps", torch.tensor(0, dtype=torch.int32))

    def scaling_state_dict(self) -> dict[str, torch.Tensor]:
        """The loss scale, its counters and the skip count, for a checkpoint."""
        return {name: value.clone() for name, value in self.state.items()}

    def load_scaling_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Resume the loss scale, its counters and the skip count from
        :meth:`scaling_state_dict` (before the first call or after it)."""
        known = ("loss_scale.", "skipped_steps", "float8.")
        unknown = [name for name in state if not name.startswith(known)]
        if unknown:
            raise GraphampError(f"load_scaling_state_dict: unknown entry {unknown[0]!r}")
        self.state.update({name: value.detach().clone() for name, value in state.items()})

    def state_bytes(self) -> int:
        """The bytes of the parameters, optimizer state and carried gradients the step holds
        (on this rank; a sharded step's are its shards)."""
        held = [*self.params.values(), *self.opt_state.values(), *self.grad_acc.values()]
        return sum(t.numel() * t.element_size() for t in held)

    def explain(self, node: str) -> str:
        """The chain of reasons for a node of the step's plan (a forward op, or one of the
        nodes the training passes added, such as ``loss_scale`` or ``step_guard``)."""
        if self.plan is None:
            raise GraphampError("the step is captured on its first call: call it first")
        graph = self.captured["update"].graph
        return report.explain(self.plan, node, graph if node in graph.nodes else None)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained parameters by name: the tensors the step updates in place later (the
        model's own, detached, unless ``keep_model``)."""
        return dict(self.params)

    def copy_to(self, model: nn.Module | None = None) -> None:
        """Write the trained parameters and buffers back into ``model`` (default: the one
        given). For the model given, the optimizer's state (momentum buffers, moments, step) is
        written into the optimizer too, in torch.optim's layout, so ``optimizer.state_dict()``
        checkpoints the run and a new ``train_step`` on it resumes where this one stopped."""
        target = model or self.model
        if target is self.model and self.graph is not None:
            optim.export_state(self.kind, self.groups, self.opt_state, self.optimizer, self.model)
        own = {**dict(target.named_parameters()), **dict(target.named_buffers())}
        with torch.no_grad():
            for name, value in {**self.params, **self.buffers}.items():
                if name not in own:
                    raise GraphampError(f"parameter {name!r} has no counterpart in the model")
                if not _same_memory(own[name], value):  # the model's own already: trained
                    own[name].copy_(value)


def _names(names: Sequence[str], shown: int = 3) -> str:
    """A few parameter names, and how many more."""
    listed = ", ".join(repr(name) for name in names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same storage."""
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
        and optim.same_layout(a, b)
    )
