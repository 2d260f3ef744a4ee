"""File writing that never leaves a partial output: write a temporary file, then rename.

Every temporary file or folder graphamp makes in a user's folder is named
``.<name>.graphamp-<host>-<pid>-<random>`` (:func:`temp_prefix`), so that the next run into that
folder can tell graphamp's own leftovers (a write killed by SIGKILL, which no handler sees) from
anything else, and remove them (:func:`remove_stale`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from graphamp.errors import GraphampError

HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_TEMP_NAME = re.compile(
    r"^\..+\.graphamp-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[A-Za-z0-9_]+(\.\w+)?$"
)
STALE_AFTER = 24 * 3600  # seconds: a leftover of another machine is stale after a day untouched


def temp_prefix(path: Path) -> str:
    """The name prefix of a temporary file or folder made beside ``path``."""
    return f".{Path(path).name}.graphamp-{HOST}-{os.getpid()}-"


def same_file(a: Path, b: Path) -> str | None:
    """None when ``a`` and ``b`` are different files; else "" (the same path), or how they
    are the same file (", through a link")."""
    if os.path.abspath(a) == os.path.abspath(b):
        return ""
    if os.path.realpath(a) == os.path.realpath(b):
        return ", through a symbolic link"
    try:
        if os.path.samefile(a, b):
            return ", through a hard link"
    except OSError:  # one of them does not exist yet
        pass
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder."""
    write_atomic_with(path, lambda tmp: tmp.write_bytes(data))


def write_atomic_with(path: Path, writer: Callable[[Path], object], suffix: str = ".tmp") -> None:
    """Call ``writer(tmp_path)`` to fill a temporary file, then rename it onto ``path``.

    On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    remove_stale(folder)
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=suffix, dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs follow the umask
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def size_text(count: float) -> str:
    """``count`` bytes in words: 512 B, 1.5 KiB, 436.2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_stale(folder: Path) -> list[Path]:
    """Remove the temporary files and folders graphamp left in ``folder`` when a run was killed
    where nothing could clean up (SIGKILL, a power cut): only names of graphamp's own pattern
    (:func:`temp_prefix`), of a process of this machine that is gone, or of another machine
    and untouched for a day. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:  # unreadable or missing: the write itself will say so
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if not match or not _is_stale(match["host"], int(match["pid"]), entry):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def _is_stale(host: str, pid: int, entry: os.DirEntry[str]) -> bool:
    if host != HOST:
        try:
            return time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER
        except OSError:
            return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's live process
        return False
    return False


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block (renames that belong together)."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no signal masks here (Windows)
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Outputs:
    """Every file one command writes, staged in a hidden folder beside each target and moved
    into place together by :meth:`commit`; should the command fail first, none is.

    ``targets`` are (what, path) pairs (``what`` names the flag in messages). Entering makes
    the staging folders (removing stale leftovers first), so a folder that cannot be written
    is refused before any work, naming the folder. A target's folder that does not exist yet
    is created at :meth:`commit` (``graphamp demo --keep DIR``)."""

    def __init__(self, targets: Sequence[tuple[str, Path]] = ()) -> None:
        self.targets = [(what, Path(path)) for what, path in targets]
        self._staging: dict[Path, Path] = {}  # target folder -> its staging folder
        self._made: list[Path] = []

    def __enter__(self) -> Outputs:
        try:
            for what, target in self.targets:
                self._stage_folder(what, target)
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    def _stage_folder(self, what: str, target: Path) -> None:
        folder = _folder(target)
        if folder in self._staging:
            return
        existing = folder
        try:
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
            if not existing.is_dir():
                raise GraphampError(
                    f"{target}: {existing} is not a folder; cannot write the {what}"
                )
        except PermissionError:
            raise GraphampError(
                f"{existing}: permission denied: cannot write the {what} ({target}) there; "
                "nothing was written"
            ) from None
        remove_stale(existing)
        try:
            staging = Path(tempfile.mkdtemp(prefix=temp_prefix(target), dir=existing))
        except OSError as exc:
            raise GraphampError(
                f"{existing}: {_reason(exc)}: cannot write the {what} ({target}) there; "
                "nothing was written"
            ) from None
        self._made.append(staging)
        self._staging[folder] = staging

    def path(self, target: Path | str) -> Path:
        """Where to write ``target``'s file(s) now: companions written beside it (an ONNX
        model's external data) are moved with it."""
        target = Path(target)
        return self._staging[_folder(target)] / target.name

    def write_bytes(self, target: Path | str, data: bytes) -> None:
        self.path(target).write_bytes(data)

    def commit(self) -> None:
        """Move every staged file into its target's folder, SIGINT and SIGTERM held back until
        all are in place."""
        with signals_held():
            for folder, staging in self._staging.items():
                written = sorted(p for p in staging.iterdir() if p.is_file())
                if written:
                    folder.mkdir(parents=True, exist_ok=True)
                for path in written:
                    os.replace(path, folder / path.name)

    def _remove(self) -> None:
        for staging in self._made:
            shutil.rmtree(staging, ignore_errors=True)
        self._made.clear()


def _folder(target: Path) -> Path:
    parent = Path(target).parent
    return Path(os.path.abspath(parent if str(parent) else "."))


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    return (exc.strerror or type(exc).__name__).lower()


@contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A path to write ``target``'s files at (in a temporary folder beside it); when the block
    ends without an error, every file written there is moved into ``target``'s folder (an
    ONNX model and its external data, say), and on an error nothing is.

    Lets a command check what it wrote (verification) before anything is in place."""
    with Outputs([("output", Path(target))]) as outputs:
        yield outputs.path(target)
        outputs.commit()


# The report formats an output file's name can say (plan, diff, debug -o FILE)
REPORT_SUFFIXES = {"json": ".json", "html": ".html"}


def report_format(path: str | Path) -> str:
    """The report format ``path``'s suffix names ("json", "html"; ".htm" too), else "text"."""
    suffix = Path(path).suffix.lower()
    return next(
        (f for f, s in REPORT_SUFFIXES.items() if suffix == s),
        "html" if suffix == ".htm" else "text",
    )
