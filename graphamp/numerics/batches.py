"""Data for the numerics commands (``--inputs DATA``): batches of feeds from ``.npz`` files.

DATA is an ``.npz`` file with one array per graph input, or a folder of such files (read in
name order). Each file is one batch, its arrays fed as they are (a 0-d array for a scalar input,
a state whose batch is on another axis as it is), checked against the shapes the model declares.
Only where every input declares one fixed first dimension and every array of the file holds a
multiple of it along its first axis is the file split into batches of that size (a batch-1
model's calibration data in one file). Every file is checked before any array is read (names,
shapes and types come from the ``.npy`` headers), so a bad file is refused in one line before
work starts; arrays are then read one file at a time and never unpickled.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphamp.errors import GraphampError
from graphamp.numerics.inputs import (
    InputSpec,
    check_feeds,
    check_shape,
    check_type,
    load_npz,
    refuse_unknown_arrays,
)

Feeds = dict[str, np.ndarray]
DataSource = str | os.PathLike[str] | Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class _File:
    path: Path
    rows: int  # along the first axis, where the file is split (else 1)
    batch: int  # rows per batch; 0: the file is one batch


class InputBatches:
    """The batches of a DATA path, checked: iterable any number of times; ``len()`` batches."""

    def __init__(self, path: Path, files: list[_File]) -> None:
        self.path = path
        self._files = files

    def __len__(self) -> int:
        return sum(f.rows // f.batch if f.batch else 1 for f in self._files)

    def __iter__(self) -> Iterator[Feeds]:
        for file in self._files:
            arrays = load_npz(file.path)
            if not file.batch:
                yield arrays
                continue
            for start in range(0, file.rows, file.batch):
                yield {name: array[start : start + file.batch] for name, array in arrays.items()}


def load_input_batches(path: str | os.PathLike[str], specs: list[InputSpec]) -> InputBatches:
    """The batches in ``path`` (an ``.npz`` file or a folder of them) for a model whose graph
    inputs are ``specs``; every file is checked first (see the module docstring)."""
    path = Path(path)
    if path.is_dir():
        paths = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
        if not paths:
            raise GraphampError(f"{path}: no .npz files in this folder")
    elif path.is_file():
        paths = [path]
    else:
        raise GraphampError(f"{path}: inputs file or folder not found")
    return InputBatches(path, [_check_file(p, _headers(p), specs) for p in paths])


def as_batches(
    data: DataSource, specs: list[InputSpec], where: str = "data"
) -> list[Feeds] | InputBatches:
    """The batches of ``data``: a DATA path, one feed dict, or an iterable of feed dicts (each
    checked against ``specs``)."""
    if isinstance(data, str | os.PathLike):
        return load_input_batches(data, specs)
    batches = [dict(data)] if isinstance(data, Mapping) else [dict(feeds) for feeds in data]
    if not batches:
        raise GraphampError(f"{where}: no batches")
    for index, feeds in enumerate(batches):
        check_feeds(specs, feeds, f"{where} (batch {index})")
    return batches


def _headers(file: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and type of each array in ``file``, from the ``.npy`` headers (no data read)."""
    headers = {}
    try:
        with zipfile.ZipFile(file) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    raise GraphampError(f"{file}: {member!r} is not an array (.npy)")
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(stream)
                headers[member[: -len(".npy")]] = (tuple(shape), np.dtype(dtype))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise GraphampError(f"{file}: not an .npz file of arrays ({exc})") from None
    if not headers:
        raise GraphampError(f"{file}: holds no arrays")
    for name, (_, dtype) in headers.items():
        if dtype.hasobject:
            raise GraphampError(
                f"{file}: array {name!r} holds Python objects, which graphamp never unpickles"
            )
    return headers


def _check_file(
    file: Path, headers: dict[str, tuple[tuple[int, ...], np.dtype]], specs: list[InputSpec]
) -> _File:
    """Refuse, naming the file and the input, arrays that cannot feed the graph inputs."""
    refuse_unknown_arrays(specs, headers, str(file))
    for spec in specs:
        if spec.name not in headers:
            raise GraphampError(f"{file}: no array for model input {spec.name!r}")
        check_type(str(file), spec, headers[spec.name][1])
    for name, (shape, _) in headers.items():
        if 0 in shape:
            raise GraphampError(f"{file}: array {name!r} holds no values (shape {shape})")
    _check_ids(file, specs)
    batch = _fixed_batch(specs)
    rows = {shape[0] if shape else None for shape, _ in headers.values()}
    if batch is not None and len(rows) == 1:
        total = rows.pop()
        if total is not None and total != batch and total % batch == 0:
            # more rows than the model's fixed batch: split, each batch checked for its shape
            for spec in specs:
                check_shape(str(file), spec, (batch, *headers[spec.name][0][1:]))
            return _File(file, total, batch)
    for spec in specs:  # fed as it is
        check_shape(str(file), spec, headers[spec.name][0])
    return _File(file, 1, 0)


def _fixed_batch(specs: list[InputSpec]) -> int | None:
    """The fixed size of the inputs' first axis, when every input declares the same one (a
    scalar input declares none)."""
    sizes = {spec.shape[0] if spec.shape else None for spec in specs}
    size = sizes.pop() if len(sizes) == 1 else None
    return size if isinstance(size, int) else None


def _check_ids(file: Path, specs: list[InputSpec]) -> None:
    """Integer ids that index a table (an embedding) must fall inside it, as Gather wants
    (-rows to rows - 1): onnxruntime stops on the first that does not. Only these arrays are
    read here."""
    bounded = [spec for spec in specs if spec.index_bound and spec.dtype != "bool"]
    if not bounded:
        return
    with np.load(file, allow_pickle=False) as archive:
        for spec in bounded:
            ids, bound = archive[spec.name], spec.index_bound
            if bound is None or ids.dtype.kind not in "iu" or ids.size == 0:
                continue
            low, high = int(ids.min()), int(ids.max())
            if low < -bound or high >= bound:
                bad = high if high >= bound else low
                raise GraphampError(
                    f"{file}: array {spec.name!r} holds id {bad}, beyond the {bound} rows of the "
                    f"table it indexes (ids must lie in {-bound} to {bound - 1})"
                )
