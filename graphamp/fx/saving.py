"""Saving a converted module as a ``.pt2`` program (torch.export's format) with its plan, and
loading it back without unpickling anything (see :mod:`graphamp.fx.dialect.program` for what is
written, :mod:`graphamp.fx.dialect.pt2` for how it is read).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import fx

from graphamp.errors import GraphampError
from graphamp.fx.dialect import pt2
from graphamp.fx.dialect.capture import capture
from graphamp.fx.dialect.program import PLAN_FILE, captured_by, check_target, export, write
from graphamp.plans.plan import Plan


def save(module: fx.GraphModule, path: str | os.PathLike[str]) -> None:
    """Write ``module`` (what :func:`graphamp.fx.convert` returned) to ``path`` (``*.pt2``)
    as a torch.export program with its plan; atomic, and nothing is written on error."""
    path = Path(path)
    check_target(path)
    captured = captured_by(module)
    write(export(module), path, captured.plan)


def load(path: str | os.PathLike[str]) -> tuple[fx.GraphModule, Plan | None]:
    """The module saved at ``path`` and its plan (None for a program graphamp did not write),
    read without unpickling anything."""
    extra: dict[str, str] = {PLAN_FILE: ""}
    program = pt2.load(path, extra_files=extra)
    plan = None
    if extra[PLAN_FILE]:
        where = f"{path} ({PLAN_FILE})"
        try:
            data = json.loads(extra[PLAN_FILE])
        except json.JSONDecodeError as exc:
            raise GraphampError(f"{where}: not a JSON plan: {exc}") from None
        plan = Plan.from_dict(data, where=where)
    module = capture(program, None)
    module.meta["graphamp"].plan = plan
    return module, plan
