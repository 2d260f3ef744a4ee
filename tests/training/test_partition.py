"""The step graph cut in two for torch.compile (graphamp/fx/training/partition.py): the forward
holds the loss's ancestors and no backward or update node, the rest everything else, and the
two run one after the other compute the whole graph's values bit for bit."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from graphamp.fx import train_step
from graphamp.fx.training import eager, partition, signatures


def conv_net() -> nn.Module:
    """ResNet's stem in small: convolution, batch norm, ReLU, a max pool with padding."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        nn.Flatten(),
        nn.Linear(8 * 3 * 3, 5),
    ).train()


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, 8, 8, generator=generator), torch.randint(
        0, 5, (4,), generator=generator
    )


def step_graph(dtype: str = "bfloat16", optimizer: str = "sgd") -> tuple[fx.GraphModule, list]:
    """A captured step graph in the form torch.compile takes, and arguments to run it on."""
    model = conv_net()
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    }[optimizer]
    step = train_step(model, nn.functional.cross_entropy, make(model.parameters()), dtype=dtype)
    step(*batch(0))
    captured = step.captured["update"]
    module = eager.for_compile(captured.module, signatures.written_back(captured))
    state = [step.state[name] for name in captured.state_inputs]
    args = [*step._flatten(), *step._learning_rates(), *batch(1), *state]
    return module, args


def clones(args: list) -> list:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.float(), b.float())


def is_backward_or_update(node: fx.Node) -> bool:
    name = str(node.target)
    return "backward" in name or name.startswith(("aten.copy_", "aten.where", "aten.addcmul"))


@pytest.mark.parametrize(("dtype", "optimizer"), [("bfloat16", "sgd"), ("float16", "adamw")])
def test_the_two_graphs_compute_the_whole_graphs_values(dtype, optimizer):
    """Run eagerly (no compiler), the two parts give every output of the whole graph bit for
    bit and write the same state into the same arguments (parameters, optimizer state, batch
    norm statistics, the loss-scaling state with float16)."""
    module, args = step_graph(dtype, optimizer)
    parts = partition.split(module)
    assert parts is not None
    whole_args, split_args = clones(args), clones(args)
    whole = module(*whole_args)
    run = partition.compiled(parts, {}, lambda graph, _: graph)
    cut = run(*split_args)
    assert len(cut) == len(whole)
    for a, b in zip(whole, cut, strict=True):
        assert same_bits(a, b)
    changed = 0
    for before, a, b in zip(args, whole_args, split_args, strict=True):
        if isinstance(a, torch.Tensor):
            assert same_bits(a, b)
            changed += not torch.equal(before, a)
    assert changed >= 10  # parameters, momenta and running statistics were written


def test_a_max_pool_saves_its_window_offsets_for_the_rest():
    """After :func:`partition.max_pool_offsets` the forward passes the rest the max pool's
    int8 window offsets, not its int64 indices, and the two graphs still compute the whole
    graph's values bit for bit (the decomposition's ops run eagerly too)."""
    module, args = step_graph()
    whole = module(*clones(args))
    assert partition.max_pool_offsets(module) == 1
    parts = partition.split(module)
    assert parts is not None
    saved = next(n for n in parts.forward.graph.nodes if n.op == "output").args[0]
    types = [node.meta["val"].dtype for node in saved]
    assert torch.int8 in types and torch.int64 not in types
    rest_ops = {str(n.target) for n in parts.rest.graph.nodes}
    assert "prims._low_memory_max_pool_offsets_to_indices.default" in rest_ops
    cut = partition.compiled(parts, {}, lambda graph, _: graph)(*clones(args))
    assert all(same_bits(a, b) for a, b in zip(whole, cut, strict=True))


