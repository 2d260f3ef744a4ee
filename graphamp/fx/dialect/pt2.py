""".pt2 files (``torch.export.save``) read without pickle.

``torch.export.load`` unpickles parts of the archive (weights marked ``use_pickle``, the
sample inputs, and on failure it retries with ``weights_only=False``). graphamp reads the
archive itself: the program from ``models/<name>.json``, each weight and constant from its raw
bytes and the JSON description beside them, and refuses any payload stored as a pickle. The
deserializer receives ready tensors, so nothing in the file is ever unpickled.

:class:`Pt2Dialect` converts such a program with the FX dialect and writes a ``.pt2`` program
again, exported on inputs of the traced shapes.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphamp.dialects.base import ReadGraph
from graphamp.errors import GraphampError
from graphamp.fx.dialect import reader, writer
from graphamp.fx.dialect.capture import capture
from graphamp.fx.dialect.plugin import TorchDialect, run_module
from graphamp.fx.dialect.samples import embedding_bounds, input_spec, sample_values
from graphamp.numerics.inputs import InputSpec
from graphamp.plans.edits import EditScript


def load(
    path: str | os.PathLike[str], extra_files: dict[str, str] | None = None
) -> torch.export.ExportedProgram:
    """The ExportedProgram saved at ``path`` (one model per archive); as ``torch.export.load``
    does, each name of ``extra_files`` found in the archive gets its text there."""
    from torch._export.serde import schema
    from torch._export.serde import serialize as serde

    path = Path(path)
    if path.is_dir():
        raise GraphampError(f"{path}: is a folder, not a .pt2 program")
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

        wanted = extra_files if extra_files is not None else {}
        for name in wanted:
            if f"{prefix}extra/{name}" in names:
                wanted[name] = archive.read(f"{prefix}extra/{name}").decode("utf-8")
        program_json = archive.read(f"{prefix}models/{model}.json")
        if b"transformers.cache_utils." in program_json:  # its inputs or outputs hold caches
            from graphamp.fx.dialect.hf import register_caches

            register_caches(import_transformers=True)
        state_dict = tensors("weights", f"{model}_weights_config.json")
        constants = tensors("constants", f"{model}_constants_config.json")
        # arg-type: ready tensors and inputs where the dataclass names bytes (its pickled
        # form); deserialize takes both
        artifact = serde.SerializedArtifact(
            exported_program=program_json,
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
    program.example_inputs = example_inputs(program)
    return program


def _tensor(raw: bytes, meta: dict[str, Any], serde: Any, schema: Any) -> torch.Tensor:
    dtype = serde._SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType(meta["dtype"])]
    sizes = [int(s["as_int"]) for s in meta["sizes"]]
    strides = [int(s["as_int"]) for s in meta["strides"]]
    offset = int(meta.get("storage_offset", {}).get("as_int", 0))
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.as_strided(sizes, strides, offset).clone()


def user_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """The names of the program's user inputs, in call order."""
    return [
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]


def input_specs(program: torch.export.ExportedProgram) -> list[InputSpec]:
    """The user inputs with the shapes and types the program was traced with; integer inputs
    that index an embedding table stay inside it."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    bounds = embedding_bounds(program.graph)
    return [input_spec(placeholders[name], bounds) for name in user_inputs(program)]


def example_inputs(
    program: torch.export.ExportedProgram, seed: int = 0
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random ``(args, kwargs)`` of the traced shapes and types (never zeros), in the
    structure the program is called with."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    nodes = [placeholders[name] for name in user_inputs(program)]
    flat = sample_values(program.graph, nodes, seed)
    return torch.utils._pytree.tree_unflatten(flat, program.call_spec.in_spec)


PLAN_META = "graphamp_plan"


class Pt2Dialect(TorchDialect):
    """``.pt2`` files (``torch.export.save``): read without pickle, converted by the FX
    dialect's reader and writer with PyTorch's CPU autocast lists, written as a ``.pt2``
    program again."""

    name = "pt2"

    def load(self, source: object) -> torch.export.ExportedProgram:
        if isinstance(source, torch.export.ExportedProgram):
            return source
        if not isinstance(source, str | os.PathLike):
            raise GraphampError(f"expected a .pt2 path or a program, got {type(source).__name__}")
        return load(source)

    def read(self, model: torch.export.ExportedProgram, policy: Any) -> ReadGraph:
        return reader.read(capture(model, None), master_weights=self.weights == "master")

    def apply(self, read: ReadGraph, script: EditScript) -> torch.export.ExportedProgram:
        from graphamp.fx.dialect.program import export

        return export(writer.apply(read, script))

    def keep_plan(self, model: torch.export.ExportedProgram, plan: Any) -> None:
        model.graph_module.meta[PLAN_META] = plan  # torch.export.save stores only "custom"

    def check_target(self, path: Path) -> None:
        if Path(path).suffix != ".pt2":
            raise GraphampError(f"{path}: a .pt2 program converts to a .pt2 file")

    def save(self, model: torch.export.ExportedProgram, path: Any) -> None:
        from graphamp.fx.dialect.program import write

        self.check_target(path)
        write(model, Path(path), model.graph_module.meta.get(PLAN_META))

    def save_unchanged(self, source: Path, path: Path) -> bool:
        """A program the conversion changed nothing in is the input file, byte for byte: its
        plan (a graphamp output's) is the record of the decisions it holds, and exporting it
        again would only rename its nodes."""
        shutil.copyfile(source, path)
        return True

    def input_specs(self, model: Any) -> list[InputSpec]:
        return input_specs(self.load(model))

    def run(
        self, model: Any, feeds: dict[str, np.ndarray], *, provider: str = "cpu"
    ) -> tuple[dict[str, np.ndarray], str]:
        program = self.load(model)
        return run_module(
            program.module(), user_inputs(program), input_specs(program), feeds, provider
        )

    def label(self, source: object) -> str:
        return Path(source).name if isinstance(source, str | os.PathLike) else "program"
