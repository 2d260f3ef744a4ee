"""The contract every pass keeps, and the manager that runs them.

A pass is a small class in the spirit of onnx_ir's ``PassBase`` and torch.fx's
``PassManager``: it says which *facts* it needs (``requires``) and which it establishes
(``gives``), whether it applies to the graph at hand (``applies``), and does one job in
``run``, returning a :class:`PassResult`. A pass whose facts are all established already
(by an alternative pass that ran first) is skipped. Passes register themselves with
:func:`register`; the manager orders every registered pass by those declarations (a pass runs
after the passes giving what it requires, and after/before the passes it names), so a new
pass is added by writing it, not by editing a hand-written chain.

Between passes, in tests and under ``graphamp -v``, the manager checks the rules every pass
keeps (:mod:`graphamp.passes.invariants`); a broken rule is an :class:`InternalError` naming
the pass that broke it.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from dataclasses import dataclass
from typing import ClassVar

import networkx as nx

from graphamp.errors import InternalError
from graphamp.passes.context import PassContext
from graphamp.passes.facts import Fact
from graphamp.passes.invariants import check_invariants

log = logging.getLogger("graphamp.passes")

CHECK_ENV = "GRAPHAMP_CHECK_INVARIANTS"


@dataclass(frozen=True)
class PassResult:
    modified: bool
    note: str = ""


class Pass(abc.ABC):
    """One job over a :class:`PassContext` (see the module docstring)."""

    name: ClassVar[str]
    # Which graphs it works on: "model" (a model to convert) or "step" (a training step).
    pipeline: ClassVar[str] = "model"
    requires: ClassVar[frozenset[Fact]] = frozenset()
    gives: ClassVar[frozenset[Fact]] = frozenset()
    after: ClassVar[tuple[str, ...]] = ()  # run after these passes when both apply
    before: ClassVar[tuple[str, ...]] = ()  # run before these passes when both apply

    def applies(self, context: PassContext) -> bool:
        """Whether this pass has work on this context (default: always)."""
        return True

    @abc.abstractmethod
    def run(self, context: PassContext) -> PassResult: ...


_REGISTRY: list[type[Pass]] = []


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make ``cls`` part of every pipeline the manager builds."""
    if any(existing.name == cls.name for existing in _REGISTRY):
        raise ValueError(f"a pass named {cls.name!r} is already registered")
    _REGISTRY.append(cls)
    return cls


def registered() -> list[type[Pass]]:
    return list(_REGISTRY)


def order(passes: list[type[Pass]]) -> list[type[Pass]]:
    """``passes`` sorted by their declarations; ties keep registration order."""
    by_name = {p.name: p for p in passes}
    rank = {p.name: index for index, p in enumerate(passes)}
    dependencies = nx.DiGraph()
    dependencies.add_nodes_from(by_name)
    for later in passes:
        for earlier in passes:
            if earlier is not later and later.requires & earlier.gives:
                dependencies.add_edge(earlier.name, later.name)
        for name in later.after:
            if name in by_name:
                dependencies.add_edge(name, later.name)
        for name in later.before:
            if name in by_name:
                dependencies.add_edge(later.name, name)
    try:
        names = list(nx.lexicographical_topological_sort(dependencies, key=rank.__getitem__))
    except nx.NetworkXUnfeasible:
        cycle = " -> ".join(a for a, _ in nx.find_cycle(dependencies))
        raise InternalError(f"the passes' declarations form a cycle: {cycle}") from None
    return [by_name[name] for name in names]


class PassManager:
    """Runs passes in declaration order, checking the invariants between them when asked.

    ``check`` defaults to on under ``graphamp -v`` (logging at INFO) and when the environment
    sets ``GRAPHAMP_CHECK_INVARIANTS=1`` (the test suite does).
    """

    def __init__(
        self,
        passes: list[type[Pass]] | None = None,
        *,
        pipeline: str = "model",
        check: bool | None = None,
    ) -> None:
        if passes is None:
            passes = [cls for cls in registered() if cls.pipeline == pipeline]
        self.passes = [cls() for cls in order(passes)]
        if check is None:
            check = os.environ.get(CHECK_ENV) == "1" or log.isEnabledFor(logging.INFO)
        self.check = check

    def run(self, context: PassContext) -> PassContext:
        if self.check:
            check_invariants(context, after="reading the graph")
        for current in self.passes:
            if current.gives and current.gives <= context.facts:
                continue  # an alternative pass established all it would give
            if not current.applies(context):
                continue
            missing = current.requires - context.facts
            if missing:
                raise InternalError(
                    f"pass {current.name!r} needs {', '.join(sorted(missing))}, which no "
                    "earlier pass established"
                )
            start = time.perf_counter()
            result = current.run(context)
            context.seconds[current.name] = time.perf_counter() - start
            context.facts |= current.gives
            log.info(
                "pass %s: %s in %.3f s%s",
                current.name,
                "modified" if result.modified else "no change",
                context.seconds[current.name],
                f" ({result.note})" if result.note else "",
            )
            if self.check:
                check_invariants(context, after=f"pass {current.name!r}")
        return context
