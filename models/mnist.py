"""The seeds' MNIST CNN: two convolutions with batch norm, max pooling, two Linears, softmax."""

from __future__ import annotations

import torch
from torch import nn

SIZES = {"full": {"batch": 64}, "small": {"batch": 4}}


class MnistCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(9216, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.classifier(self.features(x)), dim=-1)


def build(size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return MnistCNN(), (torch.randn(SIZES[size]["batch"], 1, 28, 28),)
