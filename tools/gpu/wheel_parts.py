"""Python wheels too large for one transfer to a GPU machine, packed as parts that travel
one at a time and are unpacked there into a folder to put on ``PYTHONPATH``.

    python tools/gpu/wheel_parts.py pack WHEEL [WHEEL ...] --into DIR [--part-mib 56]
        [--drop GLOB ...]
    python tools/gpu/wheel_parts.py unpack DIR --into SITE

Why: the GPU machines lent to this project take at most 64 MiB of files a call, and their image
holds onnxruntime without its CUDA provider; ``onnxruntime-gpu`` (1.31.1, built for CUDA 13,
the image's torch's CUDA) is a 255 MB wheel, and issue 42's onnxruntime CUDA latency needs it.
Installed files compress better than the wheel (a zip of each file on its own): ``pack`` writes
the wheels' files, less those ``--drop`` names (say TensorRT's provider, which is not used), as
one xz-compressed tar stream cut into ``DIR/part-1/data``, ``DIR/part-2/data``... of at most
``--part-mib`` MiB each, with ``manifest.json`` (each part's size and SHA-256) in ``DIR`` and
in every part folder, so that any part carries it. Each part folder travels alone, in calls
made while the machine is still warm (it keeps what earlier calls left); ``unpack`` checks that
every part is there and whole, then extracts the files into ``SITE`` (the wheels' files as they
are, which is what Python imports: no ``.data`` folder is moved, no RECORD written) and says
what it unpacked. ``tools/gpu_check.sh`` runs it where ``ORT_GPU_PARTS`` names ``DIR``. A
mistake (a missing or damaged part, a ``--drop`` glob matching nothing, a file that is no
wheel) is one line naming it, exit status 2, and leaves no partial pack or unpacked folder.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import lzma
import math
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import BinaryIO

MANIFEST = "manifest.json"
MIB = 1 << 20
SMALLEST_PART = 64 << 10  # bytes: smaller parts only multiply the folders to carry


class PartsError(Exception):
    """A user mistake or a damaged input, said in one line."""


class _PartWriter(io.RawIOBase):
    """A write-only stream that cuts what is written into ``DIR/part-K/data`` files of at most
    ``part_bytes`` each, hashing every part and the whole as they are written."""

    def __init__(self, into: Path, part_bytes: int) -> None:
        self.into, self.part_bytes = into, part_bytes
        self.parts: list[dict[str, object]] = []
        self.whole = hashlib.sha256()
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            if self._file is None or self._written == self.part_bytes:
                self._next_part()
            assert self._file is not None
            piece = view[done : done + self.part_bytes - self._written]
            self._file.write(piece)
            self._hash.update(piece)
            self.whole.update(piece)
            self._written += len(piece)
            done += len(piece)
        return done

    def _next_part(self) -> None:
        self._finish_part()
        folder = self.into / f"part-{len(self.parts) + 1}"
        folder.mkdir(parents=True)
        self._file = open(folder / "data", "wb")  # noqa: SIM115 (closed in _finish_part)
        self._hash, self._written = hashlib.sha256(), 0

    def _finish_part(self) -> None:
        if self._file is None:
            return
        self._file.close()
        name = Path(self._file.name).parent.name
        self.parts.append({"name": name, "bytes": self._written, "sha256": self._hash.hexdigest()})
        self._file = None

    def close(self) -> None:
        self._finish_part()
        super().close()


def _members(
    wheel: Path, drop: Sequence[str], matched: set[str]
) -> Iterator[tuple[zipfile.ZipInfo, zipfile.ZipFile]]:
    """``wheel``'s files less those a ``drop`` glob matches (the globs that matched added to
    ``matched``); a name that would land outside the folder it is unpacked into is refused."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as error:
        raise PartsError(f"{wheel}: not a wheel ({error})") from None
    with archive:
        for info in archive.infolist():
            name = PurePosixPath(info.filename)
            if name.is_absolute() or ".." in name.parts:
                raise PartsError(f"{wheel}: {info.filename!r} would unpack outside its folder")
            hits = {glob for glob in drop if fnmatch.fnmatch(info.filename, glob)}
            matched |= hits
            if info.is_dir() or hits:
                continue
            yield info, archive


