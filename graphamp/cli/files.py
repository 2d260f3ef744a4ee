"""The files a command reads and writes, checked before any work by one mechanism for every
command.

Each command module has ``files(args) -> Files``, naming what it reads (models with their
companion files, such as an ONNX model's external data; ``--inputs`` and ``--calibrate``
data, files or folders; ``--config``, ``--from-plan``, ``--baseline``, ...) and what it writes
(``-o``, ``--plan``, ``--update``'s baselines, ``demo --keep``'s files). Before the command
runs, :func:`graphamp.cli.main` refuses, in one line with exit status 2:

* a path written that is a path read, or that another write of the same command names,
  compared by identity: the resolved path (symlinks followed), and for files that exist,
  device and inode (a hard link is the same file);
* a file read that cannot be read (permission denied), or is no regular file (a pipe or a
  device: opening one waits for a writer, reading one never ends);
* a path written that is a folder, or in a folder that does not exist or cannot be written,
  or that exists and is no regular file or a symbolic link (the rename into place below would
  replace ``/dev/null`` or the link itself).

An empty value, which ``if path`` here would take for "not given", never gets this far:
:func:`graphamp.cli.main` refuses any empty value on the command line first.

Then every write goes through one :class:`graphamp.core.io.Outputs` (``args.outputs``): staged
beside its target and moved into place, all together, when the command returns; on an error
nothing is written.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from graphamp.core.io import same_file
from graphamp.errors import GraphampError

MAX_FOLDER_FILES = 100_000  # files of a folder read that are compared with the writes


@dataclass
class Files:
    """What one command reads and writes, as (what, path) pairs: ``what`` names the argument
    in messages (``-o``, ``--plan``, ``the model IN``)."""

    reads: list[tuple[str, Path]] = field(default_factory=list)
    writes: list[tuple[str, Path]] = field(default_factory=list)
    companions: list[tuple[str, Path]] = field(default_factory=list)  # written with a write
    new_folders: bool = False  # a written file's folder may not exist yet (created)

    def read(self, what: str, path: str | os.PathLike[str] | None) -> Files:
        """A file or folder read as it is (data, a policy or plan file)."""
        if path:
            self.reads.append((what, Path(path)))
        return self

    def read_model(self, what: str, path: str | os.PathLike[str] | None) -> Files:
        """A model file (or plan file) with every file it consists of (external data). A
        folder is refused here: the commands that take one (convert, plan, check) list its
        model files themselves."""
        if path and Path(path).is_dir():
            raise GraphampError(
                f"{path}: {what} is a folder; this command takes one model file there "
                "(graphamp convert, plan and check take a folder of models)"
            )
        if path:
            for index, part in enumerate(_model_files(Path(path))):
                self.reads.append((what if index == 0 else f"{what}'s data file", part))
        return self

    def write(self, what: str, path: str | os.PathLike[str] | None) -> Files:
        if path:
            self.writes.append((what, Path(path)))
        return self

    def write_model(
        self, what: str, path: str | os.PathLike[str] | None, model: str | os.PathLike[str]
    ) -> Files:
        """A model written by the dialect of ``model``, with the files it may write beside it
        (an ONNX model's external data file). A name whose suffix is another dialect's is
        refused: the suffix names the format (``-o out.pt2`` for an ONNX model)."""
        if path:
            _check_suffix(what, Path(path), Path(model))
            self.writes.append((what, Path(path)))
            for part in _written_files(Path(path), Path(model))[1:]:
                self.companions.append((f"{what}'s data file", part))
        return self

    def check(self) -> None:
        """Refuse (GraphampError) what the module docstring lists, before any work."""
        reads = [(what, part) for what, path in self.reads for part in _expanded(path)]
        for what, path in reads:
            _check_readable(what, path)
        writes = self.writes + self.companions
        for what, path in self.writes:
            if _kind(path, what) == "folder":
                raise GraphampError(f"{path}: is a folder; {what} needs a file name")
            if not self.new_folders and _kind(_folder(path), what) != "folder":
                raise GraphampError(f"{path}: folder {_folder(path)} does not exist")
        for index, (what, path) in enumerate(writes):
            for read_what, read in reads:
                link = same_file(path, read)
                if link is not None:
                    which = f"{read_what} ({read}{link})" if link else read_what
                    raise GraphampError(
                        f"{path}: {what} would overwrite {which}; graphamp never writes over "
                        "a file it reads; nothing was written"
                    )
            for other_what, other in writes[:index]:
                link = same_file(path, other)
                if link is not None:
                    raise GraphampError(
                        f"{path}: {other_what} and {what} name the same file{link}; "
                        "give each its own; nothing was written"
                    )
        for what, path in writes:  # (after: writing over a file read says so first)
            _check_replaceable(what, path)


def _check_replaceable(what: str, path: Path) -> None:
    """Refuse an output that exists and is no regular file: graphamp stages each output and
    renames it into place, which would replace a device (``/dev/null``), a pipe or a symbolic
    link itself, not write through it."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return  # nothing there yet (a missing folder is refused below)
    if stat.S_ISLNK(mode):
        raise GraphampError(
            f"{path}: is a symbolic link (to {os.readlink(path)}); graphamp writes each output "
            f"whole and would replace the link: give {what} the file's own path"
        )
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise GraphampError(
            f"{path}: is not a regular file (a device or a pipe); graphamp writes {what} as a "
            "file and would replace it: give a file name"
        )


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _kind(path: Path, what: str) -> str:
    """ "file", "folder", "" (nothing there) or "other"; a path in a folder the user may not
    enter is refused, naming it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ""
    except PermissionError:
        raise GraphampError(f"{path}: permission denied: cannot reach {what}") from None
    except OSError:
        return ""
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def _model_files(path: Path) -> list[Path]:
    """``path`` and the files its dialect reads with it (none when it is not a model file
    that exists: reading it will say what is wrong)."""
    try:
        if not path.is_file():
            return [path]
    except OSError:  # a folder it may not enter: the check says so
        return [path]
    from graphamp.dialects.registry import for_file
    from graphamp.plans.plan import is_plan_file

    if is_plan_file(path):
        return [path]
    try:
        return [path, *(p for p in for_file(path).files(path) if p != path)]
    except (GraphampError, OSError):  # unreadable or not a model: the command says so
        return [path]


def _check_suffix(what: str, path: Path, model: Path) -> None:
    """Refuse ``path`` for a model of ``model``'s dialect when its suffix names another's."""
    from graphamp.dialects.registry import for_file, named_by_suffix, suffixes_of

    by_suffix = named_by_suffix(path)
    if by_suffix is None:
        return
    try:
        written = for_file(model).name
    except (GraphampError, OSError):  # unreadable or not a model: the command says so
        return
    if by_suffix[0] == written:
        return
    own = suffixes_of(written)
    rename = f": name it {path.name[: -len(by_suffix[1])]}{own[0]}" if own else ""
    raise GraphampError(
        f"{path}: {what} ends in {by_suffix[1]}, which names the {by_suffix[0]} format, but "
        f"{model} converts to {written} (the suffix names the format){rename}"
    )


def _written_files(path: Path, model: Path) -> list[Path]:
    from graphamp.dialects.registry import for_file

    try:
        return for_file(model).written_files(path)
    except (GraphampError, OSError):
        return [path]


def _expanded(path: Path) -> list[Path]:
    """A folder read as the files in it (and below); a file as itself."""
    try:
        if not path.is_dir():
            return [path]
    except OSError:
        return [path]
    from graphamp.dialects.folders import is_folder_member  # (numpy: not for --help)

    found = [path]
    try:
        for root, _, names in os.walk(path):
            # (what a model folder leaves out is not read: a pipe, a device, a dangling link)
            found.extend(
                Path(root) / name for name in sorted(names) if is_folder_member(Path(root) / name)
            )
            if len(found) > MAX_FOLDER_FILES:
                break
    except OSError:
        pass
    return found


def _check_readable(what: str, path: Path) -> None:
    kind = _kind(path, what)
    if kind == "other":  # opening a pipe blocks until a writer comes; a device never ends
        raise GraphampError(
            f"{path}: {what} is not a regular file (a pipe or a device); give a file"
        )
    try:
        if kind == "folder":
            os.listdir(path)
        elif kind:
            with open(path, "rb"):
                pass
    except PermissionError:
        raise GraphampError(f"{path}: permission denied: cannot read {what}") from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise GraphampError(f"{path}: permission denied: cannot read {what}") from None
