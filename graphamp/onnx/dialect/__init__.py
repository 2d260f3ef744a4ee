"""The ONNX dialect plugin, below the engine: what :mod:`graphamp.engine` calls through the
:class:`~graphamp.dialects.base.Dialect` interface for ONNX models. It imports neither the
engine nor the API above it (:mod:`graphamp.onnx`); it reads and writes files through
:mod:`graphamp.onnx.io`, checks models with :mod:`graphamp.onnx.validation` and runs them
with :mod:`graphamp.onnx.numerics`.

``plugin`` (:class:`OnnxDialect`); a ``ModelProto`` read into the OpGraph (``reader`` over
``graph_reader`` and ``node_reader``, with ``bodies``, ``functions``, ``handles``, ``slots``,
``schemas``, ``types``, ``kernels``, ``fusion``, ``scopes``) and an edit script applied to a
copy of it (``writer`` over ``model_edit`` and ``graph_edit``, with ``placement``,
``function_writer``, ``output_types``, and ``float8`` for the float8 tier).
"""
