"""Running ONNX models, and the numerics tools built on it: verification runs and the runtime
check (``runtime``), onnxruntime sessions for the tools (``session``), the faithful evaluator
(``emulate``; ``switchable``, one session for many plans), statistics computed inside the graph
(``statgraph``, with ``body_stats`` and ``body_values`` for values inside bodies); the tools:
``calibration`` (``calibrate``), ``debugging`` (``debug``), ``tuning`` (``tune``) and
``fp8_tuning`` (``tune --fp8``).
"""
