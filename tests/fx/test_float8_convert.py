"""``graphamp.fx.convert(..., fp8=...)`` for inference (issue 41): float8 layers against
torchao's Float8Linear forward (current scaling) and a transcription of static scaling, bit
for bit; accuracy against float32; .pt2 files; torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphamp
import graphamp.fx as gfx
from graphamp.fx.dialect import float8
from tests.training import float8_reference as reference


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny products: a second thread costs more than it does (see test_float8_step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32)
    ).eval()


def inputs(count: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(8, 64, generator=generator) for _ in range(count)]


def relative_error(y: torch.Tensor, reference_y: torch.Tensor) -> float:
    return float((y.float() - reference_y).abs().max() / reference_y.abs().max())


@pytest.mark.parametrize("granularity, recipe", [("tensor", "tensorwise"), ("row", "rowwise")])
def test_current_scaling_equals_torchaos_forward(granularity, recipe):
    from torchao.float8.config import Float8LinearConfig

    x = inputs(1, 1)[0]
    settings = graphamp.Float8.current(granularity=granularity, sizes="none")
    module, plan = gfx.convert(mlp(), (x,), fp8=settings, dynamic_shapes="static")
    chosen = {name for name, d in plan.fp8.items() if d.rule == "fp8"}
    assert chosen == {"0/linear", "2/linear"}  # the last layer kept (keep_last)
    assert plan.fp8["4/linear"].rule == "fp8_deny"
    config = Float8LinearConfig.from_recipe_name(recipe)
    eager = reference.swap_layers(mlp(), (x,), chosen, reference.torchao_layer(config))
    for batch in inputs(3, 2):
        with torch.no_grad():
            assert torch.equal(module(batch), eager(batch))
    # the weights are stored in float8, the float32 ones gone where only float8 reads them
    stored = dict(module.named_buffers())
    assert stored["0_weight_float8"].dtype == torch.float8_e4m3fn
    assert "0.weight" not in dict(module.named_parameters())
    assert "4.weight" in dict(module.named_parameters())


def test_static_scaling_from_calibration():
    """Activation scales from the calibration batches' max |x| with a binade of headroom (per
    tensor, expanded to the rows), weights per output channel: the module equals that
    arithmetic written out."""
    model, batches = mlp(), [(x,) for x in inputs(4, 3)]
    x = inputs(1, 4)[0]
    settings = graphamp.Float8.static()
    module, plan = gfx.convert(model, (x,), fp8=settings, calibrate=batches)
    records = {r.tensor: r for r in plan.scales}
    first = records[plan.fp8["0/linear"].operands[0]]
    assert first.source == "calibration" and first.detail["batches"] == 4
    amax = max(float(b[0].abs().max()) for b in batches)
    assert first.detail["amax"] == pytest.approx(amax, rel=1e-6)
    assert records["0.weight"].granularity == "channel" and records["0.weight"].source == "weight"

    def written_out(layer: nn.Linear, value: torch.Tensor, calibrated: float) -> torch.Tensor:
        headroom = calibrated * 2.0  # Float8.static()'s margin: one binade
        scale = (448.0 / torch.tensor(headroom, dtype=torch.float64)).float()
        q = torch.clamp(value.bfloat16().float() * scale, -448, 448).to(torch.float8_e4m3fn)
        w_scale = (448.0 / layer.weight.abs().amax(1, keepdim=True).double()).float()
        w = torch.clamp(layer.weight.float() * w_scale, -448, 448).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(
            q,
            w.t(),
            scale.expand(len(q), 1).contiguous().reciprocal(),
            w_scale.t().reciprocal(),
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )
        return out + layer.bias.bfloat16()

    with torch.no_grad():
        hidden = written_out(model[0], x, first.detail["amax"])
        gelu = nn.functional.gelu(hidden)
        second = records[plan.fp8["2/linear"].operands[0]].detail["amax"]
        hidden = written_out(model[2], gelu, second)
        expected = nn.functional.linear(
            torch.relu(hidden), model[4].weight.bfloat16(), model[4].bias.bfloat16()
        )
        assert torch.equal(module(x), expected)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [graphamp.Float8.current(sizes="none"), graphamp.Float8.current("row", sizes="none")],
    ids=["tensor", "row"],
)
def test_accuracy_against_float32_and_pt2_files(tmp_path, settings):
    """Max error relative to max |y| on held-out batches, for the zoo's GPT (small): float8
    within 5e-2 (bfloat16 alone: under 1e-2), and the .pt2 file gives the same outputs."""
    from graphamp.models import build

    model, (ids,) = build("gpt", "small")
    module, plan = gfx.convert(model, (ids,), fp8=settings)
    assert sum(d.rule == "fp8" for d in plan.fp8.values()) == 12
    low, _ = gfx.convert(model, (ids,))
    generator = torch.Generator().manual_seed(5)
    held_out = [torch.randint(1, 128, (2, 16), generator=generator) for _ in range(3)]
    with torch.no_grad():
        errors = [relative_error(module(b), model(b)) for b in held_out]
        low_errors = [relative_error(low(b), model(b)) for b in held_out]
    assert max(errors) <= 5e-2 and max(low_errors) <= 1e-2, (errors, low_errors)
    assert max(errors) > max(low_errors)  # float8 is the coarser of the two
    gfx.save(module, tmp_path / "gpt.fp8.pt2")
    loaded, loaded_plan = gfx.load(tmp_path / "gpt.fp8.pt2")
    assert loaded_plan is not None and loaded_plan.fp8 == plan.fp8
    assert any(b.dtype == torch.float8_e4m3fn for b in loaded.buffers())
    with torch.no_grad():
        for batch in held_out:
            assert torch.equal(loaded(batch), module(batch))


def test_quantised_weight_is_what_a_step_would_use():
    """A weight quantised at conversion equals the quantiser run on it (per tensor)."""
    weight = torch.randn(32, 16)
    stored, scale = graphamp.fx.dialect.float8_convert.quantised_weight(weight, False, False)
    assert torch.equal(
        stored,
        float8.quantize(weight, float8.scale_of(float8.amax(weight, None), "e4m3fn"), "e4m3fn"),
    )
    assert scale.shape == ()


def test_static_scaling_keeps_a_layer_whose_activation_would_flush_to_zero():
    """Calibration records the binade histogram of each value a matrix op reads: an input
    whose values are mostly 1e-3 next to a few of 300 would mostly flush to zero at the scale
    its largest value sets, so its layer keeps the low type (rule fp8_range)."""
    tiny = [(torch.randn(8, 64) * 1e-3,) for _ in range(3)]
    spiked = torch.cat([torch.full((1, 64), 300.0), torch.randn(7, 64) * 1e-3])
    x = inputs(1, 6)[0]
    module, plan = gfx.convert(
        mlp(), (x,), fp8=graphamp.Float8.static(), calibrate=[*tiny, (spiked,)]
    )
    assert plan.fp8["0/linear"].rule == "fp8_range"
    assert "flush to zero" in plan.fp8["0/linear"].reason
    assert not any(b.dtype == torch.float8_e4m3fn for b in module.buffers())
    # calibrated on ordinary data, the same layer takes float8
    _, ordinary = gfx.convert(mlp(), (x,), fp8=graphamp.Float8.static(), calibrate=[(x,)])
    assert ordinary.fp8["0/linear"].rule == "fp8"


class Products(nn.Module):
    """``x @ W.T`` (a layer written as a product) and ``h @ V`` (a weight not transposed)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(32, 64) * 0.1)
        self.v = nn.Parameter(torch.randn(32, 16) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w.t()) @ self.v


