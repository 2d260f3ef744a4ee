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
import math
import os
import shutil
import zipfile
import zlib
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
    except (zipfile.BadZipFile, EOFError, ValueError):  # ValueError: a negative offset
        raise GraphampError(f"{path}: not a .pt2 archive (not a zip file)") from None
    with archive:
        names = archive.namelist()
        prefix = next(
            (n[: -len("archive_format")] for n in names if n.endswith("archive_format")), None
        )
        if prefix is None or _read(archive, f"{prefix}archive_format", path).strip() != b"pt2":
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
            result = {}
            for fqn, entry in _tensor_config(archive, config_path, path).items():
                if entry.get("use_pickle"):
                    raise GraphampError(
                        f"{path}: {kind[:-1]} {fqn!r} is stored as a pickle; "
                        "graphamp never unpickles model files"
                    )
                meta = entry.get("tensor_meta")
                if meta is None:
                    raise GraphampError(f"{path}: {kind[:-1]} {fqn!r} is not a tensor")
                raw = _read(archive, f"{prefix}data/{kind}/{entry['path_name']}", path)
                where = f"{path}: {config_path}: {fqn!r}"
                result[fqn] = _tensor(raw, meta, bool(entry.get("is_param")), serde, schema, where)
            return result

        wanted = extra_files if extra_files is not None else {}
        for name in wanted:
            if f"{prefix}extra/{name}" in names:
                member = f"{prefix}extra/{name}"
                try:
                    wanted[name] = _read(archive, member, path).decode("utf-8")
                except UnicodeDecodeError:
                    raise GraphampError(f"{path}: {member}: not UTF-8 text") from None
        program_path = f"{prefix}models/{model}.json"
        program_json = _read(archive, program_path, path)
        if not isinstance(_parse_json(program_json, program_path, path), dict):
            raise GraphampError(f"{path}: {program_path}: {_SCHEMA}: not a JSON object")
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
    # torch's reader meets JSON that parses but is not its program: a field missing or of
    # another type (its dataclasses' own errors, its asserts, its SerializeError)
    except (*_MALFORMED, serde.SerializeError) as exc:
        reason = f"no {exc}" if isinstance(exc, KeyError) else _first_line(exc)
        raise GraphampError(f"{path}: {program_path}: {_SCHEMA}: {reason}") from None
    except Exception as exc:  # the rest is still about what it read, which is all the file's
        raise GraphampError(
            f"{path}: could not read the exported program ({_first_line(exc)})"
        ) from None
    # The archive's own sample inputs are a pickle: make inputs of the traced shapes instead
    # (ExportedProgram.module() binds them to its signature).
    program.example_inputs = example_inputs(program)
    return program


_SCHEMA = "the archive's JSON does not match torch.export's schema"
# what reading JSON of the wrong shape raises, in graphamp's reading of the weights' configs
# and in torch's of the program
_MALFORMED = (KeyError, TypeError, AttributeError, ValueError, IndexError, AssertionError)


def _read(archive: zipfile.ZipFile, member: str, path: Path) -> bytes:
    """A member's bytes, checked against the archive's CRC as zipfile reads them: a damaged
    or missing member is the file's fault, one line naming it, never zipfile's exception."""
    try:
        return archive.read(member)
    except KeyError:
        raise GraphampError(f"{path}: damaged .pt2 archive: no member {member!r}") from None
    except zipfile.BadZipFile as exc:
        what = "CRC" if "CRC" in str(exc) else _first_line(exc)
        raise GraphampError(f"{path}: member {member!r} is damaged ({what})") from None
    # zlib.error and EOFError: deflated bytes cut short or garbled; NotImplementedError and
    # RuntimeError: a compression method or encryption flag that the damage made up
    except (zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise GraphampError(f"{path}: member {member!r} is damaged ({_first_line(exc)})") from None


def _parse_json(raw: bytes, member: str, path: Path) -> Any:
    """A JSON member parsed, or one line naming it."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise GraphampError(f"{path}: {member}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise GraphampError(f"{path}: {member}: not valid JSON ({_first_line(exc)})") from None


def _tensor_config(archive: zipfile.ZipFile, member: str, path: Path) -> dict[str, Any]:
    """A weights or constants config (``{"config": {fqn: {"path_name": ..., "tensor_meta":
    ...}}}``), its shape checked here: graphamp reads it itself, so a value of the wrong type
    would otherwise be a TypeError deep in the reading."""
    config = _parse_json(_read(archive, member, path), member, path)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise GraphampError(f'{path}: {member}: {_SCHEMA}: no "config" object')
    for fqn, entry in entries.items():
        if not isinstance(entry, dict):
            raise GraphampError(f"{path}: {member}: {_SCHEMA}: {fqn!r} is not an object")
        if not isinstance(entry.get("path_name"), str):
            raise GraphampError(f'{path}: {member}: {_SCHEMA}: {fqn!r} has no "path_name"')
        meta = entry.get("tensor_meta")
        if meta is not None and not isinstance(meta, dict):
            raise GraphampError(f'{path}: {member}: {_SCHEMA}: {fqn!r}: bad "tensor_meta"')
    return entries


def _first_line(exc: BaseException) -> str:
    """An exception's message cut to one short line (torch's can span a dozen)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else f"{text[:200]}..."


def _tensor(
    raw: bytes, meta: dict[str, Any], is_param: bool, serde: Any, schema: Any, where: str
) -> torch.Tensor:
    """One weight or constant from its raw bytes and ``tensor_meta`` (a Parameter where
    ``is_param``); ``where`` names it in the one line a description that does not fit the
    bytes gets."""
    try:
        dtype = serde._SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType(meta["dtype"])]
        sizes = [int(s["as_int"]) for s in meta["sizes"]]
        strides = [int(s["as_int"]) for s in meta["strides"]]
        offset = int(meta.get("storage_offset", {}).get("as_int", 0))
        flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        _refuse_inflated(sizes, flat.numel(), where)
        tensor = flat.as_strided(sizes, strides, offset).clone()
        if is_param:
            tensor = torch.nn.Parameter(tensor, requires_grad=meta.get("requires_grad", True))
    # KeyError, TypeError, AttributeError: a field missing or of another type; ValueError,
    # RuntimeError: a dtype, size or stride the bytes cannot hold (torch's own checks)
    except (*_MALFORMED, RuntimeError) as exc:
        reason = f"no {exc}" if isinstance(exc, KeyError) else _first_line(exc)
        raise GraphampError(f"{where}: {_SCHEMA}: {reason}") from None
    return tensor


# Elements a weight may describe beyond those it stores (zero or overlapping strides: an
# expanded tensor saved as its storage): up to 1 GiB of float32 when materialised.
_INFLATED_ELEMENTS = 1 << 28


def _refuse_inflated(sizes: list[int], stored: int, where: str) -> None:
    """Refuse a weight whose sizes describe far more elements than its bytes store: a
    damaged or hostile archive could make graphamp allocate without bound (a clone, a cast
    to the low type) from a few stored bytes."""
    elements = math.prod(sizes)
    if elements > stored and elements > _INFLATED_ELEMENTS:
        raise GraphampError(
            f"{where}: describes {elements:,} elements over {stored:,} stored (zero or "
            "overlapping strides): refused, it would be materialised whole"
        )


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
