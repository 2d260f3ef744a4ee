"""What an ONNX graph (the main graph or a body of control flow) holds, read from its protos."""

from __future__ import annotations

import onnx


def element_types(graph: onnx.GraphProto) -> dict[str, int]:
    """ONNX element type by value name for what ``graph`` itself declares (not its bodies):
    its initializers, then its value_info, inputs and outputs (a graph input's or output's
    own declaration wins over a value_info entry of the same name)."""
    types = {init.name: init.data_type for init in graph.initializer}
    for info in (*graph.value_info, *graph.input, *graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    return types
