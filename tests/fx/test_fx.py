"""The PyTorch dialect: graphamp.fx.convert on the zoo, bfloat16 on the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import graphamp.fx as gfx
from graphamp.errors import (
    GraphampError,
    KeptWarning,
    ModeWarning,
    StaticShapeWarning,
    UnlistedOpWarning,
)
from graphamp.models import build
from tests.fx.recording import DtypeRecorder, matrix_dtypes
from tests.helpers import ZOO_NAMES


def first_output(result):  # type: ignore[no-untyped-def]
    return result[0] if isinstance(result, tuple | list) else result


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_in_bfloat16_matches_float32_and_autocast(name):
    model, inputs = build(name, "small")
    gm, plan = gfx.convert(model, inputs)
    with torch.no_grad():
        expected = first_output(model(*inputs)).float()
        actual = first_output(gm(*inputs)).float()
    scale = expected.abs().max()
    assert torch.isfinite(actual).all()
    assert (actual - expected).abs().max() <= 5e-2 * scale
    assert (actual - expected).abs().max() > 0, "nothing ran in bfloat16?"
    for decision in plan.nodes.values():
        if decision.rule == "allow":
            assert decision.precision == "bfloat16", decision
    # The matrix products run in bfloat16, exactly where torch.autocast runs them in bfloat16.
    ours = matrix_dtypes(gm, *inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = matrix_dtypes(model, *inputs)
    assert ours and set(ours) == {torch.bfloat16}
    assert sorted(map(str, ours)) == sorted(map(str, theirs))


def test_fp32_list_ops_stay_float32():
    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return nn.functional.mse_loss(self.fc(x), target)

    model = WithLoss()
    x, target = torch.randn(4, 8), torch.randn(4, 8)
    gm, plan = gfx.convert(model, (x, target))
    ops = {d.op: d for d in plan.nodes.values()}
    assert ops["linear"].precision == "bfloat16"
    assert ops["mse_loss"].precision == "float32" and ops["mse_loss"].rule == "deny"
    with DtypeRecorder() as recorder:
        loss = gm(x, target)
    assert loss.dtype == torch.float32
    assert ("mse_loss", torch.float32) in recorder.calls


def test_master_weights_give_float32_gradients_close_to_float32_training():
    model, (x,) = build("simplenet", "small")
    gm, _ = gfx.convert(model, (x,), weights="master")
    gm(x).float().square().mean().backward()
    model(x).square().mean().backward()
    for (name, reference), param in zip(model.named_parameters(), gm.parameters(), strict=True):
        assert param.dtype == torch.float32 and param.grad is not None
        assert param.grad.dtype == torch.float32, name
        error = (param.grad - reference.grad).abs().max() / reference.grad.abs().max()
        assert error < 5e-2, (name, float(error))


def test_each_parameter_is_cast_once_per_call():
    model, inputs = build("bert", "small")
    gm, plan = gfx.convert(model, inputs)
    casts = [n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    sources = [n.args[0].name for n in casts]
    assert len(sources) == len(set(sources)), "a value was cast twice"
    assert len(sources) == len(plan.casts)  # every planned cast, and only those, is there
    assert "layers.0.attention.query.weight" in {c.tensor for c in plan.casts}


def test_low_weights_halve_parameter_memory():
    model, inputs = build("simplenet", "small")
    before = sum(p.numel() * p.element_size() for p in model.parameters())
    gm, plan = gfx.convert(model, inputs, weights="low")
    after = sum(p.numel() * p.element_size() for p in gm.parameters())
    assert after == before // 2
    assert all(p.dtype == torch.float32 for p in model.parameters()), "the input was changed"
    assert not any(c.tensor.endswith("weight") for c in plan.casts)


def test_name_rules_match_module_paths():
    model, inputs = build("bert", "small")
    _, plan = gfx.convert(model, inputs, deny_names=["layers.0.attention*"])
    by_scope = {name: d for name, d in plan.nodes.items() if d.op in ("linear", "matmul")}
    denied = {name for name, d in by_scope.items() if d.rule == "deny_name"}
    assert len(denied) == 6  # query, key, value, output projections and the two matmuls
    assert all(by_scope[name].precision == "float32" for name in denied)
    assert sum(1 for d in by_scope.values() if d.precision == "bfloat16") == len(by_scope) - 6


def test_deny_tensor_keeps_its_reader_and_writer_float32():
    model, inputs = build("simplenet", "small")
    _, plan = gfx.convert(model, inputs, deny_tensors=["layers.2/linear"])
    assert plan.nodes["layers.2/linear"].precision == "float32"
    assert plan.nodes["layers.2/linear"].rule == "deny_tensor"


def test_plan_names_are_module_paths_and_survive_edits_elsewhere():
    model, inputs = build("bert", "small")
    _, plan = gfx.convert(model, inputs)
    assert "layers.0.attention.query/linear" in plan.nodes
    assert "layers.1.attention/matmul_1" in plan.nodes  # the second matmul in that module
    # Denying layer 0's attention changes those nodes and nothing named in layer 1.
    _, denied = gfx.convert(model, inputs, deny_names=["layers.0.attention*"])
    changed = {name for name, _, _ in plan.diff(denied).nodes_changed}
    assert changed and all(name.startswith("layers.0.") for name in changed)


@pytest.mark.slow
def test_deterministic_and_idempotent():
    model, inputs = build("gpt", "small")
    gm_a, plan_a = gfx.convert(model, inputs)
    gm_b, plan_b = gfx.convert(model, inputs)
    assert plan_a.to_json() == plan_b.to_json()
    assert gm_a.code == gm_b.code
    _, again = gfx.convert(gm_a, inputs)
    assert again.summary()["casts_inserted"] == 0 and not again.weights


def test_runs_under_torch_compile_with_autograd():
    model, (x,) = build("simplenet", "small")
    gm, _ = gfx.convert(model, (x,))
    compiled = torch.compile(gm, backend="aot_eager")
    out = compiled(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in gm.parameters())


def test_bad_inputs_name_the_problem():
    model, _ = build("simplenet", "small")
    with pytest.raises(GraphampError, match="example_inputs"):
        gfx.convert(model)

    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # control flow on a value: torch.export cannot capture it
                return x * 2
            return x

    # one line: the file and line of the branch, and what to write instead
    with pytest.raises(GraphampError) as caught:
        gfx.convert(DataDependent(), (torch.randn(3),))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("DataDependent: torch.export cannot")
    assert f"{__file__}:" in message and "if x.sum() > 0:" in message and "torch.cond" in message
    with pytest.raises(GraphampError, match=r"weights="):
        gfx.convert(model, (torch.randn(2, 64),), weights="half")


@pytest.mark.parametrize("native", [True, False])
def test_warns_when_the_cpu_emulates_the_low_precision_type(monkeypatch, native):
    """A CPU without bfloat16 matrix units runs the converted module tens of times slower than
    float32: the user is told so, once, instead of finding out from a profile."""
    import warnings

    from graphamp.errors import SlowPrecisionWarning

    monkeypatch.setattr(gfx.conversion, "cpu_has_native", lambda dtype: native)
    model, inputs = build("simplenet", "small")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gfx.convert(model, inputs, dtype="bfloat16")
    slow = [w for w in caught if issubclass(w.category, SlowPrecisionWarning)]
    if native:
        assert not slow
    else:
        assert len(slow) == 1 and "no bfloat16 matrix instructions" in str(slow[0].message)
        assert slow[0].filename == __file__, "the warning must point at the caller"


def test_symbolic_trace_and_exported_program_are_accepted_unchanged():
    """The three ways a user holds a model (module, symbolic_trace GraphModule, ExportedProgram)
    give the same decisions, and none of them is modified."""
    model, inputs = build("simplenet", "small")
    expected = {name: d.precision for name, d in gfx.convert(model, inputs)[1].nodes.items()}
    traced = torch.fx.symbolic_trace(model)
    traced_code = traced.code
    program = torch.export.export(model, inputs)
    program_code = program.graph_module.code
    for source, example in ((traced, inputs), (program, None)):
        gm, plan = gfx.convert(source, example)
        assert {name: d.precision for name, d in plan.nodes.items()} == expected
        output = first_output(gm(*inputs))
        assert output.dtype == torch.bfloat16
        torch.testing.assert_close(
            output.float(), first_output(model(*inputs)), rtol=0.05, atol=0.05
        )
    assert traced.code == traced_code and program.graph_module.code == program_code


def test_one_tensor_is_the_example_inputs_and_another_non_tuple_is_one_clear_error():
    """convert(module, x) with x a tensor converts as convert(module, (x,)) does; a list (one
    argument, or the arguments?) is one GraphampError saying what example inputs are."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    module, plan = gfx.convert(model, x)
    assert plan.nodes == gfx.convert(model, (x,))[1].nodes
    torch.testing.assert_close(module(x).float(), model(x), rtol=5e-2, atol=5e-2)
    with pytest.raises(GraphampError, match=r"example_inputs: a tuple .* got a list"):
        gfx.convert(model, [x])


