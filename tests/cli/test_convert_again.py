"""A converted model converted again keeps its decisions (the kept pass, issue 39): whatever
kept an op float32 the first time (calibration data, tune, a name or tensor rule, a reviewed
plan, the lists), ``convert(convert(m, flags), flags)`` is byte for byte ``convert(m, flags)``,
in both dialects; ``--allow-name`` is the way to lower such an op."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from graphamp.cli import main
from graphamp.plans.plan import Plan
from tests.helpers import ZOO_NAMES, chain, conv_net, embedding_model
from tests.numerics import numerics_models as planted

LOW = ("float16", "bfloat16")
OVERFLOWING = ("hidden", "relu", "down")  # what calibration keeps float32 (rule range)


@pytest.fixture()
def overflow(tmp_path: Path) -> tuple[Path, Path]:
    """The model whose hidden layer overflows float16 on the data, and that data."""
    source, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(planted.overflowing_hidden_layer(), str(source))
    np.savez(data, x=np.concatenate([batch["x"] for batch in planted.batches(3)]))
    return source, data


def convert(source: Path, target: Path, *flags: str) -> Plan:
    plan = target.with_suffix(".plan.json")
    assert main(["convert", str(source), "-o", str(target), "--plan", str(plan), *flags]) == 0
    return Plan.load(plan)


def test_a_calibrated_model_keeps_its_overflowing_ops_float32(overflow, tmp_path, capsys):
    source, data = overflow
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    first = convert(source, once, "--calibrate", str(data))
    assert {n for n, d in first.nodes.items() if d.rule == "range"} == set(OVERFLOWING)
    for flags in ((), ("--calibrate", str(data))):
        again = convert(once, twice, *flags)
        assert twice.read_bytes() == once.read_bytes(), flags
        # calibrated again, the overflowing ops are range's
        rule = "range" if flags else "kept"
        assert {n: again.nodes[n].rule for n in OVERFLOWING} == dict.fromkeys(OVERFLOWING, rule)
        assert again.nodes["sum"].rule == "already_low"  # a tie the first run put low
    # the float32 region reads x beside the model's Cast of x to float16 and ends in a Cast
    reason = convert(once, twice).nodes["hidden"].reason
    assert "between the input model's own Casts to and from float16" in reason
    assert "('x__float16', 'a__float16')" in reason and "--allow-name" in reason
    err = capsys.readouterr().err
    assert "float32 ops it keeps stay float32 (rule kept; --allow-name lowers one)" in err
    # the model converted again still verifies on the data: no overflow came back
    argv = ["convert", str(once), "-o", str(twice), "--verify", "--inputs", str(data)]
    assert main(argv) == 0


def test_allow_name_lowers_a_kept_op(overflow, tmp_path):
    source, data = overflow
    once = tmp_path / "once.onnx"
    convert(source, once, "--calibrate", str(data))
    again = convert(once, tmp_path / "twice.onnx", "--allow-name", "down")
    assert again.nodes["down"].precision == "float16" and again.nodes["down"].rule == "allow_name"
    assert again.nodes["hidden"].rule == "kept"


def test_a_tuned_model_keeps_what_tune_kept(tmp_path, capsys):
    source, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(planted.cancellation_beside_a_healthy_branch(), str(source))
    np.savez(data, x=np.concatenate([batch["x"] for batch in planted.batches(3)]))
    tuned, twice = tmp_path / "tuned.onnx", tmp_path / "twice.onnx"
    flags = ("--spread", "tensorflow")
    argv = ["tune", str(source), "-o", str(tuned), "--inputs", str(data), "--rtol", "0.01"]
    assert main([*argv, *flags]) == 0
    assert 'deny_names = ["cancel"]' in capsys.readouterr().out
    for again_flags in (flags, ()):  # the tune's flags, and the default spread
        again = convert(tuned, twice, *again_flags)
        assert twice.read_bytes() == tuned.read_bytes()
        assert again.nodes["cancel"].rule == "kept"
    argv = ["convert", str(tuned), "-o", str(twice), "--verify", "--inputs", str(data)]
    assert main([*argv, "--rtol", "0.01"]) == 0


def test_a_reviewed_plan_stays_decided(tmp_path):
    source, reviewed = tmp_path / "m.onnx", tmp_path / "reviewed.json"
    onnx.save(chain(["MatMul", "Relu", "MatMul", "Add", "MatMul"]), str(source))
    assert (
        main(
            ["plan", str(source), "--deny-name", "matmul2", "--format", "json", "-o", str(reviewed)]
        )
        == 0
    )
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    first = convert(source, once, "--from-plan", str(reviewed))
    assert first.nodes["matmul2"].precision == "float32"
    again = convert(once, twice)
    assert twice.read_bytes() == once.read_bytes()
    assert again.nodes["matmul2"].rule == "kept"


def _names(proto: onnx.ModelProto) -> tuple[str, str]:
    """A matrix op's node name to deny, and another one's output to deny as a tensor."""
    matrix = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    return matrix[0].name, matrix[-1].output[0]


FLAG_SETS = {
    "defaults": (),
    "deny-name": ("--deny-name", "{node}"),
    "deny-tensor": ("--deny-tensor", "{tensor}"),
    "keep-io-types": ("--keep-io-types",),
    "bfloat16": ("--dtype", "bfloat16", "--deny-name", "{node}"),
    "tensorflow": ("--spread", "tensorflow", "--deny-tensor", "{tensor}"),
    "all": ("--spread", "all", "--keep-io-types", "--deny-name", "{node}"),
}
HAND_BUILT = {
    "chain": lambda: chain(["MatMul", "Relu", "Softmax", "MatMul", "Add", "Sin", "MatMul"]),
    "conv_net": conv_net,
    "embedding": embedding_model,
}


def _twice_is_once(source: Path, tmp_path: Path, flags: tuple[str, ...]) -> None:
    node, tensor = _names(onnx.load(str(source)))
    flags = tuple(flag.format(node=node, tensor=tensor) for flag in flags)
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    first = convert(source, once, *flags)
    kept = [n for n, d in first.nodes.items() if d.precision == "float32"]
    # with the same flags, and with none (a name rule the second run does not repeat) where
    # the first put an op low (a model with none is the float32 model: decided as always)
    low = any(d.rule != "already_low" and d.precision in LOW for d in first.nodes.values())
    for again_flags in (flags, ()) if low else (flags,):
        again = convert(once, twice, *again_flags)
        assert twice.read_bytes() == once.read_bytes(), again_flags
        assert again.summary()["casts_inserted"] == 0 and not again.weights
        assert {again.nodes[name].precision for name in kept} <= {"float32"}
    if "--deny-name" in flags and first.nodes[node].precision == "float32":
        assert again.nodes[node].rule == "kept"  # a decision the lists alone would undo


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
@pytest.mark.parametrize("name", HAND_BUILT)
def test_hand_built_models_convert_again_to_the_same_bytes(tmp_path, name, flags):
    source = tmp_path / "m.onnx"
    onnx.save(HAND_BUILT[name](), str(source))
    _twice_is_once(source, tmp_path, flags)


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_models_convert_again_to_the_same_bytes(zoo_model, tmp_path, name, flags):
    _twice_is_once(zoo_model(name), tmp_path, flags)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags", [(), ("--deny-name", "layers.0.attention*"), ("--dtype", "float16")]
)
def test_a_pt2_program_converts_again_to_the_same_bytes(tmp_path, flags):
    torch = pytest.importorskip("torch")
    from graphamp.models import build

    model, inputs = build("bert", "small")
    source, once, twice = (tmp_path / f"{name}.pt2" for name in ("m", "once", "twice"))
    torch.export.save(torch.export.export(model, inputs), str(source))
    first = convert(source, once, *flags)
    for again_flags in (flags, ()):
        again = convert(once, twice, *again_flags)
        assert twice.read_bytes() == once.read_bytes()
    if flags[:1] == ("--deny-name",):  # the second run without the rule: kept
        denied = [n for n, d in first.nodes.items() if d.rule == "deny_name"]
        assert denied and {again.nodes[n].rule for n in denied if n in again.nodes} == {"kept"}


@pytest.mark.slow
def test_an_fx_module_converted_again_keeps_its_precisions():
    pytest.importorskip("torch")
    import graphamp.fx as gfx
    from graphamp.models import build

    model, inputs = build("gpt", "small")
    converted, first = gfx.convert(model, inputs, deny_names=["layers.1.*"])
    _, again = gfx.convert(converted, inputs)
    assert again.casts == [] and again.weights == []
    shared = set(first.nodes) & set(again.nodes)
    assert len(shared) > len(first.nodes) // 2
    assert {n: first.nodes[n].precision for n in shared} == {
        n: again.nodes[n].precision for n in shared
    }
    assert {again.nodes[n].rule for n in shared if first.nodes[n].rule == "deny_name"} == {"kept"}


def test_keep_io_types_on_inputs_already_low_says_it_widens_nothing(tmp_path, capsys):
    """A converted model's float16 inputs and outputs are the model's types: --keep-io-types
    keeps them, silently once, as if the flag had been applied."""
    from graphamp.cli import main
    from tests.helpers import chain

    source, once, again = tmp_path / "m.onnx", tmp_path / "once.onnx", tmp_path / "again.onnx"
    onnx.save(chain(["MatMul", "Relu", "MatMul"]), str(source))
    assert main(["convert", str(source), "-o", str(once)]) == 0  # float16 inputs and outputs
    capsys.readouterr()
    assert main(["convert", str(once), "-o", str(again), "--keep-io-types"]) == 0
    assert (
        "keep_io_types (--keep-io-types, --keep-io) keeps the model's own input and output "
        "types, and 'x', 'y' are already float16 in the model: nothing widens them to float32"
    ) in capsys.readouterr().err
