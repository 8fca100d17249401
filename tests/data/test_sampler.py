"""The training sampler (framework/data/sampler.py EpochSampler): what torch's DistributedSampler
deals from an epoch's start, and from any position a continuation of the same order, whatever the
number of ranks, so a resume at another world size or batch size skips and repeats nothing."""
from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler

from framework.data.sampler import EpochSampler


@pytest.mark.parametrize("length,ranks", [(10, 1), (10, 2), (10, 3), (7, 4), (3, 5)])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_from_the_start_it_deals_what_distributed_sampler_deals(length, ranks, shuffle, drop_last):
    for epoch in (0, 3):
        for rank in range(ranks):
            ours = EpochSampler(length, ranks, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
            torch_s = DistributedSampler(range(length), num_replicas=ranks, rank=rank, shuffle=shuffle, seed=7,
                                         drop_last=drop_last)
            ours.set_epoch(epoch)
            torch_s.set_epoch(epoch)
            assert list(ours) == list(torch_s) and len(ours) == len(torch_s)


def _dealt(length, ranks, batch, start, epoch=0, drop_last=False):
    """Every rank's batches from `start`, interleaved as the ranks take them step by step."""
    shares = []
    for rank in range(ranks):
        sampler = EpochSampler(length, ranks, rank, shuffle=True, seed=3, drop_last=drop_last)
        sampler.set_epoch(epoch, start)
        shares.append(list(sampler))
    steps = []
    for i in range(0, len(shares[0]), batch):
        steps.append([index for share in shares for index in share[i:i + batch]])
    return steps


def test_a_resume_at_another_world_and_batch_continues_on_the_next_sample():
    """2 ranks x batch 4 for 3 steps consumed positions 0-23; from there 1 rank x batch 8 (the same
    global batch) and 3 ranks x batch 2 (another one) take exactly the samples the straight run
    takes next, and none of those already taken."""
    length = 50
    straight = _dealt(length, 2, 4, 0)
    taken = {i for step in straight[:3] for i in step}
    order = EpochSampler(length, 1, 0, shuffle=True, seed=3).order().tolist()
    start = EpochSampler(length, 2, 0, shuffle=True, seed=3).consumed(3 * 4)
    assert start == 24 and taken == set(order[:24])
    one = _dealt(length, 1, 8, start)
    assert [set(s) for s in one[:3]] == [set(s) for s in straight[3:6]]  # the same steps, sample for sample
    three = [i for step in _dealt(length, 3, 2, start) for i in step]
    # the rest of the epoch once each, and (26 samples in 3 shares) one position of padding that
    # repeats the epoch's first sample, as at every epoch's end
    assert sorted(three) == sorted(order[24:] + order[:1])


def test_the_same_world_resumes_exactly_what_the_straight_run_deals():
    straight = _dealt(23, 2, 3, 0)  # padded: 23 samples in 2 shares
    start = EpochSampler(23, 2, 0, shuffle=True, seed=3).consumed(2 * 3)
    assert _dealt(23, 2, 3, start) == straight[2:]


def test_consumed_counts_padding_as_the_epochs_end():
    sampler = EpochSampler(5, 2, 0, shuffle=False, seed=0)
    assert len(sampler) == 3 and sampler.consumed(3) == 5 and sampler.consumed(1) == 2
    sampler.set_epoch(0, 5)
    assert len(sampler) == 0 and list(sampler) == []


@pytest.mark.parametrize("length", [1, 2, 5, 1000, 99_991, pytest.param((1 << 20) + 7, marks=pytest.mark.slow)])
def test_the_keyed_permutation_is_one_of_the_epoch(length):
    import torch

    from framework.data.sampler import feistel_permutation

    positions = torch.arange(length)
    once = feistel_permutation(positions, length, seed=11)
    assert torch.equal(torch.sort(once).values, positions)  # every sample once
    assert torch.equal(once, feistel_permutation(positions, length, seed=11))  # the same for the same seed
    if length > 100:
        assert not torch.equal(once, feistel_permutation(positions, length, seed=12))
        assert (once != positions).float().mean() > 0.9  # shuffled, not nearly in order


def test_a_large_epoch_is_dealt_without_an_index_of_it(monkeypatch):
    """Above RANDPERM_MAX samples the order is computed per position, a chunk at a time: ranks
    still take disjoint samples and a resume continues the same order."""
    from framework.data import sampler as module

    monkeypatch.setattr(module, "RANDPERM_MAX", 100)
    monkeypatch.setattr(module, "CHUNK", 7)
    shares = []
    for rank in range(3):
        s = EpochSampler(1000, 3, rank, shuffle=True, seed=5)
        s.set_epoch(2)
        shares.append(list(s))
    dealt = [i for share in shares for i in share]
    assert sorted(dealt[:999]) != list(range(999)) and len(set(dealt)) == 1000  # 1000 in 3 shares: 2 repeats
    straight = EpochSampler(1000, 1, 0, shuffle=True, seed=5)
    straight.set_epoch(2)
    resumed = EpochSampler(1000, 1, 0, shuffle=True, seed=5)
    resumed.set_epoch(2, 300)
    assert list(resumed) == list(straight)[300:]