def test_strict_makes_a_rule_that_matches_nothing_an_error():
    """strict=True is --strict for the Python API: an op no node has is refused, where
    without it the rule is a PolicyWarning and the conversion goes on."""
    from graphamp.errors import PolicyWarning

    model = nn.Sequential(nn.Linear(8, 16), nn.Softmax(dim=-1))
    x = torch.randn(4, 8)
    with pytest.warns(PolicyWarning, match="softmaxx"):
        gfx.convert(model, x, deny=["softmaxx"])
    with pytest.raises(GraphampError, match="softmaxx"):
        gfx.convert(model, x, deny=["softmaxx"], strict=True)


def test_a_torch_dtype_is_taken_as_its_name():
    """convert and train_step take dtype=torch.float16 as "float16" (a float16 step then gets
    its default loss scaling, as by name); a type no policy has is still one line."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    _, by_type = gfx.convert(model, (x,), dtype=torch.float16)
    _, by_name = gfx.convert(model, (x,), dtype="float16")
    assert by_type.to_json() == by_name.to_json()
    step = gfx.train_step(
        model, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1),
        dtype=torch.float16,
    )  # fmt: skip
    assert step.policy is None and step.overrides["dtype"] == "float16"
    assert torch.isfinite(step(x, torch.randn(4, 4))) and "loss_scale.scale" in step.state
    with pytest.raises(GraphampError, match="unknown dtype 'float64'"):
        gfx.convert(model, (x,), dtype=torch.float64)


@torch.library.custom_op("graphamp_tests::routed_mm", mutates_args=())
def routed_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A library's own matrix product, as transformers' MoE experts call
    ``transformers::grouped_mm_fallback``: computes in its inputs' type."""
    return x @ w


