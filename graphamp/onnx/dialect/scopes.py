"""The module path of a node, from the metadata PyTorch's default ONNX exporter writes.

``torch.onnx.export(..., dynamo=True)`` (torch 2.13's default) names nodes after their op
(``node_MatMul_221``) and puts where each came from in the node's ``metadata_props``:
``pkg.torch.onnx.name_scopes`` is a list, from the root module down to the FX node itself,
``['', 'layers.0', 'layers.0.attention', 'layers.0.attention.query', 'linear']``. The entry
before the last is the module path (``layers.0.attention.query``), the name FX module paths
use: the readers make it the node's ``scope``, so that ``deny_names`` globs match it, the plan
records it and the viewer folds the graph by it. TorchScript's exporter (``dynamo=False``)
writes the path into the node name itself (``/layers.0/attention/query/MatMul``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

NAME_SCOPES = "pkg.torch.onnx.name_scopes"


def module_path(metadata: Mapping[str, str]) -> str:
    """The module path ``metadata`` gives ("" for none, or the root module)."""
    text = metadata.get(NAME_SCOPES)
    if not text:
        return ""
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    if not isinstance(scopes, list | tuple) or len(scopes) < 2:
        return ""
    path = scopes[-2]
    return path if isinstance(path, str) else ""


def module_path_of_entries(entries: Iterable[onnx.StringStringEntryProto]) -> str:
    """:func:`module_path` of a NodeProto's ``metadata_props`` (key/value entries)."""
    for entry in entries:
        if entry.key == NAME_SCOPES:
            return module_path({NAME_SCOPES: entry.value})
    return ""
