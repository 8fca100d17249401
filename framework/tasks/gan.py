"""A GAN trained with manual optimization: two optimizers, stepped by the task itself."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from framework.config.types import PositiveInt
from framework.data.gaussian_ring import ring_centers
from framework.tasks.base import Task


class GANTask(Task):
    """Each batch: one discriminator step (real vs generated points), then one generator step
    (fool the discriminator), each under `optimization.toggle` so a loss reaches only its own
    network. Validation reports both losses and `mode_distance`, the mean distance from a
    generated point to the nearest ring centre (lower: the generator found the modes)."""

    #: the batch kinds it reads (framework/data/batch_kinds.py)
    takes_batches = ("points",)

    automatic_optimization = False

    def __init__(self, noise_dim: PositiveInt = 8, modes: PositiveInt = 8, radius: float = 2.0):
        """noise_dim: the generator's input size (the model's noise_dim); modes / radius: the
        ring the data comes from (for mode_distance)."""
        self.noise_dim = noise_dim
        self.centers = ring_centers(modes, radius)

    def optimizer_groups(self, model) -> dict:
        return {"discriminator": model.discriminator.parameters(), "generator": model.generator.parameters()}

    def training_step(self, model, batch, optimization) -> dict[str, torch.Tensor]:
        (real,) = batch
        noise = torch.randn(real.shape[0], self.noise_dim, device=real.device, dtype=real.dtype)
        with optimization.toggle("discriminator"):
            _, fake_logits, real_logits = model(noise, real)
            d_loss = (F.binary_cross_entropy_with_logits(real_logits.float(), torch.ones_like(real_logits.float()))
                      + F.binary_cross_entropy_with_logits(fake_logits.float(), torch.zeros_like(fake_logits.float())))
            optimization.backward(d_loss)
            optimization.step("discriminator")
        with optimization.toggle("generator"):
            _, fake_logits, _ = model(noise, real)
            g_loss = F.binary_cross_entropy_with_logits(fake_logits.float(), torch.ones_like(fake_logits.float()))
            optimization.backward(g_loss)
            optimization.step("generator")
        return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}

    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        (real,) = batch
        g = torch.Generator().manual_seed(real.shape[0])  # the same noise at every validation
        noise = torch.randn(real.shape[0], self.noise_dim, generator=g).to(real.device, real.dtype)
        fake, fake_logits, real_logits = model(noise, real)
        fake_logits, real_logits = fake_logits.float(), real_logits.float()
        d_loss = (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits), reduction="sum")
                  + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits), reduction="sum"))
        g_loss = F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits), reduction="sum")
        distance = torch.cdist(fake.float(), self.centers.to(fake.device)).min(dim=1).values.sum()
        return {"d_loss": d_loss.double(), "g_loss": g_loss.double(), "distance": distance.double(),
                "count": torch.tensor(float(real.shape[0]), dtype=torch.float64, device=real.device)}

    def predict_step(self, model, batch) -> dict[str, torch.Tensor]:
        """For each point: the discriminator's probability that it is real, and a generated
        point (from noise seeded by the batch size, as validation's) beside it."""
        (real,) = batch
        g = torch.Generator().manual_seed(real.shape[0])
        noise = torch.randn(real.shape[0], self.noise_dim, generator=g).to(real.device, real.dtype)
        fake, _, real_logits = model(noise, real)
        return {"real_probability": real_logits.float().sigmoid().reshape(-1), "generated": fake.float()}

    def compute_metrics(self, sums) -> dict[str, float]:
        n = sums["count"]
        return {"d_loss": (sums["d_loss"] / n).item(), "g_loss": (sums["g_loss"] / n).item(),
                "mode_distance": (sums["distance"] / n).item()}
