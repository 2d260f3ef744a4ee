"""The external data files an ONNX model file names, found without parsing the model.

A tensor stored outside the model names its file in an ``external_data`` entry whose key is
``location``; serialized, such an entry is the bytes ``0a 08 'location' 12 <length> <path>``.
Scanning the file for them (memory-mapped) costs a fraction of parsing it, which matters for a
model of gigabytes checked before any work (``graphamp.cli.files``); a match inside raw weight
bytes would need those twelve bytes and a valid path after them, and at worst names a file
that a command then refuses to write over.
"""

from __future__ import annotations

import mmap
from pathlib import Path

_ENTRY = b"\x0a\x08location\x12"


def external_data_files(path: Path) -> list[Path]:
    """The files (beside ``path``, as the model names them) its tensors' data are in."""
    found: dict[Path, None] = {}
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(_ENTRY)
            while at >= 0:
                start = at + len(_ENTRY)
                length, start = _varint(data, start)
                if 0 < length <= 4096:
                    name = _text(data[start : start + length])
                    if name:
                        found[path.parent / name] = None
                at = data.find(_ENTRY, start)
    except (OSError, ValueError):  # empty or unreadable: loading the model says what is wrong
        return []
    return list(found)


def _varint(data: mmap.mmap, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data) and shift < 35:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    return -1, at


def _text(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() and "\x00" not in text else None
