"""A sampler for evaluation that splits a dataset across ranks without padding or dropping."""
from __future__ import annotations

from torch.utils.data import Sampler


class ShardSampler(Sampler[int]):
    """Rank r of w gets indices r, r+w, r+2w, ... in order. Unlike DistributedSampler it never
    repeats samples to even out the shards, so summed validation statistics are exact."""

    def __init__(self, length: int, num_replicas: int, rank: int):
        self.indices = range(rank, length, num_replicas)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def set_epoch(self, epoch: int) -> None:
        """Evaluation order does not depend on the epoch."""