def _write(wheels: Sequence[Path], writer: _PartWriter, drop: Sequence[str], preset: int) -> int:
    """The wheels' files, less ``drop``'s, written as an xz-compressed tar stream to ``writer``
    (closed at the end); how many."""
    files, matched = 0, set[str]()
    with (
        lzma.open(writer, "wb", preset=preset) as stream,
        tarfile.open(fileobj=stream, mode="w|") as tar,
    ):
        for wheel in wheels:
            for info, archive in _members(wheel, drop, matched):
                entry = tarfile.TarInfo(info.filename)
                entry.size = info.file_size
                # the mode the wheel recorded, else a plain file's
                entry.mode = (info.external_attr >> 16) & 0o777 or 0o644
                with archive.open(info) as source:
                    tar.addfile(entry, source)
                files += 1
    writer.close()
    unmatched = [glob for glob in drop if glob not in matched]
    if unmatched:  # a misspelt glob would keep what it meant to leave out
        raise PartsError(f"--drop {unmatched[0]!r}: matches no file of the wheels")
    return files


def pack(
    wheels: Sequence[Path], into: Path, part_bytes: int, drop: Sequence[str] = (), preset: int = 9
) -> dict[str, object]:
    """Pack ``wheels``' files, less those matching ``drop``, into parts under ``into`` (a new
    or empty folder); the manifest written."""
    if part_bytes < SMALLEST_PART:
        raise PartsError(
            f"--part-mib: {part_bytes / MIB:g}: expected at least {SMALLEST_PART / MIB:g}"
        )
    for wheel in wheels:
        if not wheel.name.endswith(".whl"):
            raise PartsError(f"{wheel}: not a wheel (a .whl file)")
        if not wheel.is_file():
            raise PartsError(f"{wheel}: no such file")
        if not zipfile.is_zipfile(wheel):
            raise PartsError(f"{wheel}: not a wheel (not a zip archive)")
    if into.exists() and not into.is_dir():
        raise PartsError(f"{into}: not a folder")
    if into.exists() and any(into.iterdir()):
        raise PartsError(f"{into}: not empty (parts of another pack would mix with these)")
    into.mkdir(parents=True, exist_ok=True)
    writer = _PartWriter(into, part_bytes)
    try:
        files = _write(wheels, writer, drop, preset)
    except BaseException:
        writer.close()
        shutil.rmtree(into)  # no partial pack: the folder was new or empty
        raise
    manifest = {
        "wheels": [wheel.name for wheel in wheels],
        "files": files,
        "dropped": list(drop),
        "parts": writer.parts,
        "sha256": writer.whole.hexdigest(),
    }
    text = json.dumps(manifest, indent=1) + "\n"
    (into / MANIFEST).write_text(text)
    for part in writer.parts:
        (into / str(part["name"]) / MANIFEST).write_text(text)
    return manifest


def _manifest(folder: Path) -> dict:
    """The manifest of the parts under ``folder``: its own, or any part's."""
    if not folder.is_dir():
        raise PartsError(f"{folder}: no such folder of parts")
    for candidate in [folder / MANIFEST, *sorted(folder.glob(f"part-*/{MANIFEST}"))]:
        if candidate.is_file():
            try:
                manifest = json.loads(candidate.read_text())
                valid = isinstance(manifest, dict) and all(
                    isinstance(part["name"], str)
                    and "/" not in part["name"]
                    and isinstance(part["bytes"], int)
                    and isinstance(part["sha256"], str)
                    for part in manifest["parts"]
                )
            except (ValueError, KeyError, TypeError) as error:
                raise PartsError(f"{candidate}: not a manifest of parts ({error})") from None
            if not valid:
                raise PartsError(f"{candidate}: not a manifest of parts")
            return manifest
    raise PartsError(f"{folder}: no {MANIFEST} (in it or in any part-K folder): not packed parts")