@routed_mm.register_fake
def _routed_mm_fake(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


def test_an_op_registered_outside_pytorch_and_in_no_list_is_named_in_a_warning():
    """autocast's lists cannot know a library's ops, and one may be the model's matrix
    products: staying float32 as unlisted says so, once per op, naming how to run it low;
    torch's own unlisted ops (cumsum) warn nothing, and an allowed library op runs low."""

    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return routed_mm(x, self.w).cumsum(0) + routed_mm(x * 2, self.w)

    model, x = Experts(), torch.randn(4, 8)
    with pytest.warns(UnlistedOpWarning) as caught:
        _, plan = gfx.convert(model, (x,))
    messages = [str(w.message) for w in caught if issubclass(w.category, UnlistedOpWarning)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("nodes 'routed_mm' and 1 more call graphamp_tests::routed_mm")
    assert "allow=['routed_mm'] runs it in bfloat16" in messages[0]
    assert {d.rule for d in plan.nodes.values() if d.op == "routed_mm"} == {"unlisted"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnlistedOpWarning)
        converted, plan = gfx.convert(model, (x,), allow=["routed_mm"])
    assert {d.precision for d in plan.nodes.values() if d.op == "routed_mm"} == {"bfloat16"}
    assert torch.allclose(converted(x).float(), model(x), rtol=0.05, atol=0.1)


@pytest.mark.parametrize("spread", ["cost", "tensorflow", "all"])
def test_every_spread_converts_and_trains_a_module(spread):
    """A master weight is float32 with no producer (cast at each use), which the cost model
    once asserted could not happen: ``spread="cost"`` crashed on every PyTorch model."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, target = torch.randn(4, 8), torch.randn(4, 4)
    converted, plan = gfx.convert(model, (x,), spread=spread)
    assert {d.precision for d in plan.nodes.values() if d.op == "linear"} == {"bfloat16"}
    assert torch.allclose(converted(x).float(), model(x), rtol=0.05, atol=0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = gfx.train_step(model, nn.functional.mse_loss, optimizer, spread=spread)
    losses = [step(x, target).item() for _ in range(3)]
    assert losses[2] < losses[0]


def test_a_low_example_input_beside_float32_weights_converts_to_a_module_that_runs():
    """A bfloat16 input into a float32 linear was read as an op already low: its weight got no
    cast and the module failed when called. Such an op computes as PyTorch promotes its
    inputs (float32), so the lists decide it; where it is held float32 (the kept rule, after
    an op the input made low), its low input is cast to float32."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error", KeptWarning)
        converted, plan = gfx.convert(model, (x,))
    assert {d.precision for d in plan.nodes.values() if d.op == "linear"} == {"bfloat16"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    assert torch.equal(converted(x), expected)

    relu_first = nn.Sequential(nn.ReLU(), nn.Linear(16, 4))
    held = r"^1 allow-list ops stay float32 \(rule kept\): .*'0/relu'"
    with pytest.warns(KeptWarning, match=held):
        converted, plan = gfx.convert(relu_first, (x,))
    assert plan.nodes["1/linear"].rule == "kept"
    assert converted(x).dtype == torch.float32
    assert torch.allclose(converted(x), relu_first(x.float()), atol=1e-6)


def test_keep_io_types_returns_float32_outputs_of_the_same_values():
    """An fx node and its value share a name: once a kept output's Cast back took the value's
    name, the edits that look nodes up by name found the Cast (keep_io_types=True failed
    with an IndexError in the writer)."""

    class TwoOutputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.out = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.fc(x)
            return h, self.out(torch.relu(h))  # h: an output another op reads too

    model, x = TwoOutputs(), torch.randn(4, 16)
    low, _ = gfx.convert(model, (x,))
    expected = [y.float() for y in low(x)]
    for keep in (True, ["fc/linear", "out/linear"]):
        kept, _ = gfx.convert(model, (x,), keep_io_types=keep)
        actual = kept(x)
        assert [y.dtype for y in actual] == [torch.float32, torch.float32], keep
        assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True)), keep
    only_h, _ = gfx.convert(model, (x,), keep_io_types=["fc/linear"])
    assert [y.dtype for y in only_h(x)] == [torch.float32, torch.bfloat16]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"deny_names": [0]}, "deny_names holds 0, not a name"),
        ({"deny": 5}, "deny is a list of names, got 5"),
        ({"calibrate": "tensor"}, "calibrate is batches"),  # its rows were taken as batches
        ({"calibrate": 5}, "calibrate is batches"),
        ({"policy": "amp.toml"}, "policy is a graphamp.Policy, got str"),
        ({"fp8": True}, "fp8 is a graphamp.Float8"),
        ({"example_kwargs": [1]}, "example_kwargs is a dict"),
        ({"strict": "no"}, "strict is True or False, got 'no'"),  # "no" was true
    ],
)
def test_arguments_of_the_wrong_type_are_one_line_naming_them(option, message):
    model, x = nn.Sequential(nn.Linear(16, 8)), torch.randn(4, 16)
    if option.get("calibrate") == "tensor":
        option = {"calibrate": x}
    with pytest.raises(GraphampError) as caught:
        gfx.convert(model, (x,), **option)
    assert str(caught.value).startswith("graphamp.fx.convert(): ")
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"accumulate": 1.5}, "accumulate is a whole number"),  # its weights never moved
        ({"accumulate": True}, "accumulate is a whole number"),
        ({"keep_model": "yes"}, "keep_model is True or False"),
        ({"policy": "amp.toml"}, "policy is a graphamp.Policy"),
        ({"loss_scaling": "static"}, "loss_scaling: a DynamicLossScaling"),
    ],
)
def test_train_step_refuses_arguments_of_the_wrong_type_when_made(option, message):
    model = nn.Sequential(nn.Linear(16, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(GraphampError, match=message):
        gfx.train_step(model, nn.functional.mse_loss, optimizer, **option)
    with pytest.raises(GraphampError, match=r"model is an nn\.Module, got function"):
        gfx.train_step(lambda x: x, nn.functional.mse_loss, optimizer)


def test_a_loss_scale_of_zero_or_less_is_refused():
    """At 0 every gradient is 0 and its unscaling not finite: each step was skipped, the
    weights never moved, and nothing said so."""
    import graphamp

    for make in (
        lambda: graphamp.StaticLossScaling(0),
        lambda: graphamp.StaticLossScaling(-1.0),
        lambda: graphamp.DynamicLossScaling(init_loss_scaling=0),
    ):
        with pytest.raises(GraphampError, match="must be finite and > 0"):
            make()


class _Flagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, **kwargs: bool) -> torch.Tensor:
        return self.fc(x) * (2.0 if kwargs.get("double") else 1.0)


def test_a_flag_that_goes_to_the_modules_kwargs_is_captured_static_and_said_so():
    """torch.export refuses every shape specification where a non-tensor keyword lands in
    **kwargs (Hugging Face's output_hidden_states=True: 'Must provide a tree_name'), so the
    default batch dimension failed the capture; it is captured static, with the reason."""
    model, x = _Flagged(), torch.randn(4, 8)
    with pytest.warns(StaticShapeWarning, match=r"input x \(size 4\) stays static.*\*\*kwargs"):
        converted, _ = gfx.convert(model, example_kwargs={"x": x, "double": True})
    assert torch.allclose(converted(x=x, double=True).float(), model(x, double=True), atol=0.05)


def test_a_module_in_training_mode_with_dropout_or_batch_norm_is_warned_about():
    """nn.Module starts in training mode; converted so, the module drops and updates batch
    norm statistics at every call, and torch.export's modules refuse .eval() afterwards."""
    model, x = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1), nn.BatchNorm1d(8)), torch.randn(4, 8)
    with pytest.warns(ModeWarning, match=r"^'1' \(Dropout\) is in training mode"):
        gfx.convert(model, (x,))
    model.eval()
    model[1].train()  # the submodule's own mode counts: it drops, the model in eval mode
    with pytest.warns(ModeWarning, match=r"^'1' \(Dropout\) is in training mode"):
        gfx.convert(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModeWarning)
        gfx.convert(model.eval(), (x,))
        gfx.convert(nn.Sequential(nn.Linear(8, 8)), (x,))  # nothing that depends on the mode
        model.train()
        model[1].eval(), model[2].eval()  # the model trains, its dropout and norm do not
        gfx.convert(model, (x,))
        model.eval()
        model.train()
        step = gfx.train_step(model, nn.functional.mse_loss, torch.optim.SGD(
            model.parameters(), lr=0.1))  # fmt: skip
        step(x, torch.randn(4, 8))  # a training step trains in training mode: no warning


