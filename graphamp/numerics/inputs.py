"""The one generator of inputs for verification: random arrays of the declared types, never
zeros, and integer ids that stay inside the table they index.

Zeros hide unwritten outputs and wrong wiring, so float inputs are drawn from a standard normal
with exact zeros replaced; integer inputs (token ids, positions) come from ``[1, bound)``, where
``bound`` is the size of the embedding the dialect found them indexing (16 otherwise); booleans
are random. An integer input named as a mask (``attention_mask``, ``*mask*``: Hugging Face's
1 = attend) is ones, every position attended (no padding): random ids are no mask there (OPT
derives its positions from the mask's cumulative sum, past its position table). A boolean
mask keeps random values: its sense is the model's (PyTorch's ``key_padding_mask``: True =
left out). A symbolic dimension takes ``dim_size``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphamp.core import dtypes
from graphamp.errors import GraphampError

DEFAULT_INT_BOUND = 16
_INTEGERS = ("int64", "int32", "int16", "int8", "uint8")


@dataclass(frozen=True)
class InputSpec:
    """One graph input as a dialect declares it."""

    name: str
    dtype: str  # an engine dtype name
    # None: a symbolic dimension; no tuple at all: the model declares no shape (any rank, as
    # ONNX allows and onnxruntime runs)
    shape: tuple[int | None, ...] | None
    index_bound: int | None = None  # integer ids index a table of this many rows


def random_inputs(
    specs: list[InputSpec], *, seed: int = 0, dim_size: int = 2
) -> dict[str, np.ndarray]:
    """One random array per spec (float inputs as float32: runners cast to the declared type)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.shape is None:
            raise GraphampError(
                f"model input {spec.name!r} declares no shape, so no random array can be made "
                "for it: give arrays (--inputs FILE.npz, or the inputs= of the call)"
            )
        shape = [dim_size if d is None else d for d in spec.shape]
        array: np.ndarray
        if spec.dtype in dtypes.FLOAT_TYPES:
            array = rng.standard_normal(shape).astype(np.float32)
            array[array == 0] = 0.5
        elif spec.dtype in _INTEGERS and "mask" in spec.name.lower():
            array = np.ones(shape, dtypes.numpy_type(spec.dtype))
        elif spec.dtype in _INTEGERS:
            high = spec.index_bound or DEFAULT_INT_BOUND
            array = rng.integers(min(1, high - 1), high, size=shape).astype(
                dtypes.numpy_type(spec.dtype)
            )
        elif spec.dtype == "bool":
            array = rng.random(shape) < 0.5
        else:
            raise GraphampError(
                f"input {spec.name!r}: cannot make random values of type {spec.dtype}; "
                "pass --inputs FILE.npz"
            )
        feeds[spec.name] = array
    return feeds


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays by name from an ``.npz`` file (never unpickled)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise GraphampError(f"{path}: inputs file not found") from None
    except (ValueError, OSError) as exc:
        raise GraphampError(f"{path}: not an .npz file of arrays ({exc})") from None


def check_feeds(specs: list[InputSpec], feeds: dict[str, np.ndarray], where: str) -> None:
    """Refuse, naming the input, arrays that cannot feed the graph inputs ``specs`` declare:
    a missing or unknown name, the wrong number of dimensions, a fixed dimension of another
    size, or a kind of value the input cannot take (floats for integer ids, say)."""
    refuse_unknown_arrays(specs, feeds, where)
    for spec in specs:
        if spec.name not in feeds:
            raise GraphampError(f"{where}: no array for model input {spec.name!r}")
        array = np.asarray(feeds[spec.name])
        check_shape(where, spec, tuple(array.shape))
        check_type(where, spec, array.dtype)


def refuse_unknown_arrays(specs: list[InputSpec], names: Iterable[str], where: str) -> None:
    """Refuse an array named after no graph input of ``specs``."""
    declared = dict.fromkeys(spec.name for spec in specs)
    for name in names:
        if name not in declared:
            raise GraphampError(
                f"{where}: array {name!r} is no input of the model "
                f"(its inputs: {', '.join(declared) or 'none'})"
            )


def check_shape(where: str, spec: InputSpec, shape: tuple[int, ...]) -> None:
    """Refuse an array of ``shape`` for ``spec``: another number of dimensions, or a fixed
    dimension of another size (a symbolic one takes any; an input of no declared shape any
    array)."""
    if spec.shape is None:
        return
    if len(shape) != len(spec.shape) or any(
        want is not None and got != want for got, want in zip(shape, spec.shape, strict=True)
    ):
        declared = tuple("?" if d is None else d for d in spec.shape)
        raise GraphampError(
            f"{where}: input {spec.name!r} has shape {shape}, the model declares {declared}"
        )


def check_type(where: str, spec: InputSpec, dtype: np.dtype) -> None:
    """Refuse an array of ``dtype`` for ``spec`` when its kind of value cannot feed the input:
    a float input takes any number, an integer input integers, a bool input anything."""
    floats = spec.dtype in dtypes.FLOAT_TYPES
    kind = dtype.kind
    if (floats and kind not in "fiu") or (not floats and spec.dtype != "bool" and kind not in "iu"):
        raise GraphampError(
            f"{where}: input {spec.name!r} is {spec.dtype}, the array holds {dtype}"
        )
