"""What tests of the eager step's passes check of a step against its twin built without the
pass: the same trained state bit for bit, and the same form handed to ``torch.compile``."""

from __future__ import annotations

import torch

from graphamp.fx.training import eager
from graphamp.fx.training.step import TrainStep


def assert_same_state_and_compile_form(step: TrainStep, twin: TrainStep) -> None:
    """``step``'s parameters and optimizer state equal ``twin``'s bit for bit, and the
    functional graphs both hand ``torch.compile`` call the same ops in the same order."""
    for name, value in step.params.items():
        assert torch.equal(value, twin.params[name]), name
    for key, value in step.opt_state.items():
        assert torch.equal(value, twin.opt_state[key]), key
    forms = [eager.for_compile(s.graph) for s in (step, twin)]  # type: ignore[arg-type]
    ours, theirs = ([str(n.target) for n in form.graph.nodes] for form in forms)
    assert ours == theirs