def test_an_empty_value_does_not_promote_what_it_is_concatenated_with():
    """A KV cache's first value is an empty tensor made in the model's float32 (eager autocast
    makes it in the low type of the first keys): concatenated with the low values, it made the
    whole cache float32, twice autocast's memory."""

    class Cache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            empty = torch.zeros(0, 8, device=x.device)
            return torch.cat([empty, self.fc(x)])

    model, x = Cache(), torch.randn(4, 8)
    converted, plan = gfx.convert(model, (x,))
    assert plan.nodes["cat"].precision == "bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model.fc(x)
    assert converted(x).dtype == torch.bfloat16 and torch.equal(converted(x), expected)


def test_a_capture_that_fails_on_a_shape_prints_no_traceback():
    """torch's fake tensors log the meta kernel's traceback at ERROR before export raises:
    a dozen lines on stderr above graphamp's one. (In a process of its own: torch's log
    handler writes to the stderr it found when it was configured.)"""
    import subprocess
    import sys

    code = (
        "import torch, graphamp.fx as g\n"
        "try:\n    g.convert(torch.nn.Linear(16, 4), (torch.randn(2, 7),))\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("GraphampError Linear: torch.export could not capture it")
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["einsum", "lstm", "rnn"])
def test_ops_eager_autocast_runs_low_through_their_parts_run_low(kind):
    """einsum, LSTM and RNN are in none of CPU autocast's lists, but eager autocast runs them
    low as what they call (bmm, mkldnn_rnn_layer): captured whole, they stayed float32."""

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = (nn.LSTM if kind == "lstm" else nn.RNN)(8, 16, batch_first=True)

        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            if kind == "einsum":
                return torch.einsum("bsd,de->bse", x, w)
            return self.rnn(x)[0]

    torch.manual_seed(0)
    model, x, w = Model().eval(), torch.randn(2, 5, 8), torch.randn(8, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch.export on RNN's _flat_weights
        converted, plan = gfx.convert(model, (x, w))
    op = {"einsum": "einsum", "lstm": "lstm", "rnn": "rnn_tanh"}[kind]
    assert {d.precision for d in plan.nodes.values() if d.op == op} == {"bfloat16"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x, w)
    assert torch.equal(converted(x, w), expected)


def test_a_calibration_batch_of_a_size_the_capture_fixed_is_one_line():
    """A sequence length the module fixes (a positional table added to the embeddings): the
    batch failed torch's guard with a raw AssertionError and the graph's trace."""

    class Positions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.positions = nn.Embedding(100, 16), nn.Parameter(torch.randn(10, 16))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embed(ids) + self.positions

    ids = torch.randint(0, 100, (2, 10))
    with pytest.raises(GraphampError) as caught:
        gfx.convert(Positions(), (ids,), calibrate=[(torch.randint(0, 100, (2, 12)),)])
    message = str(caught.value)
    assert message.startswith("calibrate: batch 0 (ids [2, 12]) does not fit the captured")
    assert "ids.size()[1] == 10" in message and "\n" not in message


def test_a_norm_reading_a_low_value_with_float32_parameters_keeps_the_low_type():
    """PyTorch's CPU layer_norm and group_norm take a bfloat16 input with float32 parameters
    and write bfloat16: they do not promote as a linear does. Read as float32, the norm's
    input was cast up and its output, still recorded as bfloat16, reached the next op
    uncast ('Tensor dtype mismatch')."""

    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.group = nn.LayerNorm(8), nn.GroupNorm(2, 4)
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.group(self.layer(x).unflatten(-1, (4, 2))).flatten(-2)
            return self.fc(h.float()).relu()

    model, x = Norms().eval(), torch.randn(3, 8).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KeptWarning)
        converted, plan = gfx.convert(model, (x,))
    assert plan.nodes["layer/layer_norm"].precision == "bfloat16"
    assert torch.equal(converted(x), model(x))


