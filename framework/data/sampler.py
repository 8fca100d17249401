"""A rank's share of a dataset: for training every rank the same number of samples, reshuffled
per epoch; for evaluation each sample to exactly one rank, never padded or dropped."""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler

# Up to this many samples the epoch's order is torch.randperm's (DistributedSampler's exactly: 8 bytes
# a sample, 32 MiB here); beyond it a keyed permutation computed per position (feistel_permutation),
# so that a rank never holds an index of the whole epoch (1e8 samples: 0.8 GB as a tensor, 4.7 GB as
# a Python list, measured).
RANDPERM_MAX = 1 << 22
CHUNK = 1 << 16  # positions a rank maps at a time
_MIX = 0x5BD1E995  # an odd multiplier below 2**31: products of 32-bit values stay in int64


def _round_function(half: torch.Tensor, key: int, bits: int) -> torch.Tensor:
    mask = (1 << bits) - 1
    mixed = ((half ^ (key & 0xFFFFFFFF)) * _MIX) & 0xFFFFFFFF
    mixed = mixed ^ (mixed >> 15)
    mixed = (mixed * _MIX) & 0xFFFFFFFF
    return (mixed ^ (mixed >> 13)) & mask


def feistel_permutation(positions: torch.Tensor, length: int, seed: int, rounds: int = 4) -> torch.Tensor:
    """A permutation of range(length) keyed by `seed`, applied to `positions` (int64): a balanced
    Feistel network on the smallest even number of bits covering `length`, walked again for values
    that land past it (a bijection on that power of two, so it ends). O(1) memory per position."""
    bits = max(2, (max(length - 1, 1)).bit_length() + (max(length - 1, 1)).bit_length() % 2)
    half = bits // 2
    mask = (1 << half) - 1
    keys = [(seed * 0x9E3779B1 + r * 0x85EBCA77) & 0xFFFFFFFF for r in range(rounds)]

    def once(x: torch.Tensor) -> torch.Tensor:
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ _round_function(right, key, half)
        return (left << half) | right

    out = once(positions.to(torch.int64))
    outside = out >= length
    while bool(outside.any()):
        out[outside] = once(out[outside])
        outside = out >= length
    return out


def rank_sampler(dataset: Dataset, strategy, shuffle: bool, seed: int, drop_last: bool = False, even: bool = True):
    """This rank's share of `dataset` under `strategy` (its world size and rank). `even=True`
    (training) gives every rank the same number of samples (DistributedSampler, reshuffled by
    seed + epoch); `even=False` (evaluation) gives each sample to exactly one rank."""
    share = strategy.data_parallel  # tensor-parallel ranks share one
    if not even:  # evaluation: every replica group scores the whole split
        return ShardSampler(len(dataset), share.size, share.rank)
    groups, group = strategy.replica_share  # training: replica group g takes the g-th block of shares
    return EpochSampler(len(dataset), share.size * groups, group * share.size + share.rank, shuffle=shuffle, seed=seed,
                        drop_last=drop_last)


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
        self._permutation: tuple[int, torch.Tensor] | None = None  # (epoch, randperm) of a small data set

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Deal epoch `epoch`'s order from global position `start` (0: the whole epoch)."""
        self.epoch, self.start = epoch, min(max(start, 0), self.length)

    def order(self) -> torch.Tensor:
        """The epoch's order: sample indices by position (a tensor of the whole epoch: small data sets,
        and tests; iterating never builds it for a large one)."""
        return self._indices(torch.arange(self.length))

    def _indices(self, positions: torch.Tensor) -> torch.Tensor:
        """The samples at `positions` of the epoch's order."""
        if not self.shuffle:
            return positions
        if self.length <= RANDPERM_MAX:
            if self._permutation is None or self._permutation[0] != self.epoch:
                generator = torch.Generator()
                generator.manual_seed(self.seed + self.epoch)  # DistributedSampler's seed for the epoch
                self._permutation = (self.epoch, torch.randperm(self.length, generator=generator))
            return self._permutation[1][positions]
        return feistel_permutation(positions, self.length, self.seed + self.epoch)

    def positions(self) -> int:
        """Positions dealt from `start` to all ranks together (padded or cut to a multiple of them)."""
        remaining = self.length - self.start
        rounded = remaining // self.replicas if self.drop_last else math.ceil(remaining / self.replicas)
        return rounded * self.replicas

    def __len__(self) -> int:
        return self.positions() // self.replicas

    def __iter__(self):
        total = self.positions()
        step = self.replicas * CHUNK
        for first in range(self.rank, total, step):  # a chunk of positions at a time: memory flat in the epoch
            picked = (torch.arange(first, min(total, first + step), self.replicas) + self.start) % self.length
            yield from self._indices(picked).tolist()

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
