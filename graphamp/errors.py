"""graphamp's error types: what the CLI turns into one line and an exit status; its warning
types, and :func:`warn`, which points a warning at the user's line."""

from __future__ import annotations

import difflib
import sys
import warnings
from types import FrameType


class GraphampError(Exception):
    """Bad input or a bad option: the message names the file, node or option at fault
    (exit status 2)."""


class RunFailure(GraphampError):
    """A runtime could not run a model on the inputs it was given (a value or shape the model
    does not take): the message names the runtime and says its first line."""


class InternalError(Exception):
    """graphamp produced something invalid (a broken invariant, a model the runtime refuses):
    a bug to report, never the user's mistake (exit status 3)."""


class WeightOverflow(InternalError):
    """A weight turned out, while it was being converted, to hold values the target cannot:
    only possible when its range check was left to the conversion (``speculate_weights``), which
    then starts over with every weight checked first."""

    def __init__(self, weight: str, dtype: str) -> None:
        super().__init__(f"weight {weight!r} would overflow {dtype}")
        self.weight = weight


class PolicyWarning(UserWarning):
    """A rule of the policy matches nothing in the model (a typo, the wrong case, a stale
    name): it is accepted and does nothing. ``strict=True`` / ``--strict`` makes it an error."""


class Float8Warning(UserWarning):
    """A node the plan put in float8 that the dialect cannot build in float8 here: it keeps
    the low type, and the plan's float8 decision says why."""


class SlowPrecisionWarning(UserWarning):
    """The chosen low-precision type has no hardware support on the target device, so the
    converted model computes correctly but slower than float32 would."""


class BodyWarning(UserWarning):
    """A node owns bodies graphamp does not enter (a higher-order op it does not know): they
    run as they are, in float32, and the plan says so (rule ``control_flow``)."""


class UnlistedOpWarning(UserWarning):
    """An op registered outside PyTorch (``torch.library``: a library's own, such as
    transformers' MoE experts) is in no op list, so it stays float32 (rule ``unlisted``)
    whatever it computes; naming it in ``allow``, ``infer`` or ``clear`` runs it low."""


class KeptWarning(UserWarning):
    """The module already computes some ops in a low type (a bfloat16 submodule or example
    input, or a converted module), so its float32 ops that could run low stay float32 (rule
    ``kept``), as a converted model's decisions are held."""


class ModeWarning(UserWarning):
    """A module converted in training mode (``nn.Module``'s default) holds dropout or batch
    norm: the converted module runs them as in training, and cannot be put in eval mode."""


class RecaptureWarning(UserWarning):
    """A training step was captured for many batch signatures (shapes, types): each new one
    costs a capture; padding batches to a few fixed shapes avoids it."""


class TeardownWarning(UserWarning):
    """Something keeps a torch.distributed process group alive past destroy_process_group, so
    its threads still run when the process exits (a rank can then abort)."""


class StaticShapeWarning(UserWarning):
    """A dimension graphamp.fx.convert makes dynamic by default (the first of each input of two
    or more dimensions) could not stay dynamic: the converted module runs only at the example's
    size there."""


class BackwardWarning(UserWarning):
    """The model's forward applies a custom ``torch.autograd.Function``: a graphamp training
    step differentiates the forward in its own graph, so the Function's backward is never
    called. (Gradient hooks, which it would skip too, are refused outright.)"""


class DataWarning(UserWarning):
    """Data given to calibrate or check on (``--calibrate``, ``--inputs``) holds values that
    defeat the work: NaN in an input makes every range computed from it NaN, so the range rules
    (and float8's) keep what it reaches, however the model behaves on real data."""


class RepairWarning(UserWarning):
    """A model's own declaration (a value's type or shape) contradicted type inference or was
    incomplete, and was repaired from what inference settles; the converted model says so."""


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointed at the first caller outside graphamp: the user's line, however
    deep inside graphamp the cause was found (a training step finds it on its first call,
    several frames down), so the warning names the line to change and Python's once-per-line
    filter shows it once."""
    frame: FrameType | None = sys._getframe()
    level = 1  # this function's own line
    while frame is not None and _in_graphamp(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _in_graphamp(module: str) -> bool:
    return module == "graphamp" or module.startswith("graphamp.")


def did_you_mean(name: str, choices: list[str]) -> str:
    """``"; did you mean 'Softmax'?"``: the choices closest to a name that matched none (a
    misspelt op, key or node), or one that differs only in case; "" where none is close."""
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    if not close:
        lowered = {choice.lower(): choice for choice in choices}
        close = [lowered[name.lower()]] if name.lower() in lowered else []
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
