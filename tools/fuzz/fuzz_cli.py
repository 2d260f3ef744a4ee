"""The command-line mutation fuzzer (``python tools/fuzz/fuzz.py --cli``).

Seed by seed, one damaged file goes through ``graphamp.cli.main`` in-process:

* a model's bytes damaged at random: truncated, bits flipped, bytes deleted or repeated;
* a model with targeted defects, one to three of the kinds a validator must know (a dangling
  or own or later input, a value produced twice, short or long tensor data, an element type
  that is none, dims that lie, opsets and IR versions out of range, a domain not imported, an
  op renamed, attributes untyped, mistyped, unknown or missing, a graph input retyped or
  untyped, external data outside the folder or missing or short, a string that is not UTF-8,
  a node removed);
* a plan file (``--from-plan``, ``explain``, ``diff``) or a policy file (``--config``) whose
  JSON or TOML values are replaced, deleted or added at random;
* a command whose output is a file it reads (by path, symbolic or hard link), two outputs
  naming one file, an input it may not read or an output folder it may not write
  (``tools/fuzz/fuzz_files.py``): one line, exit 2, no file changed.

The command must exit 0, 1 or 2 (never 3, an internal error, nor a crash), print no traceback,
say one line when it refuses, and write no output after a failure; and when it converts a model
the input onnx's checker accepts, the output must pass the checker too. ``outcomes`` counts
what happened, so a run shows how many damaged files were refused and how many converted.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from fuzz_graphs import random_case

outcomes: Counter[str] = Counter()
accepted_invalid: list[int] = []  # seeds: converted (their output valid), worth a look
T = onnx.TensorProto


def mutated(seed: int) -> bytes:
    """A valid model's bytes, damaged at random."""
    rng = np.random.default_rng(seed)
    data = bytearray(random_case(seed).model.SerializeToString())
    kind = int(rng.integers(4))
    at = int(rng.integers(len(data)))
    if kind == 0:
        return bytes(data[:at])  # truncated
    if kind == 1:
        for _ in range(int(rng.integers(1, 8))):
            data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
        return bytes(data)
    if kind == 2:
        return bytes(data[:at] + data[at + int(rng.integers(1, 16)) :])  # bytes deleted
    return bytes(data[:at] + data[at : at + 16] + data[at:])  # bytes repeated


Defect = Callable[[onnx.ModelProto, np.random.Generator, Path], None]


def _node(proto: onnx.ModelProto, rng: np.random.Generator) -> onnx.NodeProto:
    return proto.graph.node[int(rng.integers(len(proto.graph.node)))]


def _initializer(proto: onnx.ModelProto, rng: np.random.Generator) -> onnx.TensorProto | None:
    inits = proto.graph.initializer
    return inits[int(rng.integers(len(inits)))] if len(inits) else None


