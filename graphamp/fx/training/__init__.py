"""Training steps as one graph, above the engine: what :func:`graphamp.fx.train_step` builds.

``step`` (:class:`TrainStep`: one process or data-parallel) and ``sharded``
(:class:`ShardedTrainStep`, over a device mesh); the step traced (``optim``, ``marks``,
``differentiate``) once per batch signature (``signatures``); the eager step graph (``eager``,
``in_place``, ``foreach``, ``bindings``).
"""
