"""A rank's share of a dataset: for training every rank the same number of samples, reshuffled
per epoch; for evaluation each sample to exactly one rank, never padded or dropped."""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler


def rank_sampler(dataset: Dataset, strategy, shuffle: bool, seed: int, drop_last: bool = False, even: bool = True):
    """This rank's share of `dataset` under `strategy` (its world size and rank). `even=True`
    (training) gives every rank the same number of samples (DistributedSampler, reshuffled by
    seed + epoch); `even=False` (evaluation) gives each sample to exactly one rank."""
    share = strategy.data_parallel  # tensor-parallel ranks share one
    if not even:
        return ShardSampler(len(dataset), share.size, share.rank)
    return EpochSampler(len(dataset), share.size, share.rank, shuffle=shuffle, seed=seed, drop_last=drop_last)


class EpochSampler(Sampler[int]):
    """Training: one order of the whole epoch (a permutation by seed + epoch, or the data's own
    order), dealt from a global position `start` to `replicas` ranks in turn: rank r of w takes
    the positions start + r, start + r + w, ... So the samples consumed after any number of
    batches are a prefix of the epoch's order, whatever the world size and batch size, and a
    resume continues at the next sample of that order (`set_epoch(epoch, start)`).

    From start 0 it deals exactly what torch's DistributedSampler deals: the order padded to a
    multiple of the ranks by repeating its beginning, or cut to one (`drop_last`)."""

    def __init__(self, length: int, replicas: int, rank: int, shuffle: bool, seed: int, drop_last: bool = False):
        self.length, self.replicas, self.rank = length, replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Deal epoch `epoch`'s order from global position `start` (0: the whole epoch)."""
        self.epoch, self.start = epoch, min(max(start, 0), self.length)

    def order(self) -> torch.Tensor:
        """The epoch's order: sample indices by position."""
        if not self.shuffle:
            return torch.arange(self.length)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)  # DistributedSampler's seed for the epoch
        return torch.randperm(self.length, generator=generator)

    def positions(self) -> int:
        """Positions dealt from `start` to all ranks together (padded or cut to a multiple of them)."""
        remaining = self.length - self.start
        rounded = remaining // self.replicas if self.drop_last else math.ceil(remaining / self.replicas)
        return rounded * self.replicas

    def __len__(self) -> int:
        return self.positions() // self.replicas

    def __iter__(self):
        if self.positions() == 0:
            return iter(())
        order = self.order()
        picked = (torch.arange(self.rank, self.positions(), self.replicas) + self.start) % self.length
        return iter(order[picked].tolist())

    def consumed(self, samples_per_rank: int) -> int:
        """The global position after each rank took `samples_per_rank` of its share: what a
        checkpoint records (positions past the end, the padding, are the epoch's end)."""
        return min(self.length, self.start + samples_per_rank * self.replicas)


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