def _rename_input(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    node = _node(proto, rng)
    if node.input:
        names = [o for n in proto.graph.node for o in n.output] + ["nowhere", ""]
        node.input[int(rng.integers(len(node.input)))] = str(rng.choice(names))


def _rename_output(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    node = _node(proto, rng)
    names = [o for n in proto.graph.node for o in n.output] + ["x0", "w0", "c0", ""]
    node.output[int(rng.integers(len(node.output)))] = str(rng.choice(names))


def _swap_nodes(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    nodes = list(proto.graph.node)
    i, j = (int(k) for k in rng.integers(len(nodes), size=2))
    nodes[i], nodes[j] = nodes[j], nodes[i]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)


def _remove_node(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    if len(proto.graph.node) > 1:
        del proto.graph.node[int(rng.integers(len(proto.graph.node)))]


def _tensor_data(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    tensor = _initializer(proto, rng)
    if tensor is None:
        return
    choice = int(rng.integers(5))
    if choice == 0:
        tensor.raw_data = tensor.raw_data[: int(rng.integers(len(tensor.raw_data) + 1))]
    elif choice == 1:
        tensor.raw_data = tensor.raw_data + b"\0" * int(rng.integers(1, 9))
    elif choice == 2:
        tensor.data_type = int(rng.choice([0, 2, 7, 8, 9, 10, 11, 16, 17, 22, 29, 99]))
    elif choice == 3:
        del tensor.dims[:]
        tensor.dims.extend(int(d) for d in rng.choice([-1, 0, 1, 3, 8, 2**31, 2**40], size=2))
    else:
        values = onnx.numpy_helper.to_array(tensor).ravel().tolist()
        tensor.ClearField("raw_data")
        field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
        getattr(tensor, field).extend(values[: int(rng.integers(len(values) + 1))])


def _header(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    choice = int(rng.integers(4))
    if choice == 0:
        proto.ir_version = int(rng.choice([0, 1, 3, 4, 99, -1]))
    elif choice == 1:
        del proto.opset_import[:]
    elif choice == 2:
        proto.opset_import[0].version = int(rng.choice([-1, 0, 1, 6, 99]))
    else:
        proto.opset_import.add(domain=str(rng.choice(["", "ai.onnx.ml", "x"])), version=1)


def _op(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    node = _node(proto, rng)
    choice = int(rng.integers(3))
    if choice == 0:
        node.domain = str(rng.choice(["com.example", "ai.onnx.ml", "com.microsoft"]))
    elif choice == 1:
        node.op_type = str(rng.choice(["Relux", "MatMul", "Cast", "If", "Conv", "Loop", ""]))
    else:
        node.name = str(rng.choice(["", proto.graph.node[0].name]))


def _attribute(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    node = _node(proto, rng)
    choice = int(rng.integers(4))
    if choice == 0:
        node.attribute.add(name=str(rng.choice(["axis", "to", "bogus"])))  # untyped
    elif choice == 1:
        node.attribute.append(
            onnx.helper.make_attribute(str(rng.choice(["axis", "to", "perm", "bogus"])), 1.5)
        )
    elif choice == 2 and node.attribute:
        del node.attribute[int(rng.integers(len(node.attribute)))]
    elif node.attribute:
        attr = node.attribute[int(rng.integers(len(node.attribute)))]
        attr.type = int(rng.integers(0, 15))


def _graph_io(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    value = proto.graph.input[int(rng.integers(len(proto.graph.input)))]
    choice = int(rng.integers(4))
    if choice == 0:
        value.type.tensor_type.elem_type = int(rng.choice([0, 6, 7, 8, 9, 10, 11, 16, 99]))
    elif choice == 1:
        value.ClearField("type")
    elif choice == 2:
        proto.graph.input.append(value)
    else:
        proto.graph.output[0].name = str(rng.choice(["nowhere", "x0", ""]))


def _external(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    tensor = _initializer(proto, rng)
    if tensor is None:
        return
    data = tensor.raw_data
    (folder / "w.bin").write_bytes(data[: int(rng.integers(len(data) + 1))])
    outside = folder.parent / f"{folder.name}-outside.bin"
    outside.write_bytes(data)
    link = folder / "link.bin"
    if not link.is_symlink():
        link.symlink_to(outside)
    tensor.ClearField("raw_data")
    tensor.data_location = T.EXTERNAL
    location = rng.choice(["w.bin", "link.bin", f"../{outside.name}", "/etc/hostname", "nope",
                           "a\0b", ".", "sub/../w.bin"])  # fmt: skip
    tensor.external_data.add(key="location", value=str(location))
    if rng.random() < 0.5:
        tensor.external_data.add(key="offset", value=str(rng.choice(["0", "-4", "x", "3"])))
    if rng.random() < 0.5:
        tensor.external_data.add(key="length", value=str(rng.choice([len(data), 1, 10**12])))


def _not_utf8(proto: onnx.ModelProto, rng: np.random.Generator, folder: Path) -> None:
    marker = "NOTUTF8MARK"
    choice = int(rng.integers(4))
    if choice == 0:
        proto.doc_string = marker
    elif choice == 1:
        _node(proto, rng).doc_string = marker
    elif choice == 2:
        onnx.helper.set_model_props(proto, {marker: "v"})
    else:
        _node(proto, rng).name = marker


DEFECTS: list[Defect] = [
    _rename_input, _rename_output, _swap_nodes, _remove_node, _tensor_data, _header, _op,
    _attribute, _graph_io, _external, _not_utf8,
]  # fmt: skip


def targeted(seed: int, folder: Path) -> bytes:
    """A valid model with one to three targeted defects."""
    rng = np.random.default_rng(seed)
    proto = random_case(seed).model
    for _ in range(int(rng.integers(1, 4))):
        defect = DEFECTS[int(rng.integers(len(DEFECTS)))]
        with contextlib.suppress(Exception):  # one that no longer applies after another
            defect(proto, rng, folder)
    return proto.SerializeToString().replace(b"NOTUTF8MARK", b"\xff\xfeTUTF8MARK")


def run(args: list[str]) -> tuple[int, str]:
    """``graphamp ARGS`` in-process: the exit status and what it wrote to stderr."""
    from graphamp.cli import main as cli

    err = io.StringIO()
    with (
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        try:
            status = cli(args)
        except SystemExit as exc:  # argparse
            status = exc.code if isinstance(exc.code, int) else 2
        except BaseException as exc:  # a crash is what we look for: keep the fuzzer going
            status = f"raised {type(exc).__name__}: {str(exc)[:200]}"  # type: ignore[assignment]
    return status, err.getvalue()


def _judge(status: object, err: str, written: list[Path]) -> list[str]:
    problems = []
    if status not in (0, 1, 2):
        problems.append(f"exit {status}: {err.strip()[:300]}")
    if "Traceback" in err:
        problems.append("a traceback")
    if status == 2 and len([line for line in err.strip().splitlines() if "error" in line]) != 1:
        problems.append(f"not one error line: {err.strip()[:300]}")
    if status != 0 and any(path.exists() for path in written):
        problems.append("an output after a failure")
    return problems


def _valid(path: Path) -> bool:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception:  # the checker's errors, and a file it cannot parse
        return False
    return True


def check_model_file(seed: int, folder: Path, data: bytes) -> list[str]:
    source, target = folder / f"m{seed}.onnx", folder / f"o{seed}.onnx"
    source.write_bytes(data)
    status, err = run(["convert", str(source), "-o", str(target)])
    problems = _judge(status, err, [target])
    outcomes[f"exit {status}"] += 1
    if status == 0 and not problems:
        valid_input = _valid(source)
        if not valid_input:  # repaired (a sort, a declaration): the output must still be valid
            outcomes["exit 0 on an input onnx.checker refuses"] += 1
            accepted_invalid.append(seed)
        if not _valid(target):
            problems.append(
                f"a{'' if valid_input else 'n invalid'} input converted to an invalid output"
            )
    source.unlink()
    target.unlink(missing_ok=True)
    return problems


def _mutate_json(value: object, rng: np.random.Generator) -> object:
    """``value`` with one random change somewhere inside it."""
    junk = [None, -1, 0, 1.5, "", "float8", "x" * 300, [], {}, [1, "a"], {"a": 1}, True, 1e308]
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = str(rng.choice(sorted(value)))
        choice = rng.random()
        if choice < 0.15:
            return {k: v for k, v in value.items() if k != key}
        if choice < 0.25:
            return {**value, "unexpected": junk[int(rng.integers(len(junk)))]}
        return {**value, key: _mutate_json(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        index = int(rng.integers(len(value)))
        if rng.random() < 0.2:
            return value[:index] + value[index + 1 :]
        return [*value[:index], _mutate_json(value[index], rng), *value[index + 1 :]]
    return junk[int(rng.integers(len(junk)))]


def check_plan_file(seed: int, folder: Path) -> list[str]:
    """A plan file with random changes through --from-plan, explain and diff."""
    import graphamp.onnx as gonnx

    rng = np.random.default_rng(seed)
    case = random_case(seed)
    source, target, plan = folder / f"m{seed}.onnx", folder / f"o{seed}.onnx", folder / "p.json"
    source.write_bytes(case.model.SerializeToString())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        document = json.loads(gonnx.analyse(case.model).plan.to_json())
    for _ in range(int(rng.integers(1, 4))):
        document = _mutate_json(document, rng)
    plan.write_text(json.dumps(document))
    problems = []
    node = case.model.graph.node[0].name
    for args, written in (
        (["convert", str(source), "-o", str(target), "--from-plan", str(plan)], [target]),
        (["explain", str(plan), node], []),
        (["diff", str(plan), str(source)], []),
    ):
        status, err = run(args)
        outcomes[f"{args[0]} exit {status}"] += 1
        problems += [f"{args[0]}: {p}" for p in _judge(status, err, written)]
        target.unlink(missing_ok=True)
    return problems


def check_config_file(seed: int, folder: Path) -> list[str]:
    """A policy file with random changes through --config."""
    rng = np.random.default_rng(seed)
    case = random_case(seed)
    source, target, config = folder / f"m{seed}.onnx", folder / f"o{seed}.onnx", folder / "c.toml"
    source.write_bytes(case.model.SerializeToString())
    table: dict[str, object] = {
        key: value for key, value in case.policy.items() if not isinstance(value, bool)
    }
    for _ in range(int(rng.integers(1, 3))):
        table = _mutate_json(table, rng)  # type: ignore[assignment]
    config.write_text(_toml({"graphamp": table}))
    status, err = run(["convert", str(source), "-o", str(target), "--config", str(config)])
    outcomes[f"config exit {status}"] += 1
    problems = _judge(status, err, [target])
    target.unlink(missing_ok=True)
    return problems


def _toml(value: object, path: str = "") -> str:
    """A small TOML writer for what _mutate_json makes (tables, arrays, scalars)."""
    if not isinstance(value, dict):
        raise TypeError(value)
    lines, tables = [], []
    for key, item in value.items():
        if isinstance(item, dict):
            tables.append(_toml(item, f"{path}.{key}" if path else key))
        elif item is not None:
            lines.append(f"{json.dumps(key)} = {_toml_value(item)}")
    head = [f"[{path}]"] if path else []
    return "\n".join([*head, *lines, *tables]) + "\n"


def _toml_value(item: object) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, (int, float)):
        return repr(item) if np.isfinite(item) else "inf"
    if isinstance(item, list):
        return "[" + ", ".join(_toml_value(i) for i in item if i is not None) + "]"
    if isinstance(item, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in item.items()) + "}"
    return json.dumps(str(item))


def check_cli(seed: int, folder: Path) -> list[str]:
    """One damaged file through the command line, its kind chosen by the seed (seed % 8, as
    the regression seeds were found); one seed in five then also runs a file case."""
    problems = _check_damaged(seed, folder)
    if seed % 5 == 4:
        problems += _in_folder(seed, folder, lambda sub: _check_files(seed, sub))
    return problems


def _check_damaged(seed: int, folder: Path) -> list[str]:
    kind = seed % 8
    if kind < 4:
        return _in_folder(seed, folder, lambda sub: check_model_file(seed, sub, mutated(seed)))
    if kind < 6:
        return _in_folder(
            seed, folder, lambda sub: check_model_file(seed, sub, targeted(seed, sub))
        )
    if kind == 6:
        return _in_folder(seed, folder, lambda sub: check_plan_file(seed, sub))
    return _in_folder(seed, folder, lambda sub: check_config_file(seed, sub))


def _check_files(seed: int, sub: Path) -> list[str]:
    from fuzz_files import check_files  # clobbering and permission cases

    return check_files(seed, sub, run, _judge, outcomes)


def _in_folder(seed: int, folder: Path, check) -> list[str]:  # type: ignore[no-untyped-def]
    """``check(sub)`` in a fresh folder ``s<seed>`` of ``folder``, removed after."""
    sub = folder / f"s{seed}"
    sub.mkdir(exist_ok=True)
    try:
        return check(sub)
    finally:
        for path in sorted(sub.rglob("*"), reverse=True):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
            path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
        sub.rmdir()
        for outside in folder.glob(f"{sub.name}-outside.bin"):
            outside.unlink()
