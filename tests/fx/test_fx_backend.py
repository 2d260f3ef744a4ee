"""graphamp.fx.backend() as torch.compile's backend in the user's own training loop with
torch.amp.GradScaler: it trains as autocast + GradScaler does, within float rounding (no
further from autocast's loss curve than autocast's own curve moves when every parameter is
moved by one float32 ulp), and the plans of the graphs it converted are reachable."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import transformers
from torch import nn

import graphamp.fx as gfx
from graphamp.core.vocab import Precision
from graphamp.errors import GraphampError
from graphamp.policy.policy import Policy

STEPS = 30  # the 200-step curves are tools/bench/bench_fx.py --suite compile's


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, stride=2),
            nn.BatchNorm2d(16),
            nn.ReLU(),
        )
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).mean((2, 3)))


def small_bert() -> nn.Module:
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=16,
        num_labels=4,
        hidden_dropout_prob=0.0,  # compiled graphs draw dropout masks from other streams
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(config)


def batches(kind: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    if kind == "cnn":
        return [
            (torch.randn(4, 3, 8, 8, generator=generator), torch.randint(0, 10, (4,)))
            for _ in range(STEPS)
        ]
    return [
        (torch.randint(1, 64, (4, 8), generator=generator), torch.randint(0, 4, (4,)))
        for _ in range(STEPS)
    ]


@functools.cache
def train(kind: str, dtype: torch.dtype, how: str, inner: str = "aot_eager") -> list[float]:
    """Losses of STEPS steps of SGD with momentum and GradScaler (enabled for float16):
    ``how`` is "autocast", "perturbed" (autocast, every weight one float32 ulp off),
    "compiled" (torch.compile + autocast) or "graphamp" (the backend, then ``inner``)."""
    torch.manual_seed(0)
    model = SmallCNN() if kind == "cnn" else small_bert()
    model.train()
    if how == "perturbed":
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1 + 2**-23)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    run = model
    if how == "compiled":
        run = torch.compile(model)
    if how == "graphamp":
        backend = gfx.backend(dtype=str(dtype).removeprefix("torch."), inner=inner)
        run = torch.compile(model, backend=backend)
    losses = []
    for x, y in batches(kind):
        with torch.autocast("cpu", dtype=dtype, enabled=how != "graphamp"):
            output = run(x)
        logits = output if kind == "cnn" else output.logits
        loss = nn.functional.cross_entropy(logits.float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


def largest_difference(ours: list[float], reference: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(ours, reference, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cnn", "bert"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_trains_like_autocast_and_grad_scaler(kind, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no float16 matrix units on this CPU: a slow warning
        reference = train(kind, dtype, "autocast")
        rounding = largest_difference(train(kind, dtype, "perturbed"), reference)
        ours = train(kind, dtype, "graphamp")
    assert rounding > 0
    assert largest_difference(ours, reference) <= rounding, (kind, dtype)
    assert ours[-1] < ours[0] or reference[-1] >= reference[0]


@pytest.mark.compile
@pytest.mark.slow
def test_inductor_compiles_the_converted_graphs_and_trains_within_rounding():
    """Inductor rounds differently from eager (fused kernels keep float32 between ops), as it
    does for torch.compile + autocast: the backend stays within that gap plus the one-ulp
    spread of eager autocast's own curve."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = train("cnn", torch.bfloat16, "autocast")
        rounding = largest_difference(train("cnn", torch.bfloat16, "perturbed"), reference)
        compiled = largest_difference(train("cnn", torch.bfloat16, "compiled"), reference)
        ours = train("cnn", torch.bfloat16, "graphamp", inner="inductor")
    assert largest_difference(ours, reference) <= compiled + rounding


