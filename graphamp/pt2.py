""".pt2 files (``torch.export.save``) read without pickle.

``torch.export.load`` unpickles parts of the archive (weights marked ``use_pickle``, the
sample inputs, and on failure it retries with ``weights_only=False``). graphamp reads the
archive itself: the program from ``models/<name>.json``, each weight and constant from its raw
bytes and the JSON description beside them, and refuses any payload stored as a pickle. The
deserializer receives ready tensors, so nothing in the file is ever unpickled.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import torch

from graphamp.errors import GraphampError


def load(path: str | os.PathLike[str]) -> torch.export.ExportedProgram:
    """The ExportedProgram saved at ``path`` (one model per archive)."""
    from torch._export.serde import schema
    from torch._export.serde import serialize as serde

    path = Path(path)
    if not path.is_file():
        raise GraphampError(f"{path}: no such file")
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise GraphampError(f"{path}: not a .pt2 archive (not a zip file)") from None
    with archive:
        names = archive.namelist()
        prefix = next(
            (n[: -len("archive_format")] for n in names if n.endswith("archive_format")), None
        )
        if prefix is None or archive.read(f"{prefix}archive_format").strip() != b"pt2":
            raise GraphampError(f"{path}: not a torch.export .pt2 archive")
        models = sorted(
            n for n in names if n.startswith(f"{prefix}models/") and n.endswith(".json")
        )
        if len(models) != 1:
            raise GraphampError(f"{path}: expected one exported program, found {len(models)}")
        model = Path(models[0]).stem

        def tensors(kind: str, config_name: str) -> dict[str, Any]:
            config_path = f"{prefix}data/{kind}/{config_name}"
            if config_path not in names:
                return {}
            config = json.loads(archive.read(config_path))["config"]
            result = {}
            for fqn, entry in config.items():
                if entry.get("use_pickle"):
                    raise GraphampError(
                        f"{path}: {kind[:-1]} {fqn!r} is stored as a pickle; "
                        "graphamp never unpickles model files"
                    )
                meta = entry.get("tensor_meta")
                if meta is None:
                    raise GraphampError(f"{path}: {kind[:-1]} {fqn!r} is not a tensor")
                raw = archive.read(f"{prefix}data/{kind}/{entry['path_name']}")
                result[fqn] = _tensor(raw, meta, serde, schema)
                if entry.get("is_param"):
                    result[fqn] = torch.nn.Parameter(
                        result[fqn], requires_grad=meta.get("requires_grad", True)
                    )
            return result

        state_dict = tensors("weights", f"{model}_weights_config.json")
        constants = tensors("constants", f"{model}_constants_config.json")
        artifact = serde.SerializedArtifact(
            exported_program=archive.read(f"{prefix}models/{model}.json"),
            state_dict=state_dict,  # type: ignore[arg-type]
            constants=constants,  # type: ignore[arg-type]
            example_inputs=((), {}),  # type: ignore[arg-type]
        )
    try:
        program = serde.deserialize(artifact)
    except Exception as exc:
        raise GraphampError(f"{path}: could not read the exported program ({exc})") from None
    # The archive's own sample inputs are a pickle: make inputs of the traced shapes instead
    # (ExportedProgram.module() binds them to its signature).
    program.example_inputs = (example_inputs(program), {})
    return program


def _tensor(raw: bytes, meta: dict[str, Any], serde: Any, schema: Any) -> torch.Tensor:
    dtype = serde._SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType(meta["dtype"])]
    sizes = [int(s["as_int"]) for s in meta["sizes"]]
    strides = [int(s["as_int"]) for s in meta["strides"]]
    offset = int(meta.get("storage_offset", {}).get("as_int", 0))
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.as_strided(sizes, strides, offset).clone()


def example_inputs(program: torch.export.ExportedProgram, seed: int = 0) -> tuple[Any, ...]:
    """Random inputs of the shapes and dtypes the program's user inputs were traced with
    (never zeros), to export the converted module again."""
    generator = torch.Generator().manual_seed(seed)
    user_inputs = [
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    # Integer inputs that index an embedding table stay inside it (token ids, token types).
    bounds: dict[str, int] = {}
    for node in program.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "_opname", "") == "embedding":
            table, indices = node.args[0], node.args[1]
            rows = int(table.meta["val"].shape[0])  # type: ignore[union-attr]
            bounds[indices.name] = min(rows, bounds.get(indices.name, rows))  # type: ignore[union-attr]
    inputs = []
    for name in user_inputs:
        value = placeholders[name].meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise GraphampError(f"input {name!r} of the exported program is not a tensor")
        shape = [int(d) for d in value.shape]
        if value.dtype.is_floating_point:
            tensor = torch.randn(shape, generator=generator).to(value.dtype)
            tensor[tensor == 0] = 0.5
        elif value.dtype == torch.bool:
            tensor = torch.rand(shape, generator=generator) < 0.5
        else:
            high = bounds.get(name, 16)
            tensor = torch.randint(min(1, high - 1), high, shape, generator=generator).to(
                value.dtype
            )
        inputs.append(tensor)
    return tuple(inputs)


def save(module: torch.nn.Module, inputs: tuple[Any, ...], path: str | os.PathLike[str]) -> None:
    """Export ``module`` on ``inputs`` and write it atomically to ``path``."""
    from graphamp.io import write_atomic_with

    program = torch.export.export(module, inputs)
    write_atomic_with(Path(path), lambda tmp: torch.export.save(program, str(tmp)), suffix=".pt2")
