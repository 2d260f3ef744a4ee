"""Random token ids stay inside an embedding table stored quantised: onnxruntime's
quantize_static stores a BERT's token-type table (2 rows) as integers read through a
DequantizeLinear, and ids up to 16 made the float32 model itself fail on random inputs
(Gather: indices out of bounds), so --verify refused to verify it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graphamp.numerics.verify import random_inputs


def quantised_embeddings(through: str) -> onnx.ModelProto:
    """ids -> Gather(DequantizeLinear(int8 table of 2 rows)) (``through`` "Cast": a Cast
    between them too) -> MatMul."""
    rng = np.random.default_rng(0)
    table = rng.integers(-100, 100, size=(2, 8), dtype=np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["table_q", "scale"], ["table"])]
    if through == "Cast":
        nodes.append(helper.make_node("Cast", ["table"], ["table_c"], to=TensorProto.FLOAT))
    nodes += [
        helper.make_node("Gather", [nodes[-1].output[0], "ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "quantised_embeddings",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 8])],
        [
            numpy_helper.from_array(table, "table_q"),
            numpy_helper.from_array(np.array(0.01, np.float32), "scale"),
            numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_ids_into_a_dequantised_table_stay_inside_it():
    for through in ("DequantizeLinear", "Cast"):
        proto = quantised_embeddings(through)
        feeds = random_inputs(proto)
        assert (feeds["ids"] == 1).all(), feeds["ids"]  # ids from [1, 2)
        session = ort.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        session.run(None, feeds)
