"""Hugging Face models as they come (default configs: caches on, keyword inputs), converted
once and run at other batch sizes: error no worse than 1.25x torch.autocast's, the same output
structure (a ModelOutput holding the same kind of cache), saved and loaded as a .pt2 program."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import transformers

import graphamp.fx as gfx
from tests.fx.recording import matrix_dtypes
from tests.hf_models import VOCAB, as_they_come

pytestmark = pytest.mark.slow


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value.float() - reference).abs().max() / reference.abs().max())


def cache_tensors(cache: object) -> list[torch.Tensor]:
    """A cache's tensors in a fixed order (the pytree leaves graphamp registers)."""
    return [t for t in torch.utils._pytree.tree_leaves(cache) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", ["llama", "mistral", "t5", "whisper", "vit"])
def test_as_they_come_error_no_worse_than_autocast_at_every_batch(name):
    model, make = as_they_come(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, _ = gfx.convert(model, example_kwargs=make(2))
    for batch in (2, 3):
        inputs = make(batch)
        with torch.no_grad():
            reference = model(**inputs)
            ours = converted(**inputs)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                theirs = model(**inputs)
        assert type(ours) is type(reference) and list(ours.keys()) == list(reference.keys())
        expected = reference.last_hidden_state
        our_error = relative_error(ours.last_hidden_state, expected)
        autocast_error = relative_error(theirs.last_hidden_state, expected)
        assert 0 < our_error <= 1.25 * autocast_error + 1e-6, (batch, our_error, autocast_error)
        cache = getattr(reference, "cache", None)
        assert type(getattr(ours, "cache", None)) is type(cache)
        for got, want in zip(
            cache_tensors(getattr(ours, "cache", None)), cache_tensors(cache), strict=True
        ):
            assert got.shape == want.shape and relative_error(got, want) < 5e-2
    inputs = make(2)
    ours_types = matrix_dtypes(lambda: converted(**inputs))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_types = matrix_dtypes(lambda: model(**inputs))
    assert ours_types == autocast_types and torch.bfloat16 in ours_types


def test_a_static_cache_passed_in_is_updated_as_the_model_updates_it():
    model, make = as_they_come("llama")

    def static_cache() -> transformers.StaticCache:
        cache = transformers.StaticCache(model.config, max_cache_len=32)
        cache.early_initialization(
            batch_size=2, num_heads=2, head_dim=16, dtype=torch.float32, device="cpu"
        )
        return cache

    ids = make(2)["input_ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, _ = gfx.convert(
            model, (ids,), example_kwargs={"cache": static_cache(), "use_cache": True}
        )
    with torch.no_grad():
        reference = model(ids, cache=static_cache(), use_cache=True)
        ours = converted(ids, cache=static_cache(), use_cache=True)
    assert isinstance(ours.cache, transformers.StaticCache)
    layer, expected = ours.cache.layers[0], reference.cache.layers[0]
    assert int(layer.cumulative_length) == int(expected.cumulative_length) == ids.shape[1]
    assert relative_error(layer.values, expected.values) < 5e-2
    assert relative_error(ours.last_hidden_state, reference.last_hidden_state) < 5e-2


def test_one_decoding_step_with_the_cache_as_input():
    model, make = as_they_come("mistral")
    prompt, step = make(2)["input_ids"], torch.randint(1, VOCAB, (2, 1))
    with torch.no_grad():
        past = model(prompt).cache
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, _ = gfx.convert(model, (step,), example_kwargs={"cache": past})
    with torch.no_grad():
        reference = model(step, cache=model(prompt).cache)
        ours = converted(step, cache=model(prompt).cache)
    assert relative_error(ours.last_hidden_state, reference.last_hidden_state) < 5e-2
    assert cache_tensors(ours.cache)[0].shape[2] == prompt.shape[1] + 1


def test_saved_with_its_cache_and_loaded_in_a_fresh_process(tmp_path):
    model, make = as_they_come("t5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, plan = gfx.convert(model, example_kwargs=make(2))
    path = tmp_path / "t5.pt2"
    gfx.save(converted, path)
    inputs = make(3)
    torch.save(inputs, tmp_path / "inputs.pt")
    with torch.no_grad():
        expected = converted(**inputs)
    torch.save(
        [*cache_tensors(expected.cache), expected.last_hidden_state], tmp_path / "expected.pt"
    )
    # a fresh process: graphamp's reader registers the caches the program's outputs hold
    script = f"""
import torch, graphamp.fx as gfx
module, plan = gfx.load({str(path)!r})
inputs = torch.load({str(tmp_path / "inputs.pt")!r})
with torch.no_grad():
    out = module(**inputs)
expected = torch.load({str(tmp_path / "expected.pt")!r})
leaves = [t for t in torch.utils._pytree.tree_leaves(out.cache) if isinstance(t, torch.Tensor)]
assert type(out.cache).__name__ == "EncoderDecoderCache", type(out.cache)
assert all(torch.equal(a, b) for a, b in zip(leaves + [out.last_hidden_state], expected))
print(len(plan.nodes))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) == len(plan.nodes)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_decoders_saved_load_in_both_readers_and_save_again(name, tmp_path):
    """Mistral's masks are tensor constants the first export lifts into its layers; exporting
    the converted module again named two of them alike, and neither reader could load it."""
    model, make = as_they_come(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, plan = gfx.convert(model, example_kwargs=make(2))
        gfx.save(converted, tmp_path / "m.pt2")
        module, saved_plan = gfx.load(tmp_path / "m.pt2")
        program = torch.export.load(tmp_path / "m.pt2").module()
        gfx.save(module, tmp_path / "again.pt2")  # a loaded program holds the renamed ones
        again, _ = gfx.load(tmp_path / "again.pt2")
    inputs = make(3)
    with torch.no_grad():
        ours = converted(**inputs).last_hidden_state
        outputs = [m(**inputs).last_hidden_state for m in (module, program, again)]
    assert all(torch.equal(ours, out) for out in outputs)
    assert saved_plan is not None and saved_plan.to_json() == plan.to_json()
