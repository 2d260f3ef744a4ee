"""tune decides with the pipeline convert runs: its baseline (no node kept) is convert's plan,
on the zoo's models under every spread and on GPT-2 as torch.onnx exports it, whose tanh-GELU
the saturation pass lets run low (a tune that kept its own list of deciding passes, without
that pass, kept those nodes float32 in its baseline, so its search could never keep them)."""

from __future__ import annotations

import warnings

import pytest
import torch

from graphamp import engine
from graphamp.core.vocab import Rule
from graphamp.models import ZOO, export_onnx
from graphamp.onnx.dialect.plugin import OnnxDialect
from graphamp.onnx.numerics.tuning import Decider
from graphamp.passes.options import Options
from graphamp.policy.policy import SPREADS, Policy
from tests.hf_models import hf_model


def low_in_plan_and_baseline(path: object, policy: Policy) -> tuple[set[str], set[str]]:
    analysis = engine.analyse(path, policy, dialect=OnnxDialect())
    planned = {n for n, d in analysis.plan.nodes.items() if d.precision == policy.dtype}
    baseline = Decider(analysis, policy, Options())(frozenset())
    return planned, set(baseline)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("zoo")
    return {name: export_onnx(name, folder / f"{name}.onnx", "small") for name in ZOO}


@pytest.mark.parametrize("spread", SPREADS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tunes_baseline_is_converts_plan_on_the_zoo(zoo, dtype, spread):
    for name, path in zoo.items():
        policy = Policy.create(dtype, spread=spread)
        planned, baseline = low_in_plan_and_baseline(path, policy)
        assert planned, name
        assert baseline == planned, (name, sorted(baseline ^ planned))


@pytest.mark.slow
def test_tunes_baseline_is_converts_plan_on_an_exported_tanh_gelu(tmp_path):
    path = tmp_path / "gpt2.onnx"
    ids = torch.randint(1, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            hf_model("gpt2"), (ids,), dynamo=True, opset_version=18, verbose=False
        )
    program.save(str(path))
    policy = Policy.create("float16")
    analysis = engine.analyse(path, policy, dialect=OnnxDialect())
    saturating = [  # x**3 on the deny list, moved by the saturation pass: one per layer
        n
        for n, d in analysis.plan.nodes.items()
        if d.op == "Pow" and d.rule is Rule.INFER and "saturating op" in d.reason
    ]
    assert len(saturating) == 2
    planned, baseline = low_in_plan_and_baseline(path, policy)
    assert set(saturating) <= planned
    assert baseline == planned, sorted(baseline ^ planned)
