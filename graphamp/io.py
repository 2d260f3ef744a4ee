"""File writing that never leaves a partial output: write a temporary file, then rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A path to write ``target``'s files at (in a temporary folder beside it); when the block
    ends without an error, every file written there is moved into ``target``'s folder (an
    ONNX model and its external data, say), and on an error nothing is.

    Lets a command check what it wrote (verification) before anything is in place."""
    target = Path(target)
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent or "."))
    try:
        yield folder / target.name
        for written in sorted(folder.iterdir()):
            os.replace(written, target.parent / written.name)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
