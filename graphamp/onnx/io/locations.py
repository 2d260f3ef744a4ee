"""The external data files an ONNX model file names, found without parsing the model.

A tensor stored outside the model names its file in an ``external_data`` entry whose key is
``location``; serialized, such an entry is the bytes ``0a 08 'location' 12 <length> <path>``.
Scanning the file for them costs a fraction of parsing it, which matters for a model of
gigabytes checked before any work (``graphamp.cli.files``); a match inside raw weight bytes
would need those twelve bytes and a valid path after them, and at worst names a file that a
command then refuses to write over. The file is read a block at a time into one buffer (a
memory map of it would leave every page it touched resident: the whole model, for a model that
keeps its weights inside).
"""

from __future__ import annotations

from pathlib import Path

_ENTRY = b"\x0a\x08location\x12"


_BLOCK = 8 << 20
_LONGEST = len(_ENTRY) + 5 + 4096  # an entry, its length, the longest name taken


def external_data_files(path: Path) -> list[Path]:
    """The files (beside ``path``, as the model names them) its tensors' data are in."""
    found: dict[Path, None] = {}
    try:
        with open(path, "rb", buffering=0) as file:
            tail = b""
            while True:
                block = file.read(_BLOCK)
                data = tail + block
                # an entry starting in the last _LONGEST bytes may go on in the next block
                limit = len(data) if not block else len(data) - _LONGEST
                at = data.find(_ENTRY)
                while 0 <= at < limit:
                    start = at + len(_ENTRY)
                    length, start = _varint(data, start)
                    if 0 < length <= 4096:
                        name = _text(data[start : start + length])
                        if name:
                            found[path.parent / name] = None
                    at = data.find(_ENTRY, start)
                if not block:
                    break
                tail = data[max(limit, 0) :]
    except (OSError, ValueError):  # unreadable: loading the model says what is wrong
        return []
    return list(found)


def _varint(data: bytes, at: int) -> tuple[int, int]:
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
