"""The one error type for user mistakes: the CLI prints its message on one line and exits 2."""

from __future__ import annotations


class GraphampError(Exception):
    """Bad input or a bad option: the message names the file, node or option at fault."""


class SlowPrecisionWarning(UserWarning):
    """The chosen low-precision type has no hardware support on the target device, so the
    converted model computes correctly but slower than float32 would."""
