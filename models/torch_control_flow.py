"""Small PyTorch modules with control flow (``torch.cond``, ``torch.while_loop``,
``torch.map``), built in code with random weights: what the FX dialect's tests and
``tools/bench/bench_fx_control_flow.py`` convert.

* :class:`CondNet`: a cond whose branches each do matmul + softmax (on different weights);
* :class:`RnnNet`: a while_loop carrying a hidden state through matmul + tanh for ``steps``
  iterations (with ``bias=True``, matmul + add + tanh: the add promotes the state to float32
  under autocast, which can then run it; without, autocast refuses the loop);
* :class:`MapNet`: torch.map of linear + relu over a batch's first dimension;
* :class:`NestedNet`: a cond (in a submodule) inside a while_loop's body.

``CASES`` gives each with its example inputs (several where a cond has branches to visit).

    >>> from graphamp.models.torch_control_flow import CASES
    >>> module, inputs = CASES["cond"](16)
    >>> len(inputs)
    2
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch._higher_order_ops.map import map as torch_map


class CondNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def yes(x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.a(x) @ self.a.weight, -1)

        def no(x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.b(x) @ self.b.weight, -1)

        return torch.cond(x.sum() > 0, yes, no, (x,))


class RnnNet(nn.Module):
    def __init__(self, width: int = 16, bias: bool = False, steps: int = 8) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.b = nn.Parameter(torch.randn(width) / width**0.5) if bias else None
        self.steps = steps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        def more(i: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return i < self.steps

        def step(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            z = h @ self.w
            return i + 1, torch.tanh(z + self.b if self.b is not None else z)

        return torch.while_loop(more, step, (torch.zeros((), dtype=torch.int64), h))[1]


class MapNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        def body(x: torch.Tensor, *args: object) -> torch.Tensor:
            return torch.relu(self.lin(x))

        return torch_map(body, xs)


class Gate(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda x: torch.softmax(self.a(x), -1), lambda x: torch.relu(x), (x,)
        )


class NestedNet(nn.Module):
    def __init__(self, width: int = 16, steps: int = 3) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.gate = Gate(width)
        self.steps = steps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        def more(i: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return i < self.steps

        def step(i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, self.gate(torch.tanh(h @ self.w))

        return torch.while_loop(more, step, (torch.zeros((), dtype=torch.int64), h))[1]


def inputs(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


Build = Callable[[int], tuple[nn.Module, list[torch.Tensor]]]


def _cond(width: int) -> tuple[nn.Module, list[torch.Tensor]]:
    # one input per branch: the sum's sign picks it
    return CondNet(width).eval(), [inputs(1, 4, width).abs(), -inputs(2, 4, width).abs()]


CASES: dict[str, Build] = {
    "cond": _cond,
    "while_loop": lambda width: (RnnNet(width).eval(), [inputs(3, 4, width)]),
    "while_loop_bias": lambda width: (RnnNet(width, bias=True).eval(), [inputs(4, 4, width)]),
    "map": lambda width: (MapNet(width).eval(), [inputs(5, 3, 4, width)]),
    "cond_in_while_loop": lambda width: (NestedNet(width).eval(), [inputs(6, 4, width)]),
}
