"""The strategy surface in one process: placement, collectives as identities, samplers."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from framework.data.sampler import EpochSampler, ShardSampler, rank_sampler
from framework.precision.bf16_true import BF16TruePrecision
from framework.strategy.auto import auto_strategy
from framework.strategy.base import Strategy
from framework.strategy.single_device import SingleDeviceStrategy


def test_setup_converts_places_and_builds_the_optimizer_over_the_result():
    strategy = SingleDeviceStrategy(precision=BF16TruePrecision())
    strategy.setup_environment()
    model, optimizer = strategy.setup(nn.Linear(3, 2), lambda params: torch.optim.SGD(params, lr=0.1))
    assert model.weight.dtype == torch.bfloat16
    assert optimizer.param_groups[0]["params"][0] is model.weight
    x, y = strategy.batch_to_device((torch.ones(2, 3), torch.tensor([0, 1])))
    assert x.dtype == torch.bfloat16 and y.dtype == torch.int64


def test_placing_a_model_keeps_tied_parameters_tied(monkeypatch):
    """A device move that copies per name (XLA's) would give a head tied to its embedding a
    tensor of its own; `place_model` registers the first one under every name again."""
    from framework.models.gpt import GPT

    model = GPT(n_layer=1, n_embd=32, n_head=2)
    assert model.head.weight is model.tok_emb.weight
    real_to = nn.Module.to

    def untying_to(self, *args, **kwargs):
        moved = real_to(self, *args, **kwargs)
        moved.head.weight = nn.Parameter(moved.head.weight.detach().clone())  # what XLA's move does
        return moved

    monkeypatch.setattr(GPT, "to", untying_to)
    strategy = SingleDeviceStrategy()
    strategy.setup_environment()
    model, optimizer = strategy.setup(model, lambda params: torch.optim.SGD(params, lr=0.1))
    assert model.head.weight is model.tok_emb.weight
    assert len(optimizer.param_groups[0]["params"]) == len(list(model.parameters()))


def test_collectives_without_a_process_group():
    s = SingleDeviceStrategy()
    assert (s.world_size, s.global_rank, s.local_rank, s.is_global_zero) == (1, 0, 0, True)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(s.all_gather(t), t.unsqueeze(0))
    for op in ("sum", "mean", "max", "min"):
        assert torch.equal(s.reduce(t, op), t)
    assert s.broadcast({"a": 1}) == {"a": 1}
    assert (s.any_rank(True), s.any_rank(False)) == (True, False)
    s.barrier()


def test_samplers():
    s = SingleDeviceStrategy()
    ds = TensorDataset(torch.arange(10))
    train = rank_sampler(ds, s, shuffle=True, seed=1)
    assert isinstance(train, EpochSampler) and sorted(train) == list(range(10))
    train.set_epoch(1)
    first = list(train)
    train.set_epoch(2)
    assert list(train) != first  # reshuffled per epoch
    evaluation = rank_sampler(ds, s, shuffle=False, seed=1, even=False)
    assert isinstance(evaluation, ShardSampler) and list(evaluation) == list(range(10))


def test_shard_sampler_never_pads():
    shards = [list(ShardSampler(10, 3, r)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(10)) and [len(s) for s in shards] == [4, 3, 3]


def test_auto_picks_single_device_for_one_process():
    from framework.accelerator.cpu import CPUAccelerator

    assert isinstance(auto_strategy(accelerator=CPUAccelerator(), devices=1), SingleDeviceStrategy)
    assert isinstance(auto_strategy(accelerator=CPUAccelerator(), devices="auto"), SingleDeviceStrategy)


def test_auto_picks_ddp_for_several_processes():
    from framework.accelerator.cpu import CPUAccelerator
    from framework.strategy.ddp import DDPStrategy

    assert type(auto_strategy(accelerator=CPUAccelerator(), devices=2)) is DDPStrategy


def test_ddp_wrap_options(one_rank_group):
    """A one-rank gloo group is enough to check what wrap_model builds."""
    import gc

    from framework.strategy.ddp import DDPStrategy

    strategy = DDPStrategy(static_graph=True, bucket_cap_mb=1.0)
    model = strategy.wrap_model(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    assert model.static_graph and model.bucket_bytes_cap == 2**20
    with strategy.no_backward_sync(model, skip=True):
        assert not model.require_backward_grad_sync
    assert model.require_backward_grad_sync
    assert strategy.world_size == 1 and torch.equal(strategy.reduce(torch.ones(2), "sum"), torch.ones(2))
    del model  # DDP's reducer must go before its process group (gloo's destructor can hang otherwise)
    gc.collect()


def test_the_strategy_surface_stays_small():
    """Strategy wraps model and optimizer, owns processes and collectives, backward and step, and the
    state dicts (at most 36 methods and properties: 32, `forward_backward`, the seam where a
    pipeline runs its schedule instead of one forward and backward, `layout`, what `framework
    plan` and the memory preflight read, one typed result, and `place_frozen`, a second, frozen
    model laid out as the trained one: a preference task's reference, a teacher, and `split_batch`, a
    rank's share of a moved batch, so that `batch_to_device` only moves: framework/batch_split.py);
    what the compatibility table reads of it are
    a few declared attributes, one Abilities object (what it can do: not a flag per question) and
    its StateLayout (how its states lie, for the memory formula);
    45 members in all at most (Lightning's base has 61); building and preparing a model lives in
    framework/construction/, memory estimates in framework/planning/."""
    import inspect

    from framework.strategy.abilities import Abilities
    from framework.strategy.layout import StateLayout

    members = sorted(n for n in dir(Strategy) if not n.startswith("__"))
    flags = [n for n in members if not callable(getattr(Strategy, n))
             and not isinstance(inspect.getattr_static(Strategy, n), property)]
    assert len(members) - len(flags) <= 36, [n for n in members if n not in flags]
    assert len([n for n in vars(Strategy) if not n.startswith("__")]) <= 45
    assert all(isinstance(getattr(Strategy, n), (bool, str, tuple, Abilities, StateLayout)) for n in flags), flags
    assert not {"sampler", "estimate_memory", "place_model", "convert_precision"} & set(members)
