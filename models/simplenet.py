"""The seeds' SimpleNet: three Linear layers with ReLU between them (full size 4096 wide)."""

from __future__ import annotations

import torch
from torch import nn

SIZES = {"full": {"width": 4096, "batch": 512}, "small": {"width": 64, "batch": 8}}


class SimpleNet(nn.Module):
    def __init__(self, width: int = 4096, layers: int = 3) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        for index in range(layers):
            blocks.append(nn.Linear(width, width))
            if index < layers - 1:
                blocks.append(nn.ReLU())
        self.layers = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build(size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = SIZES[size]
    return SimpleNet(config["width"]), (torch.randn(config["batch"], config["width"]),)
