"""A ResNet-50-style CNN: bottleneck blocks [3, 4, 6, 3], batch norm, global average pool."""

from __future__ import annotations

from typing import TypedDict

import torch
from torch import nn


class Size(TypedDict):
    blocks: tuple[int, int, int, int]  # bottleneck blocks in each of the four stages
    width: int
    image: int
    batch: int
    classes: int


SIZES: dict[str, Size] = {
    "full": {"blocks": (3, 4, 6, 3), "width": 64, "image": 224, "batch": 8, "classes": 1000},
    "small": {"blocks": (1, 1, 1, 1), "width": 8, "image": 32, "batch": 2, "classes": 10},
}


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        outputs = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(inputs, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, outputs, 1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(
        self, blocks: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        stages: list[nn.Module] = []
        channels = width
        for index, count in enumerate(blocks):
            stage_width = width * 2**index
            for block in range(count):
                stride = 2 if block == 0 and index > 0 else 1
                stages.append(Bottleneck(channels, stage_width, stride))
                channels = stage_width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def build(size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    c = SIZES[size]
    model = ResNet(c["blocks"], c["width"], c["classes"])
    return model, (torch.randn(c["batch"], 3, c["image"], c["image"]),)
