"""A model folder: the model files in it, the files they read beside themselves, and the rest.

An exported model is often a folder, not a file: Optimum's seq2seq export holds an encoder, a
decoder, a decoder with past and the merged decoder, next to ``config.json``, the generation
config and the tokenizer files that ``from_pretrained`` reads. ``graphamp convert DIR -o OUT``
converts each model file of such a folder and copies every other file, so OUT loads wherever
DIR did.

Which files are models is the dialects' answer (a registered suffix: ``.onnx``, ``.pt2``);
which files a model reads beside itself (an ONNX model's external data) is its dialect's
:meth:`~graphamp.dialects.base.Dialect.files`. Those are not copied: the converted model writes
its own. Hidden entries (``.git``, ``.cache``, a name starting with a dot) are left out, and
so are a link to a folder, a dangling link and what is no regular file (a pipe, a device); a
link to a file is read as the file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from graphamp.dialects.registry import entries, for_file, named_by_suffix
from graphamp.errors import GraphampError

PLAN_SUFFIX = ".plan.json"


@dataclass(frozen=True)
class ModelFolder:
    """The files of a folder, as paths relative to ``root``, each list sorted."""

    root: Path
    models: tuple[Path, ...]
    companions: tuple[Path, ...]  # read with a model (external data): not copied
    others: tuple[Path, ...]  # copied as they are
    skipped: tuple[Path, ...]  # hidden entries, links to folders or nowhere, pipes, devices

    def plan_name(self, model: Path) -> Path:
        """Where the plan of ``model`` goes in a folder of plans: the model's relative path
        with ``.plan.json`` for its suffix (``decoder_model_merged.plan.json``)."""
        return model.with_name(model.stem + PLAN_SUFFIX)


def model_suffixes() -> list[str]:
    return sorted({suffix for entry in entries() for suffix in entry.suffixes})


def is_model_name(path: Path) -> bool:
    """Whether a registered dialect reads files named like ``path``. By suffix alone: in a
    folder, first bytes would take any zip archive for a .pt2 program."""
    return named_by_suffix(path) is not None


def read_folder(root: str | os.PathLike[str]) -> ModelFolder:
    """The :class:`ModelFolder` at ``root``; a folder with no model file is an error."""
    root = Path(root)
    if not root.is_dir():
        raise GraphampError(f"{root}: no such folder")
    files: list[Path] = []
    skipped: list[Path] = []
    for folder, names, file_names in os.walk(root, onerror=_raise):
        here = Path(folder)
        for name in sorted(names):
            if name.startswith(".") or (here / name).is_symlink():
                skipped.append((here / name).relative_to(root))
        names[:] = sorted(n for n in names if not n.startswith(".") and not (here / n).is_symlink())
        for name in sorted(file_names):
            relative = (here / name).relative_to(root)
            member = not name.startswith(".") and is_folder_member(here / name)
            (files if member else skipped).append(relative)
    models = [path for path in files if is_model_name(path)]
    if not models:
        raise GraphampError(
            f"{root}: no model file in this folder (a name ending in "
            f"{' or '.join(model_suffixes())})"
        )
    companions: set[Path] = set()
    for model in models:
        for part in for_file(root / model).files(root / model)[1:]:
            try:
                companions.add(part.resolve().relative_to(root.resolve()))
            except ValueError:  # data outside the folder: read, never copied
                continue
    others = [path for path in files if path not in companions and path not in models]
    found = ModelFolder(
        root, tuple(models), tuple(sorted(companions)), tuple(others), tuple(sorted(skipped))
    )
    _check_plan_names(found)
    return found


def is_folder_member(path: Path) -> bool:
    """Whether the file entry ``path`` of a model folder is one the folder holds: a regular
    file, or a link to one (Hugging Face's cache keeps a snapshot's files as links into its
    blobs folder, outside the snapshot). A dangling link is left out, and so is a pipe or a
    device (reading one can block, or never end)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, RuntimeError):  # a dangling link, a loop of links
        return False


def _check_plan_names(folder: ModelFolder) -> None:
    seen: dict[Path, Path] = {}
    for model in folder.models:
        name = folder.plan_name(model)
        if name in seen:
            raise GraphampError(
                f"{folder.root / model}: its plan would be named as that of "
                f"{folder.root / seen[name]} ({name}); rename one of them"
            )
        seen[name] = model


# Suffixes of the files graphamp writes beside models (plans, reports): a folder output named
# plans.json is a file name given where a folder belongs
_FILE_SUFFIXES = (".json", ".html", ".txt")


def check_output_folder(source: Path, output: Path, what: str) -> None:
    """Refuse an output folder that is the input folder or inside it (graphamp never writes
    into what it reads), whose name is a model file's (``out.onnx``: a folder a reader would
    take for the converted model), or whose parent folder does not exist."""
    by_suffix = named_by_suffix(output)
    if by_suffix is not None:
        raise GraphampError(
            f"{output}: {what} is a folder for a folder IN, but its name ends in "
            f"{by_suffix[1]}, a model file's suffix; name the folder without it"
        )
    inside = _within(output, source)
    if inside is not None:
        where = "is the input folder" if inside == Path(".") else f"is inside the input {source}"
        raise GraphampError(
            f"{output}: {what} {where}; graphamp never writes into the folder it reads"
        )
    if output.exists() and not output.is_dir():
        raise GraphampError(f"{output}: is a file; {what} needs a folder (made if missing)")
    if output.suffix.lower() in _FILE_SUFFIXES and not output.exists():
        raise GraphampError(
            f"{output}: {what} is a folder for a folder IN (a file per model), but its name "
            f"ends in {output.suffix}, a file's suffix; name the folder without it"
        )
    parent = output.absolute().parent
    if not parent.is_dir():
        raise GraphampError(f"{output}: folder {parent} does not exist")


def check_not_inside(path: Path, folder: Path, what: str) -> None:
    """Refuse a file written inside the input ``folder``, through links included."""
    if _within(path, folder) is not None:
        raise GraphampError(
            f"{path}: {what} is inside the input folder {folder}; graphamp never writes into "
            "the folder it reads"
        )


def stale_models(output: Path, written: set[Path]) -> list[Path]:
    """Model files already in ``output`` that this conversion does not write (``written``:
    absolute paths): left from something else, and a loader that lists the folder may pick
    them up."""
    if not output.is_dir():
        return []
    found = []
    for folder, names, file_names in os.walk(output):
        names[:] = sorted(n for n in names if not n.startswith("."))
        for name in sorted(file_names):
            path = Path(folder) / name
            # (compared absolute: ``written`` is, and -o may be given relative)
            if is_model_name(path) and not name.startswith(".") and path.absolute() not in written:
                found.append(path)
    return found


def _within(path: Path, folder: Path) -> Path | None:
    """``path`` relative to ``folder`` when it is the folder or inside it (links followed)."""
    for a, b in ((path.absolute(), folder.absolute()), (path.resolve(), folder.resolve())):
        try:
            return a.relative_to(b)
        except ValueError:
            continue
    return None


def _raise(error: OSError) -> None:
    if isinstance(error, PermissionError):  # said as every other permission refusal says it
        raise GraphampError(f"{error.filename}: permission denied: cannot read the folder")
    raise GraphampError(f"{error.filename}: cannot read the folder ({error.strerror})")