class NormsAfterConv(nn.Module):
    """Norms reading a convolution's low output (ConvNeXt's channels-last LayerNorm, a UNet's
    GroupNorm, an RMSNorm), each with float32 weights, and elementwise ops after them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.group = nn.GroupNorm(4, 16)
        self.layer = nn.LayerNorm(16)
        self.rms = nn.RMSNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group(self.conv(x)).permute(0, 2, 3, 1)
        y = nn.functional.silu(self.layer(y)) + self.rms(y)
        return self.head(y).mean(dim=(1, 2)) + y.mean(dim=(1, 2))[:, :4]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_norm_reading_a_low_value_keeps_float32_weights_and_runs_low_as_under_autocast(dtype):
    """PyTorch's layer_norm, group_norm and rms_norm take a low input with float32 weight and
    bias and write the input's type; the weights promoted them to float32, so every op after
    them ran float32 where autocast runs them low."""
    torch.manual_seed(0)
    model, x = NormsAfterConv().eval(), torch.randn(2, 8, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # rms_norm's mixed types: no fused kernel
        converted, plan = gfx.convert(model, (x,), dtype=dtype)
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            expected = model(x)
        got = converted(x)
    norms = [d for d in plan.nodes.values() if d.op in ("group_norm", "layer_norm", "rms_norm")]
    assert len(norms) == 3 and {d.precision for d in norms} == {dtype}
    assert all("float32 parameters" in d.reason for d in norms)
    assert {d.precision for d in plan.nodes.values() if d.op in ("silu", "add")} == {dtype}
    norm_params = ("group.", "layer.", "rms.")
    assert not [c for c in plan.casts if c.tensor.startswith(norm_params)]  # read as they are
    assert torch.equal(got, expected)


class MovesAndCompares(nn.Module):
    """Swin's shifted windows (roll), a gather by index, top-k, a comparison and a 1-d pool
    after a linear: none in CPU autocast's lists, so eager autocast runs them low."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        y = torch.roll(self.linear(x), shifts=1, dims=1)[:, index]
        top = y.topk(4, dim=-1).values
        pooled = nn.functional.adaptive_avg_pool1d(y.transpose(1, 2), 2).flatten(1)
        return torch.where(top > top.mean(), top, -top).sum(-1) + pooled.sum(-1, keepdim=True)