def test_the_forward_graph_holds_no_backward_or_update_node():
    module, _ = step_graph()
    parts = partition.split(module)
    assert parts is not None
    forward_ops = [n for n in parts.forward.graph.nodes if n.op == "call_function"]
    assert not [n for n in forward_ops if is_backward_or_update(n)]
    rest_ops = {str(n.target) for n in parts.rest.graph.nodes if n.op == "call_function"}
    assert "aten.convolution_backward.default" in rest_ops
    assert "aten.convolution.default" not in rest_ops  # no forward op is computed twice
    # every op of the whole graph is in exactly one part (the view recomputed aside)
    count = lambda graph: sum(n.op == "call_function" for n in graph.nodes)  # noqa: E731
    assert count(parts.forward.graph) + count(parts.rest.graph) == count(module.graph)
    # the forward returns the loss first
    output = next(n for n in parts.forward.graph.nodes if n.op == "output")
    loss = next(n for n in module.graph.nodes if n.op == "output").args[0][0]
    assert output.args[0][0].name == loss.name


def written_weight_graph() -> fx.GraphModule:
    """A hand-traced step: loss = sum((x @ w.t())^2), the gradient, and ``w`` written in place
    at the end; the rest also reads the forward's view ``t(w)``."""

    def step(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wt = w.t()
        y = x @ wt
        loss = (y * y).sum()
        grad = (2 * y).t() @ x
        kept = wt * 1.0
        w.copy_(w - 0.1 * grad)
        return loss, kept

    return make_fx(step)(torch.randn(3, 4), torch.randn(2, 4))


def test_a_view_of_an_argument_is_recomputed_not_passed():
    """The forward's ``t(w)`` is read by the rest, which writes ``w``: the rest takes ``w``
    and recomputes the view, so no forward output aliases an argument the rest writes."""
    module = written_weight_graph()
    parts = partition.split(module)
    assert parts is not None
    saved = next(n for n in parts.forward.graph.nodes if n.op == "output").args[0]
    assert all(str(n.target) != "aten.t.default" for n in saved)
    assert 0 in parts.rest_args  # w itself
    w, x = torch.randn(3, 4), torch.randn(2, 4)
    w_whole, w_cut = w.clone(), w.clone()
    whole = module(w_whole, x)
    cut = partition.compiled(parts, {}, lambda graph, _: graph)(w_cut, x)
    assert all(torch.equal(a, b) for a, b in zip(whole, cut, strict=True))
    assert torch.equal(w_whole, w_cut) and not torch.equal(w, w_cut)


def test_a_write_the_forward_would_overtake_keeps_the_graph_whole():
    """Where a node of the rest writes an argument before a node of the forward reads it (the
    write not an ancestor of the loss), running the forward first would change the loss: such
    a graph is not cut."""
    module = written_weight_graph()
    graph = module.graph
    w = next(n for n in graph.nodes if n.op == "placeholder")
    first = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_before(first):
        half = graph.call_function(torch.ops.aten.mul.Tensor, (w, 0.5))
        graph.call_function(torch.ops.aten.copy_.default, (w, half))
    module.recompile()
    assert partition.split(module) is None


def test_a_graph_without_a_rest_is_not_cut():
    def forward_only(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        square = x * x
        return square.sum(), square

    module = make_fx(forward_only)(torch.randn(3))
    assert partition.split(module) is None


def test_the_forward_keeps_inductors_layouts_under_any_mode():
    """The forward's outputs keep inductor's layouts (``keep_output_stride`` off); a ``mode``
    becomes the inductor options it stands for, the user's options win, and another backend
    gets the options as they are."""
    assert partition.forward_options({}) == {"options": {"keep_output_stride": False}}
    given = {"mode": "max-autotune-no-cudagraphs", "fullgraph": True}
    assert partition.forward_options(given) == {
        "fullgraph": True,
        "options": {
            "max_autotune": True,
            "coordinate_descent_tuning": True,
            "keep_output_stride": False,
        },
    }
    own = {"options": {"keep_output_stride": True, "max_autotune": False}}
    assert partition.forward_options(own) == own
    assert partition.forward_options({"backend": "aot_eager"}) == {"backend": "aot_eager"}


def test_a_value_an_in_place_op_wrote_keeps_the_graph_whole():
    """A forward value that is an argument written in place (``add_``'s result) would reach
    the rest as a second name for memory it writes: such a graph is not cut."""

    def step(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bumped = w.add_(1.0)
        loss = (x @ bumped.t()).sum()
        return loss, bumped * 2.0

    assert partition.split(make_fx(step)(torch.randn(3, 4), torch.randn(2, 4))) is None


@pytest.mark.compile
@pytest.mark.slow
def test_the_compiled_step_runs_two_graphs_and_trains_as_the_eager_step():
    """The compiled step (two inductor graphs) against the eager step on the same batches,
    float16 with loss scaling: losses, parameters and batch-norm statistics within 1e-3 (the
    two round differently: inductor's kernels against eager's), where three steps move the
    parameters ten times as far."""
    eager_model, compiled_model, initial = conv_net(), conv_net(), conv_net()

    def step(model: nn.Module) -> object:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        return train_step(model, nn.functional.cross_entropy, optimizer, dtype="float16")

    eager_step, compiled_step = step(eager_model), step(compiled_model).compile(*batch(0))
    assert isinstance(compiled_step.graph, partition.CompiledSplitStep)
    forward, rest = compiled_step.graph.parts.forward.code, compiled_step.graph.parts.rest.code
    assert "backward" not in forward and "convolution_backward" in rest
    assert compiled_step.graph.code == forward + rest
    for seed in range(3):
        a, b = eager_step(*batch(seed)), compiled_step(*batch(seed))
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-3)
    before = initial.state_dict()
    trained, compiled = eager_model.state_dict(), compiled_model.state_dict()
    assert max((trained[n].float() - before[n].float()).abs().max() for n in before) > 1e-2
    for name, value in compiled.items():
        assert torch.allclose(value.float(), trained[name].float(), rtol=0, atol=1e-3), name


class DropoutNet(nn.Module):
    """An embedding, a layer norm and two dropouts before the head, as a BERT's embeddings
    and layers have them: the compiled forward made its dropouts' products zero (torch 2.13's
    inductor, bernoulli.p in a forward compiled alone)."""

    def __init__(self, vocab: int = 100, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding, self.norm = nn.Embedding(vocab, width), nn.LayerNorm(width)
        self.dropout = nn.Dropout(0.1)
        self.up, self.head = nn.Linear(width, width), nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(self.norm(self.embedding(ids)))
        hidden = self.dropout(nn.functional.gelu(self.up(hidden))) + hidden
        return self.head(hidden).flatten(0, 1)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, labels.flatten())


def test_a_dropout_mask_is_drawn_by_rand_with_bernoullis_distribution():
    """random_masks turns each bernoulli.p into rand < p in the mask's type: the two of
    DropoutNet's captured step go, and a mask of 200,000 elements keeps 0.9 of them (within
    0.005: five standard deviations) and scales them by 1/0.9, in bfloat16 as traced."""
    model, ids = DropoutNet().train(), torch.randint(0, 100, (4, 16))
    step = train_step(model, token_loss, torch.optim.SGD(model.parameters(), lr=0.1))
    step(ids, ids)
    captured = step.captured["update"]
    module = eager.for_compile(captured.module, signatures.written_back(captured))
    masks = [n for n in module.graph.nodes if n.target is torch.ops.aten.bernoulli.p]
    assert len(masks) == 2 and partition.random_masks(module) == 2
    assert not any(n.target is torch.ops.aten.bernoulli.p for n in module.graph.nodes)
    assert not any(n.target is torch.ops.aten.expand.default for n in module.graph.nodes)

    def dropout(x: torch.Tensor) -> torch.Tensor:
        shape = torch.ops.aten.expand.default(torch.empty([], dtype=x.dtype), list(x.shape))
        return x * torch.ops.aten.bernoulli.p(shape, 0.9) / 0.9

    module = make_fx(dropout)(torch.ones(400, 500, dtype=torch.bfloat16))
    assert partition.random_masks(module) == 1
    targets = [n.target for n in module.graph.nodes]
    assert torch.ops.aten.bernoulli.p not in targets and torch.ops.aten.rand.default in targets
    out = module(torch.ones(400, 500, dtype=torch.bfloat16))
    kept = out != 0
    assert out.dtype == torch.bfloat16 and abs(kept.float().mean().item() - 0.9) < 5e-3
    assert torch.equal(out[kept], torch.full_like(out[kept], 1 / 0.9))


def test_a_step_is_cut_where_its_forward_has_batch_statistics():
    """The cut pays for a batch norm's step (ResNet-50 1.15x faster), not for a transformer's
    (BERT-base 1.15x slower cut): conv_net's step is cut, DropoutNet's is not."""
    module, _ = step_graph()
    assert partition.cut_pays(module)
    model, ids = DropoutNet().train(), torch.randint(0, 100, (4, 16))
    step = train_step(model, token_loss, torch.optim.SGD(model.parameters(), lr=0.1))
    step(ids, ids)
    assert not partition.cut_pays(step.captured["update"].module)
    assert not partition.cut_pays(step_graph_eval())


@pytest.mark.parametrize(
    "op, args",
    [
        (torch.ops.aten.cudnn_batch_norm.default, (True, 0.1, 1e-5)),
        (torch.ops.aten.miopen_batch_norm.default, (True, 0.1, 1e-5)),
        (torch.ops.aten._batch_norm_with_update.default, (0.1, 1e-5)),
    ],
    ids=["cudnn", "miopen", "with-update"],
)
def test_a_step_traced_on_a_gpu_is_cut_where_its_batch_norms_use_batch_statistics(op, args):
    """On a CUDA device the trace holds ``cudnn_batch_norm`` (an H200's ResNet-50 step was
    compiled whole, 0.74x compile + autocast, its forward in the backward's kernels); the
    graph is built by hand, as a CPU cannot trace it. In eval mode it is not cut."""

    def graph(training: bool) -> fx.GraphModule:
        g = fx.Graph()
        x, w, b, mean, var = (g.placeholder(name) for name in ("x", "w", "b", "mean", "var"))
        flags = args if training or len(args) == 2 else (False, *args[1:])
        norm = g.call_function(op, (x, w, b, mean, var, *flags))
        g.output((g.call_function(operator.getitem, (norm, 0)),))
        return fx.GraphModule(torch.nn.Module(), g)

    assert partition.cut_pays(graph(training=True))
    if len(args) == 3:  # the ops with a training flag
        assert not partition.cut_pays(graph(training=False))


def step_graph_eval() -> fx.GraphModule:
    """conv_net's forward in eval mode: its batch norm reads running statistics."""
    model = conv_net().eval()
    return make_fx(model)(batch(0)[0])


@pytest.mark.compile
def test_the_compiled_step_trains_the_layers_before_a_dropout(monkeypatch):
    """Three compiled steps, cut in two inductor graphs, move the embedding before the
    dropouts, as the eager step does: with bernoulli.p left to inductor they did not move."""
    monkeypatch.setattr(partition, "cut_pays", lambda module: True)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(1))
    moved = {}
    for compiled in (False, True):
        model = DropoutNet().train()
        before = model.embedding.weight.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        step = train_step(model, token_loss, optimizer, dtype="bfloat16")
        if compiled:
            step = step.compile(ids, labels)
            assert isinstance(step.graph, partition.CompiledSplitStep)
        for _ in range(3):
            assert torch.isfinite(step(ids, labels))
        moved[compiled] = (model.embedding.weight - before).abs().max().item()
    assert moved[False] > 1e-3
    assert moved[True] > moved[False] / 2


class CudnnBatchNorm(nn.BatchNorm2d):
    """A batch norm calling ``cudnn_batch_norm`` itself, as a step traced on a CUDA device
    holds it (``nn.BatchNorm2d`` dispatches there on a GPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        args = (self.weight, self.bias, self.running_mean, self.running_var, self.training)
        return torch.ops.aten.cudnn_batch_norm(x, *args, self.momentum, self.eps)[0]


@pytest.fixture
def cudnn_on_cpu():
    """``cudnn_batch_norm`` and its backward given CPU kernels for the test: the native batch
    norm's, which cuDNN's compute (the running statistics updated in place, as cuDNN does)."""
    library = torch.library.Library("aten", "IMPL")

    def forward(x, weight, bias, mean, var, training, momentum, eps):  # type: ignore[no-untyped-def]
        out, saved_mean, saved_invstd = torch.ops.aten.native_batch_norm(
            x, weight, bias, mean, var, training, momentum, eps
        )
        return out, saved_mean, saved_invstd, x.new_empty((0,), dtype=torch.uint8)

    def backward(x, grad, weight, mean, var, saved_mean, saved_invstd, eps, reserve):  # type: ignore[no-untyped-def]
        return torch.ops.aten.native_batch_norm_backward(
            grad, x, weight, mean, var, saved_mean, saved_invstd, True, eps, [True] * 3
        )

    library.impl("cudnn_batch_norm", forward, "CPU")
    library.impl("cudnn_batch_norm_backward", backward, "CPU")
    yield
    library._destroy()


@pytest.mark.compile
@pytest.mark.usefixtures("cudnn_on_cpu")
def test_a_step_holding_cudnn_batch_norm_is_cut_and_trains_as_its_eager_step():
    """A CUDA trace's batch norm (the H200's ResNet-50 step was compiled whole, 0.74x compile
    + autocast): the compiled step is cut, and three steps give the eager step's losses and
    running statistics."""
    results = {}
    for compiled in (False, True):
        model = conv_net()
        model[1] = CudnnBatchNorm(8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = train_step(model, nn.functional.cross_entropy, optimizer)
        if compiled:
            step.compile(*batch(0))
            assert isinstance(step._graphs[step._signature].update, partition.CompiledSplitStep)
        losses = [float(step(*batch(seed))) for seed in range(3)]
        results[compiled] = losses, model[1].running_mean.clone()
    graph = step.captured["update"].module.graph
    assert any(n.target is torch.ops.aten.cudnn_batch_norm.default for n in graph.nodes)
    (eager_losses, eager_mean), (losses, mean) = results[False], results[True]
    torch.testing.assert_close(losses, eager_losses, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mean, eager_mean, rtol=1e-4, atol=1e-5)
    assert not torch.equal(mean, torch.zeros(8))  # the statistics moved


@pytest.mark.usefixtures("cudnn_on_cpu")
def test_a_rest_reading_running_statistics_before_cudnn_batch_norm_writes_them_is_not_cut():
    """``cudnn_batch_norm`` writes its running statistics without its schema saying so: a
    node of the rest that reads them before it (the old values) would read the new ones once
    the forward ran first, so such a step is not cut; read after it, it is."""

    def step(before: bool):  # type: ignore[no-untyped-def]
        def f(x, weight, bias, mean, var):  # type: ignore[no-untyped-def]
            old = mean * 2.0 if before else None  # not the loss's ancestor: the rest's
            out = torch.ops.aten.cudnn_batch_norm(x, weight, bias, mean, var, True, 0.1, 1e-5)
            return out[0].sum(), mean * 2.0 if old is None else old

        args = (torch.randn(4, 3, 5, 5), torch.ones(3), torch.zeros(3), torch.zeros(3))
        return make_fx(f)(*args, torch.ones(3))

    assert partition.split(step(before=True)) is None
    assert partition.split(step(before=False)) is not None
