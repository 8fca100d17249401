"""A small GAN for 2-D points: a generator and a discriminator in one module, so a strategy
wraps (DDP) or shards (FSDP) both, and one forward serves both optimizers' steps."""
from __future__ import annotations

import torch
from torch import nn

from framework.config.types import PositiveInt


def _mlp(sizes: list[int], activation) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class Generator(nn.Module):
    def __init__(self, noise_dim: int, hidden: int, depth: int):
        super().__init__()
        self.net = _mlp([noise_dim, *[hidden] * depth, 2], nn.ReLU)

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.net(noise)


class Discriminator(nn.Module):
    def __init__(self, hidden: int, depth: int):
        super().__init__()
        self.net = _mlp([2, *[hidden] * depth, 1], lambda: nn.LeakyReLU(0.2))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.net(points).squeeze(-1)


class GAN(nn.Module):
    """`forward(noise, real)` returns (fake points, discriminator logits of the fakes, of the real
    points). Which parameters get gradients is up to the task (ManualOptimization.toggle)."""

    sharding_units = ("Generator", "Discriminator")

    def __init__(self, noise_dim: PositiveInt = 8, hidden: PositiveInt = 64, depth: PositiveInt = 2):
        """noise_dim: the generator's input size; hidden: width of both networks; depth: hidden layers of each."""
        super().__init__()
        self.generator = Generator(noise_dim, hidden, depth)
        self.discriminator = Discriminator(hidden, depth)

    def forward(self, noise: torch.Tensor, real: torch.Tensor):
        fake = self.generator(noise)
        return fake, self.discriminator(fake), self.discriminator(real)
