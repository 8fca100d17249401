"""A rank's share of a dataset: for training every rank the same number of samples, reshuffled
per epoch; for evaluation each sample to exactly one rank, never padded or dropped."""
from __future__ import annotations

from torch.utils.data import Dataset, DistributedSampler, Sampler


def rank_sampler(dataset: Dataset, strategy, shuffle: bool, seed: int, drop_last: bool = False, even: bool = True):
    """This rank's share of `dataset` under `strategy` (its world size and rank). `even=True`
    (training) gives every rank the same number of samples (DistributedSampler, reshuffled by
    seed + epoch); `even=False` (evaluation) gives each sample to exactly one rank."""
    share = strategy.data_parallel  # tensor-parallel ranks share one
    if not even:
        return ShardSampler(len(dataset), share.size, share.rank)
    return DistributedSampler(dataset, num_replicas=share.size, rank=share.rank,
                              shuffle=shuffle, seed=seed, drop_last=drop_last)


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