def test_ops_that_move_or_compare_values_run_low_as_under_autocast():
    """They stayed float32 as unlisted: a Cast up before each, float32 after (more memory, no
    value changed); now they follow their input as autocast runs them, with its bits."""
    torch.manual_seed(0)
    model, x, index = MovesAndCompares().eval(), torch.randn(2, 6, 8), torch.tensor([0, 2, 3])
    converted, plan = gfx.convert(model, (x, index))
    ops = ("roll", "index", "topk", "gt", "adaptive_avg_pool1d")
    assert {d.precision for d in plan.nodes.values() if d.op in ops} == {"bfloat16"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x, index)
    assert torch.equal(converted(x, index), expected)


def test_an_input_named_like_an_op_keeps_its_own_name():
    """A forward argument called ``index`` read by the aten.index op: both were named 'index'
    in the OpGraph, and writing the casts failed (IndexError) or read the op for the input."""

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, index: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
            return self.linear(x)[:, index] + add

    torch.manual_seed(0)
    model, x = Model().eval(), torch.randn(2, 6, 8)
    index, add = torch.tensor([0, 2]), torch.randn(2, 2, 8)
    converted, plan = gfx.convert(model, (x, index, add))
    assert {"index_1", "add_1"} <= set(plan.nodes) and not {"index", "add"} & set(plan.nodes)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x, index, add)
    assert torch.equal(converted(x, index, add), expected)
