"""Writing model files so that an error leaves nothing: room checked first, a full disk one
line, files renamed into place together with interrupts held back."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

from graphamp.core.io import same_file, signals_held, size_text
from graphamp.errors import GraphampError

EXTERNAL_DATA_THRESHOLD = 1_900_000_000  # bytes of weights above which we write external data
# An onnx_ir model's ``meta`` key: the files (the model, its external data) it was read from.
READ_FROM = "graphamp.read_from"


def written_files(path: Path) -> list[Path]:
    """The files saving a model to ``path`` may write: the model and its data file beside it."""
    return [path, path.parent / f"{path.name}.data"]


def remember_source(model: object, path: Path) -> None:
    """Record on ``model`` (an onnx_ir model; other types keep nothing) that it was read from
    the ONNX file ``path`` (and so from the data files it names)."""
    meta = getattr(model, "meta", None)
    if isinstance(meta, MutableMapping):
        meta[READ_FROM] = str(path)


def check_not_a_source(model: object, path: Path, read_from: Path | None = None) -> None:
    """Refuse to save ``model`` to ``path`` when that would write over a file it was read from:
    the model file ``read_from`` or :func:`remember_source` recorded, a data file that model
    names, the file of an onnx_ir external tensor, or a file a converted model's weights are
    still read from. Only files that exist can be sources, so a new path costs no reading."""
    existing = [written for written in written_files(path) if written.exists()]
    if not existing:
        return
    from graphamp.onnx.io.infile import StreamedModel
    from graphamp.onnx.io.locations import external_data_files

    recorded = read_from or getattr(model, "meta", {}).get(READ_FROM)
    sources = [Path(recorded), *external_data_files(Path(recorded))] if recorded else []
    graph = getattr(model, "graph", None)
    for value in getattr(graph, "initializers", {}).values():
        location = getattr(value.const_value, "path", None)  # an onnx_ir ExternalTensor's
        if isinstance(location, str | os.PathLike):
            sources.append(Path(location))
    if isinstance(model, StreamedModel):  # its weights are read as they are written
        sources += [Path(data.source.path) for data in model.data.values()]
    for written in existing:
        for source in sources:
            link = same_file(written, source)
            if link is not None:
                raise GraphampError(
                    f"{path}: saving would overwrite {source}{link}, which the model was read "
                    "from; save it elsewhere, or pass overwrite=True; nothing was written"
                )


@contextmanager
def disk_full_is_an_error(path: Path, size: int, what: str = "") -> Iterator[None]:
    """A full disk (or quota) while the block writes ``path`` is one line, not a traceback;
    the block leaves nothing behind on an error."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            written = f"{size_text(size)} {what}".rstrip()
            raise GraphampError(
                f"{path}: {(exc.strerror or 'disk full').lower()} while writing "
                f"{written}; nothing was written"
            ) from None
        raise


def check_room(path: Path, needed: int) -> None:
    """Refuse, before writing, ``needed`` bytes of weights that ``path``'s disk has no room for."""
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        raise GraphampError(
            f"{path}: the weights need {size_text(needed)} and its disk has "
            f"{size_text(free)} free; nothing was written"
        )


def replace_together(data: list[tuple[Path, Path]], model_tmp: Path, model_path: Path) -> None:
    """Rename the data files, then the model, into place, with SIGINT and SIGTERM held back
    until all are done: an interrupt never leaves a model beside data of another conversion."""
    with signals_held():
        for source, target in data:
            os.replace(source, target)
        os.replace(model_tmp, model_path)
