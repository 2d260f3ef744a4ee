"""File writing that never leaves a partial output: write a temporary file, then rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder."""
    write_atomic_with(path, lambda tmp: tmp.write_bytes(data))


def write_atomic_with(path: Path, writer: Callable[[Path], object], suffix: str = ".tmp") -> None:
    """Call ``writer(tmp_path)`` to fill a temporary file, then rename it onto ``path``.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent or ".")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs follow the umask
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
