"""Which dialect reads a file or an object.

Built-in dialects are declared here, by the import path of their class, so that finding the
dialect of an ``.onnx`` file never imports torch; another dialect registers its class with
:func:`register` (or through the ``graphamp.dialects`` entry-point group of an installed
package). A file is matched by its name's suffix, then by its first bytes, else it is read as
ONNX (a protobuf has no magic number).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from graphamp.dialects.base import Dialect
from graphamp.errors import GraphampError
from graphamp.lists import matrix_ops


@dataclass(frozen=True)
class Entry:
    """A registered dialect: its class (or the import path of it) and what it reads."""

    name: str
    target: str | type[Dialect]  # "package.module:Class", imported on first use
    suffixes: tuple[str, ...] = ()
    magic: bytes = b""  # the first bytes of its files, where they have some
    object_modules: tuple[str, ...] = ()
    lists: tuple[str, ...] = ()
    matrix_ops: frozenset[str] = frozenset()
    float8_weights: str = "stored"  # Dialect.float8_weights

    def load_class(self) -> type[Dialect]:
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            try:
                return getattr(importlib.import_module(module), attr)
            except ImportError as exc:
                raise GraphampError(
                    f"the {self.name} dialect needs {exc.name or 'a package'}, which is not "
                    f"installed (pip install torch==2.13.0, the version graphamp is tested with)"
                ) from None
        return self.target


_ENTRIES: list[Entry] = [
    Entry(
        "onnx",
        "graphamp.onnx.dialect.plugin:OnnxDialect",
        suffixes=(".onnx",),
        object_modules=("onnx", "onnx_ir"),
        lists=("onnx",),
        matrix_ops=matrix_ops("onnx"),
    ),
    Entry(
        "pt2",
        "graphamp.fx.dialect.pt2:Pt2Dialect",
        suffixes=(".pt2",),
        magic=b"PK\x03\x04",
        matrix_ops=matrix_ops("aten"),
        float8_weights="traced",
    ),
    Entry(
        "fx",
        "graphamp.fx.dialect.plugin:FxDialect",
        object_modules=("torch",),
        lists=("fx_cpu", "fx_cuda"),
        matrix_ops=matrix_ops("aten"),
        float8_weights="traced",
    ),
]
DEFAULT = "onnx"
_plugins_loaded = False


def register(dialect: type[Dialect]) -> type[Dialect]:
    """Register a dialect class (usable as a class decorator); its class attributes say which
    files and objects it takes."""
    if any(entry.name == dialect.name for entry in _ENTRIES):
        raise ValueError(f"a dialect named {dialect.name!r} is already registered")
    _ENTRIES.append(
        Entry(
            dialect.name,
            dialect,
            suffixes=dialect.suffixes,
            object_modules=dialect.object_modules,
            lists=(dialect.lists,),
            matrix_ops=dialect.matrix_ops,
            float8_weights=dialect.float8_weights,
        )
    )
    return dialect


def unregister(name: str) -> None:
    _ENTRIES[:] = [entry for entry in _ENTRIES if entry.name != name]


def entries() -> list[Entry]:
    _load_plugins()
    return list(_ENTRIES)


def _load_plugins() -> None:
    """Dialects installed packages declare under the ``graphamp.dialects`` entry points."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for point in metadata.entry_points(group="graphamp.dialects"):
        if not any(entry.name == point.name for entry in _ENTRIES):
            register(point.load())


def named(name: str, **options: object) -> Dialect:
    for entry in entries():
        if entry.name == name:
            return entry.load_class()(**options)
    known = ", ".join(entry.name for entry in entries())
    raise GraphampError(f"unknown dialect {name!r}: choose one of {known}")


def named_by_suffix(path: str | Path) -> tuple[str, str] | None:
    """(the dialect, the suffix) that ``path``'s name ends with (the longest registered
    suffix), or None: what a file of that name holds, whether or not it exists."""
    name = Path(path).name.lower()
    matches = [
        (suffix, entry.name)
        for entry in entries()
        for suffix in entry.suffixes
        if name.endswith(suffix)
    ]
    if not matches:
        return None
    suffix, dialect = max(matches, key=lambda match: len(match[0]))
    return dialect, suffix


def suffixes_of(name: str) -> tuple[str, ...]:
    """The suffixes of the files the dialect ``name`` reads and writes (none: objects only)."""
    return next((entry.suffixes for entry in entries() if entry.name == name), ())


def for_file(path: str | Path) -> Dialect:
    """The dialect of the file at ``path``: by suffix, then by first bytes, else ONNX."""
    path = Path(path)
    by_suffix = named_by_suffix(path)
    if by_suffix is not None:
        return named(by_suffix[0])
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError:
        head = b""
    if _pickled(path, head):
        raise GraphampError(
            f"{path}: a PyTorch file saved with torch.save (pickled: graphamp never unpickles a "
            "model file); export the model and convert that: torch.export.save("
            "torch.export.export(model, example_inputs), 'model.pt2'), or "
            "torch.onnx.export(model, example_inputs, 'model.onnx')"
        )
    for entry in entries():
        if entry.magic and head.startswith(entry.magic):
            return entry.load_class()()
    return named(DEFAULT)


def for_object(source: object) -> Dialect:
    """The dialect of an in-memory model (found by the package its type comes from)."""
    packages = {cls.__module__.partition(".")[0] for cls in type(source).__mro__}
    for entry in entries():
        if packages & set(entry.object_modules):
            dialect = entry.load_class()()
            if dialect.accepts(source):
                return dialect
    raise GraphampError(f"no dialect reads a {type(source).__name__}")


def for_source(source: object) -> Dialect:
    """:func:`for_file` for a path, :func:`for_object` otherwise."""
    if isinstance(source, str | Path):
        return for_file(source)
    return for_object(source)


def matrix_ops_for(lists: str) -> frozenset[str]:
    """The matrix ops of the dialect whose policies use the list family ``lists``."""
    for entry in entries():
        if lists in entry.lists:
            return entry.matrix_ops
    return frozenset()


def float8_weights_for(lists: str) -> str:
    """Which weight a static float8 product quantises (:attr:`Dialect.float8_weights`) in the
    dialect whose policies use the list family ``lists``."""
    for entry in entries():
        if lists in entry.lists:
            return entry.float8_weights
    return "stored"


def _pickled(path: Path, head: bytes) -> bool:
    """Whether the file is a torch.save file: a pickle, or a zip archive holding one and no
    torch.export program (which ``archive_format`` marks)."""
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return True  # a pickle (torch.save's legacy format)
    if not head.startswith(b"PK\x03\x04"):
        return False
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False
    return any(n.endswith("data.pkl") for n in names) and not any(
        n.endswith("archive_format") for n in names
    )
