"""ONNX model files in and out, below the dialect: loading with type inference and saving
atomically (``files``), the model as held between the two (``proto_model``), weights left in
the file or in external data until written (``infile``, ``stream``, ``locations``, over
protobuf's wire format in ``wire``), written a tensor at a time (``external``, ``datafile``,
``writing``), every value's type in one parse (``type_view``), a model's graphs walked
(``subgraphs``), a model nothing changed in written as its own bytes (``unchanged``), and
onnx_ir models for the Python API (``ir_models``).
"""