def test_plans_of_the_graphs_compiled_and_name_rules():
    torch.manual_seed(0)
    model = SmallCNN()
    backend = gfx.backend(dtype="bfloat16", inner="aot_eager", deny_names=["fc"])
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(4, 3, 8, 8)
    output = compiled(x)
    assert output.dtype == torch.float32  # fc stays float32 by the name rule
    output.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    (plan,) = backend.plans
    assert plan.nodes["body.0/conv2d"].precision is Precision.BFLOAT16
    assert plan.nodes["fc/linear"].precision is Precision.FLOAT32
    assert plan.nodes["fc/linear"].rule == "deny_name"
    # parameters and inputs are named as named_parameters() names them
    assert {"x", "body_0_weight", "body_3_weight"} <= {cast.tensor for cast in plan.casts}
    with torch.no_grad():  # another shape: Dynamo captures again, the backend converts again
        compiled(torch.randn(2, 3, 8, 8))
    assert len(backend.plans) == 2


def test_bad_options_are_refused_when_the_backend_is_made():
    with pytest.raises(GraphampError, match="dtype"):
        gfx.backend(dtype="int8")
    with pytest.raises(GraphampError, match="either a policy or keyword overrides"):
        gfx.backend(policy=Policy.create(dialect="fx_cpu"), deny_names=["fc"])
    with pytest.raises(GraphampError, match=r"inner='nope' is no torch.compile backend"):
        gfx.backend(inner="nope")  # (was Dynamo's BackendCompilerFailed at the first call)
    with pytest.raises(GraphampError, match=r"inner=None is no torch\.compile backend"):
        gfx.backend(inner=None)  # type: ignore[arg-type]
    with pytest.raises(GraphampError, match=r"policy is a graphamp\.Policy, got str"):
        gfx.backend(policy="bfloat16")  # type: ignore[arg-type]


def test_module_paths_as_named_modules_names_them():
    from graphamp.fx.backend import module_path

    assert module_path("L['self'].layers[0].attention") == "layers.0.attention"
    assert module_path("L['self']._modules['fc']._parameters['weight']") == "fc.weight"
    assert module_path("L['fn']._modules['0']") == "0"  # an nn.Sequential compiled
    assert module_path("L['x']") == "x"


def test_casts_of_parameters_and_inputs_sit_at_their_first_reader():
    """Where autocast casts them: with the casts at the top of the graph, the backward cast
    every weight gradient back to float32 only after the whole backward."""
    backend = gfx.backend(dtype="bfloat16", inner="aot_eager")
    graphs: list[torch.fx.GraphModule] = []
    convert = backend.convert
    backend.convert = lambda graph, inputs: graphs.append(convert(graph, inputs)) or graphs[-1]
    torch.manual_seed(0)
    torch.compile(SmallCNN(), backend=backend, dynamic=False)(torch.randn(4, 3, 8, 8))
    (graph,) = graphs
    nodes = list(graph.graph.nodes)

    def casts_a_leaf(node: torch.fx.Node) -> bool:
        return node.target is torch.ops.aten._to_copy.default and node.args[0].op in (
            "placeholder",
            "get_attr",
        )

    casts = [node for node in nodes if casts_a_leaf(node)]
    assert {cast.args[0].name for cast in casts} >= {"x", "body_0_weight", "fc_weight"}
    for cast in casts:
        first_reader = min(nodes.index(user) for user in cast.users)
        between = nodes[nodes.index(cast) + 1 : first_reader]
        assert all(casts_a_leaf(node) for node in between), (cast.name, between)


def test_a_graph_after_a_graph_break_reads_the_low_output_of_the_one_before():
    """The second graph's linear read a bfloat16 activation beside its float32 weight: read as
    already low, its weight got no cast and the kept pass held the rest float32, and the call
    failed ('mat1 and mat2 must have the same dtype'). Each graph is decided by the lists, as
    autocast decides every op, and the whole runs as eager autocast does."""

    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.first(x)
            torch._dynamo.graph_break()
            return self.second(torch.relu(h))

    torch.manual_seed(0)
    model, x = Broken(), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    backend = gfx.backend(dtype="bfloat16", inner="aot_eager")
    torch._dynamo.reset()
    actual = torch.compile(model, backend=backend)(x)
    assert len(backend.plans) == 2
    assert backend.plans[1].nodes["second/linear"].precision == Precision.BFLOAT16
    assert actual.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(actual, expected)
