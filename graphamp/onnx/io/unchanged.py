"""A model a conversion changed nothing in, written as the input's own bytes.

"Nothing converted" must mean the output is the input file: writing the model back through
graphamp's writer would add what type inference found (``value_info`` dims) and change bytes
that converting again should leave alone. The file is copied as it is when it is one file
(no external data, whose file name follows the output's) that graphamp would not have changed
on reading it (nodes in topological order, no declaration that type inference contradicts,
initializers allowed outside the graph inputs by its IR version) and that
``onnx.checker.check_model(full_check=True)`` passes: graphamp writes only models the checker
passes, and a file it refuses (an output whose type lost its value, say) is written through
the writer, which declares what inference settles.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx

from graphamp.onnx.io.locations import external_data_files
from graphamp.onnx.validation import declared
from graphamp.onnx.validation.order import topologically_sorted


def copy_if_sound(source: Path, path: Path) -> bool:
    """Copy ``source`` to ``path`` (True) when it is sound as it is (module docstring)."""
    if external_data_files(source):
        return False
    try:  # by path: the checker reads the file itself (no 2 GB copy through Python)
        onnx.checker.check_model(str(source), full_check=True)
    except Exception:  # the checker's errors, and bytes it cannot parse
        return False
    try:
        proto = onnx.load(str(source), load_external_data=False)
    except Exception:
        return False
    if topologically_sorted(proto, str(source)) is not proto:
        return False
    if proto.ir_version < 4:
        inputs = {value.name for value in proto.graph.input}
        if any(tensor.name not in inputs for tensor in proto.graph.initializer):
            return False
    from graphamp.onnx.io.files import without_large_initializers as light

    if declared.checked(proto, str(source), light)[0] is not proto:
        return False
    shutil.copyfile(source, path)
    return True
