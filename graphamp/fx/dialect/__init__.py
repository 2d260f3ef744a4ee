"""The FX dialect plugin, below the engine: what :mod:`graphamp.engine` calls through the
:class:`~graphamp.dialects.base.Dialect` interface for PyTorch models. It imports neither the
engine nor the API above it (:mod:`graphamp.fx`'s own modules, :mod:`graphamp.fx.training`).

``plugin`` (:class:`FxDialect`: modules, GraphModules, ExportedPrograms in memory) and ``pt2``
(:class:`Pt2Dialect`: ``.pt2`` files read without pickle); models captured (``capture``,
``hf``, ``samples``) and written again as programs (``program``); a GraphModule read into the
OpGraph (``reader``, ``ops``, ``hops``, ``types``, ``calibration``) and an edit script written
back (``writer``, with the nodes the passes add built in aten ops by ``lowering``,
``collectives``, ``float8_lowering``); float8 in aten ops (``float8``, ``float8_step``,
``float8_convert``).
"""
