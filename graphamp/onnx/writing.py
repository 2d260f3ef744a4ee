"""Writing model files so that an error leaves nothing: room checked first, a full disk one
line, files renamed into place together with interrupts held back."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graphamp.core.io import signals_held
from graphamp.errors import GraphampError

EXTERNAL_DATA_THRESHOLD = 1_900_000_000  # bytes of weights above which we write external data


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


def size_text(count: float) -> str:
    """``count`` bytes in words: 512 B, 1.5 KiB, 436.2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
