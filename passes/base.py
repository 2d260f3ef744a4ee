"""The contract every pass keeps, and the manager that runs a pipeline of them.

A pass is a small class in the spirit of onnx_ir's ``PassBase`` and torch.fx's
``PassManager``: it says which *facts* it needs (``requires``) and which it establishes
(``gives``), which dialect's ops it knows when it knows only one (``dialect``), whether it has
work on the graph at hand (``applies``), and does one job in ``run``, returning a
:class:`PassResult`.

Which passes run, and in which order, is not the passes' business: the pipelines are ordered
lists written in one place (:mod:`graphamp.passes.pipeline`), as grappler's ``Optimize()`` and
onnx_ir's ``PassManager`` have them. Where a pipeline runs one of several passes (the policy's
spread picks how precisions spread), the list holds a :class:`Choice`.

:class:`PassManager` checks the contract: when built, that each pass's ``requires`` are given by
the passes before it on every path through the list; when run, that they were established
(a pass that gives a fact may have had no work); after each pass, under ``graphamp -v`` and in
the tests, the rules every pass keeps (:mod:`graphamp.passes.invariants`). A broken one is an
:class:`InternalError` naming the pass.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from graphamp.errors import InternalError
from graphamp.passes.context import PassContext
from graphamp.passes.facts import Fact
from graphamp.passes.invariants import check_invariants

__all__ = ["CHECK_ENV", "Choice", "Fact", "Pass", "PassManager", "PassResult", "Step"]

log = logging.getLogger("graphamp.passes")

CHECK_ENV = "GRAPHAMP_CHECK_INVARIANTS"


@dataclass(frozen=True)
class PassResult:
    modified: bool
    note: str = ""


class Pass(abc.ABC):
    """One job over a :class:`PassContext` (see the module docstring)."""

    name: ClassVar[str]
    requires: ClassVar[frozenset[Fact]] = frozenset()
    gives: ClassVar[frozenset[Fact]] = frozenset()
    # The one op vocabulary it knows (a Policy.dialect: the op-list family, "onnx"); None:
    # it works on any graph. The manager skips it on graphs of another dialect.
    dialect: ClassVar[str | None] = None

    def applies(self, context: PassContext) -> bool:
        """Whether this pass has work on this context (default: always)."""
        return True

    @abc.abstractmethod
    def run(self, context: PassContext) -> PassResult: ...


@dataclass(frozen=True)
class Choice:
    """A step of a pipeline that runs one of several branches: ``pick`` names the branch
    for a context (``what`` says in words what it looks at, for errors and the docs)."""

    name: str
    what: str
    pick: Callable[[PassContext], str]
    branches: Mapping[str, Sequence[Step]]

    def branch(self, context: PassContext) -> Sequence[Step]:
        key = self.pick(context)
        if key not in self.branches:
            raise InternalError(f"step {self.name!r}: no branch for {self.what} {key!r}")
        return self.branches[key]


Step: TypeAlias = "type[Pass] | Choice"


def pass_classes(steps: Sequence[Step]) -> Iterator[type[Pass]]:
    """Every pass of ``steps``, in order, each branch of a choice in turn."""
    for step in steps:
        if isinstance(step, Choice):
            for branch in step.branches.values():
                yield from pass_classes(branch)
        else:
            yield step


def _check_requirements(steps: Sequence[Step], given: frozenset[Fact]) -> frozenset[Fact]:
    """The facts given after ``steps`` on every path (those before them: ``given``); raise
    when a pass requires a fact that some path to it does not give."""
    for step in steps:
        if isinstance(step, Choice):
            after = [_check_requirements(branch, given) for branch in step.branches.values()]
            given = frozenset.intersection(*after) if after else given
            continue
        missing = step.requires - given
        if missing:
            raise InternalError(
                f"pass {step.name!r} needs {', '.join(sorted(missing))}, which no pass before "
                "it in the pipeline gives"
            )
        given |= step.gives
    return given


class PassManager:
    """Runs a pipeline (an ordered list of passes and choices: :mod:`graphamp.passes.pipeline`),
    checking each pass's requirements, and the invariants between passes when asked.

    ``check`` defaults to on under ``graphamp -v`` (logging at INFO) and when the environment
    sets ``GRAPHAMP_CHECK_INVARIANTS=1`` (the test suite does).
    """

    def __init__(self, steps: Sequence[Step], *, check: bool | None = None) -> None:
        classes = list(pass_classes(steps))
        names = [cls.name for cls in classes]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise InternalError(f"pass {twice[0]!r} is in the pipeline twice")
        _check_requirements(steps, frozenset())
        self.steps = tuple(steps)
        self._instances = {cls: cls() for cls in classes}
        if check is None:
            check = os.environ.get(CHECK_ENV) == "1" or log.isEnabledFor(logging.INFO)
        self.check = check

    @property
    def names(self) -> list[str]:
        """The passes' names, in order, each branch of a choice in turn."""
        return [cls.name for cls in pass_classes(self.steps)]

    def run(self, context: PassContext) -> PassContext:
        if self.check:
            check_invariants(context, after="reading the graph")
        self._run(self.steps, context)
        return context

    def _run(self, steps: Sequence[Step], context: PassContext) -> None:
        for step in steps:
            if isinstance(step, Choice):
                self._run(step.branch(context), context)
            else:
                self._run_pass(self._instances[step], context)

    def _run_pass(self, current: Pass, context: PassContext) -> None:
        if current.dialect is not None and current.dialect != context.policy.dialect:
            return  # ops of a dialect it does not know
        if not current.applies(context):
            return
        missing = current.requires - context.facts
        if missing:
            raise InternalError(
                f"pass {current.name!r} needs {', '.join(sorted(missing))}, which no earlier "
                "pass established"
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
