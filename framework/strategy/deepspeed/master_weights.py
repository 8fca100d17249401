"""ZeRO-3 in float32 without a second float32 copy of each rank's partition.

DeepSpeed's stage-3 optimizer means to use the parameter partition itself as the float32 master
partition when the two already share dtype and device (its torch-autocast path). Its check
compares the partition's `torch.device` with the accelerator's device *name*, a string, which is
never equal, so every float32 run keeps a second copy: 4 more bytes per parameter / N on every
rank (190 MiB of 950 per rank for a 100M GPT at 2 ranks). `shared_master_partitions()` makes
that check see a `torch.device` while the optimizer is built; DeepSpeed then aliases the two and
its own code keeps them consistent (the copy after each step becomes a no-op).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def shared_master_partitions():
    """While deepspeed.initialize builds a stage-3 optimizer: compare devices as devices."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    original = DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions

    def create_fp32_partitions(self):
        name = self.device
        if isinstance(name, str) and not self.offload_optimizer:
            self.device = torch.device(name)
        try:
            return original(self)
        finally:
            self.device = name

    DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions = create_fp32_partitions
    try:
        yield
    finally:
        DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions = original


def shares_master_partitions(optimizer) -> bool:
    """Whether a built ZeRO-3 optimizer uses its parameter partitions as its float32 master ones."""
    pairs = zip(getattr(optimizer, "fp16_partitioned_groups_flat", ()), getattr(optimizer, "fp32_partitioned_groups_flat", ()))
    pairs = [(low, master) for low, master in pairs if low is not None]
    return bool(pairs) and all(low.data_ptr() == master.data_ptr() for low, master in pairs)
