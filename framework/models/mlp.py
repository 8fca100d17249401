"""A multi-layer perceptron classifier."""
from __future__ import annotations

from torch import nn

from framework.config.types import NonNegativeFloat, PositiveInt


class MLP(nn.Module):
    """`depth` hidden layers of `hidden` units with ReLU (and optional dropout), then a linear
    layer to `num_classes` logits."""

    #: the layers strategy=pipeline divides into stages (framework/construction/stage_modules.py)
    pipeline_layers = "net"

    def __init__(self, in_features: PositiveInt = 64, hidden: PositiveInt = 128, depth: PositiveInt = 2,
                 num_classes: PositiveInt = 10, dropout: NonNegativeFloat = 0.0):
        """in_features: input size; hidden: width; depth: hidden layers; num_classes: outputs;
        dropout: probability after each hidden layer."""
        super().__init__()
        layers, width = [], in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