def test_a_product_with_a_transposed_weight_is_a_layer_and_others_are_said_to_stay():
    x = inputs(1, 7)[0]
    settings = graphamp.Float8.current(sizes="none", keep_last=False)
    with pytest.warns(graphamp.Float8Warning, match="'matmul_1': kept bfloat16"):
        module, plan = gfx.convert(Products(), (x,), fp8=settings)
    assert plan.fp8["matmul"].rule == "fp8"
    kept = plan.fp8["matmul_1"]
    assert kept.rule == "fp8_deny" and "x @ W.T products" in kept.reason
    assert all("matmul_1" not in record.consumers for record in plan.scales)
    # x @ W.T runs as the linear layer of W would
    linear = nn.Linear(64, 32, bias=False)
    linear.weight = Products().w
    as_layer, _ = gfx.convert(nn.Sequential(linear), (x,), fp8=settings)
    with torch.no_grad():
        hidden = torch.relu(as_layer(x))
        expected = (hidden @ Products().v.bfloat16()).bfloat16()
        assert torch.equal(module(x), expected)


def test_static_scaling_takes_x_at_w_t_whose_weight_is_a_traced_parameter():
    """ONNX keeps a weight computed at run time (an unfolded Transpose) out of static float8;
    FX quantises the parameter behind the transpose, so ``x @ W.T`` is chosen and runs as
    the static float8 linear layer of W."""
    x = inputs(1, 7)[0]
    settings = graphamp.Float8.static(keep_last=False)
    with pytest.warns(graphamp.Float8Warning, match="'matmul_1'"):
        module, plan = gfx.convert(Products(), (x,), fp8=settings, calibrate=[(x,)])
    assert plan.fp8["matmul"].rule == "fp8", plan.fp8["matmul"].reason
    linear = nn.Linear(64, 32, bias=False)
    linear.weight = Products().w
    as_layer, _ = gfx.convert(nn.Sequential(linear), (x,), fp8=settings, calibrate=[(x,)])
    with torch.no_grad():
        expected = (torch.relu(as_layer(x)) @ Products().v.bfloat16()).bfloat16()
        assert torch.equal(module(x), expected)


def test_attention_is_kept_for_its_activation_operands_not_for_unknown_shapes():
    """scaled_dot_product_attention (and ONNX's Attention) multiply activations by
    activations: rule fp8_operands, as float8.md says; the plans filed them as fp8_shape,
    "its matrix dimensions are unknown"."""

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(64, 192)
            self.out = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).view(2, 8, 3, 4, 16).permute(2, 0, 3, 1, 4)
            mixed = nn.functional.scaled_dot_product_attention(q, k, v)
            return self.out(mixed.transpose(1, 2).reshape(2, 8, 64))

    x = torch.randn(2, 8, 64)
    settings = graphamp.Float8.current(sizes="none", keep_last=False)
    _, plan = gfx.convert(Attention().eval(), (x,), fp8=settings)
    attention = plan.fp8["scaled_dot_product_attention"]
    assert attention.rule == "fp8_operands" and "activations" in attention.reason
    assert plan.fp8["qkv/linear"].rule == plan.fp8["out/linear"].rule == "fp8"