def check(folder: Path) -> dict:
    """The manifest of ``folder``'s parts, once every part is there and whole."""
    manifest = _manifest(folder)
    parts = manifest["parts"]
    missing = [p["name"] for p in parts if not (folder / p["name"] / "data").is_file()]
    if missing:
        raise PartsError(
            f"{folder}: {', '.join(missing)} missing ({len(parts) - len(missing)} of "
            f"{len(parts)} parts here): carry each part before unpacking"
        )
    for part in parts:
        data = folder / part["name"] / "data"
        digest = hashlib.sha256()
        with open(data, "rb") as source:
            for block in iter(lambda: source.read(MIB), b""):
                digest.update(block)
        if data.stat().st_size != part["bytes"] or digest.hexdigest() != part["sha256"]:
            raise PartsError(
                f"{data}: damaged ({data.stat().st_size} bytes, {part['bytes']} packed; "
                "its SHA-256 differs): carry it again"
            )
    return manifest


class _Joined(io.RawIOBase):
    """The parts' data files read as one stream, in order."""

    def __init__(self, files: list[Path]) -> None:
        self._files = iter(files)
        self._current: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while True:
            if self._current is None:
                path = next(self._files, None)
                if path is None:
                    return 0
                self._current = open(path, "rb")  # noqa: SIM115 (closed at its end)
            count = self._current.readinto(buffer)
            if count:
                return count
            self._current.close()
            self._current = None

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
        super().close()


def unpack(folder: Path, site: Path) -> dict:
    """Extract the parts under ``folder`` into ``site`` (new, or an empty folder); the
    manifest. The files are extracted beside it first and moved in once all are there."""
    manifest = check(folder)
    if site.exists() and (not site.is_dir() or any(site.iterdir())):
        raise PartsError(f"{site}: not an empty folder")
    site.parent.mkdir(parents=True, exist_ok=True)
    files = [folder / p["name"] / "data" for p in manifest["parts"]]
    staging = Path(tempfile.mkdtemp(prefix=f".{site.name}-", dir=site.parent))
    try:
        with (
            _Joined(files) as joined,
            lzma.open(io.BufferedReader(joined)) as stream,
            tarfile.open(fileobj=stream, mode="r|") as tar,
        ):
            tar.extractall(staging, filter="data")
    except (OSError, EOFError, lzma.LZMAError, tarfile.TarError) as error:
        shutil.rmtree(staging)
        raise PartsError(f"{folder}: its parts did not unpack ({error})") from None
    if site.exists():
        site.rmdir()  # (empty, checked above)
    staging.rename(site)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="pack wheels' files into parts")
    packing.add_argument("wheels", nargs="+", type=Path, help="the .whl files")
    packing.add_argument("--into", type=Path, required=True, help="a new or empty folder")
    packing.add_argument(
        "--part-mib",
        type=float,
        default=56.0,
        help="the largest part, in MiB (default 56: 64 MiB a call, less this repository)",
    )
    packing.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="GLOB",
        help="leave out the wheel files this matches (repeatable), e.g. "
        "'onnxruntime/capi/libonnxruntime_providers_tensorrt.so'",
    )
    unpacking = verbs.add_parser("unpack", help="check the parts, then extract them")
    unpacking.add_argument("folder", type=Path, help="the folder pack wrote")
    unpacking.add_argument("--into", type=Path, required=True, help="where the files go")
    args = parser.parse_args(argv)
    try:
        if args.verb == "pack":
            if not math.isfinite(args.part_mib):
                raise PartsError(f"--part-mib: {args.part_mib}: expected a number of MiB")
            manifest = pack(args.wheels, args.into, int(args.part_mib * MIB), args.drop)
            sizes = ", ".join(f"{p['name']} {p['bytes'] / MIB:.1f} MiB" for p in manifest["parts"])
            print(f"packed {manifest['files']} files of {', '.join(manifest['wheels'])}: {sizes}")
        else:
            manifest = unpack(args.folder, args.into)
            print(
                f"unpacked {manifest['files']} files of {', '.join(manifest['wheels'])} "
                f"({len(manifest['parts'])} parts) into {args.into}"
            )
    except (PartsError, OSError) as error:  # an OSError names its file: one line too
        print(f"wheel_parts: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
