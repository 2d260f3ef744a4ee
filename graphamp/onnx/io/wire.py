"""Protobuf's wire format: as much as graphamp needs to find where a model file keeps its
weights without parsing them, and to write fields around data it streams.

A message is a sequence of fields, each a varint key (field number << 3 | wire type) and a value:
a varint (type 0), 8 or 4 bytes (types 1 and 5), or a varint length and that many bytes (type
2: strings, bytes and nested messages). protobuf serialises a message's known fields in field
number order, then its unknown fields: :mod:`graphamp.onnx.io.infile` relies on that order to put
a tensor's ``raw_data`` back where protobuf would write it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import NamedTuple, Protocol

LENGTH_DELIMITED = 2


class WireError(ValueError):
    """The bytes are no well-formed message (the caller hands them to protobuf instead, whose
    error says what is wrong)."""


class Field(NamedTuple):
    """One field of a message: its number and wire type; ``start`` is where its key begins,
    ``data`` where its value (a length-delimited field's payload) begins, ``end`` where it
    ends. A varint field's ``value`` is the number (0 for the others)."""

    number: int
    wire_type: int
    start: int
    data: int
    end: int
    value: int = 0


class Readable(Protocol):
    """What :func:`fields` reads: bytes, a memory map, or a window onto a file (slices)."""

    def __getitem__(self, index: slice, /) -> bytes: ...


def read_varint(buffer: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` of ``buffer`` and the position after it."""
    result = shift = 0
    end = len(buffer)
    while True:
        if position >= end or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7


_HEAD = 21  # a key and a length: two varints of at most 10 bytes (+1 spare)


def fields(buffer: Readable, start: int, end: int) -> Iterator[Field]:
    """The fields of the message in ``buffer[start:end]``, in order (each read with one slice
    of its first bytes: a file window serves them without reading the values)."""
    position = start
    while position < end:
        head = buffer[position : min(position + _HEAD, end)]
        key, after_key = read_varint(head, 0)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        data, value = position + after_key, 0
        if wire_type == LENGTH_DELIMITED:
            length, used = read_varint(head, after_key)
            data = position + used
            finish = data + length
        elif wire_type == 0:
            value, used = read_varint(head, after_key)
            finish = position + used
        elif wire_type == 1:
            finish = data + 8
        elif wire_type == 5:
            finish = data + 4
        else:  # groups (3, 4) are not in ONNX's schema; 6 and 7 do not exist
            raise WireError(f"wire type {wire_type}")
        if finish > end:
            raise WireError("a field runs past the end of its message")
        yield Field(number, wire_type, position, data, finish, value)
        position = finish


@functools.cache  # lengths repeat: a name's, a type's
def varint(value: int) -> bytes:
    """``value`` as a varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(number: int, wire_type: int = LENGTH_DELIMITED) -> bytes:
    """A field's key."""
    return varint(number << 3 | wire_type)


def header(number: int, length: int) -> bytes:
    """The key and length of a length-delimited field whose payload is ``length`` bytes."""
    return key(number) + varint(length)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: key, length, payload."""
    return header(number, len(payload)) + payload
