"""A run that cannot fit the machine is refused before launch by `framework plan`'s arithmetic
(framework/planning/memory.py `beyond_memory`): the model states by the strategy's formula, plus one
micro-batch's activations measured on the meta device, times the processes that share a node's RAM.
The machine's RAM is set for each test (the same verdicts on any machine)."""
from __future__ import annotations

import pytest

from framework.accelerator.cpu import CPUAccelerator
from framework.errors import ConfigError
from framework.preflight import prepare
from tests.conftest import TINY_GPT, compose_cfg

MiB = 2**20
WIDER = [*TINY_GPT, "model.n_layer=8", "model.n_embd=512", "model.n_head=8"]  # 25M parameters: 387 MiB of states


@pytest.fixture
def ram(monkeypatch):
    def set_to(size: int):
        monkeypatch.setattr(CPUAccelerator, "memory_bytes", lambda self: size)
    return set_to


def test_activations_alone_can_refuse_a_run_whose_parameters_are_tiny(ram):
    """54K parameters (under 1 MiB of states), but a micro-batch of 64 x 1024 tokens keeps ~1.7 GiB
    of activations (attention's T x T among them): refused at 1 GiB; 8 x 1024 fits."""
    ram(1024 * MiB)
    long = [*TINY_GPT, "model.block_size=1024"]
    with pytest.raises(ConfigError, match=r"memory: the run cannot fit this machine: 1\.7 GiB per rank .*"
                                          r"model states 16Ψ = 839\.\d KiB, one micro-batch's activations 1\.7 GiB\)"):
        prepare(compose_cfg([*long, "data.batch_size=64"]))
    assert prepare(compose_cfg([*long, "data.batch_size=8"])).activation_bytes < 256 * MiB


def test_every_process_of_a_node_counts_against_its_ram(ram):
    """~467 MiB per rank: one process fits 700 MiB, two ddp processes on the node do not; fsdp's
    shards bring two back under it."""
    ram(700 * MiB)
    assert prepare(compose_cfg([*WIDER, "strategy=single_device"])).world_size == 1
    with pytest.raises(ConfigError, match=r"memory: the run cannot fit this machine: 4\d\d\.\d MiB per rank .*: 2 "
                                          r"process\(es\) on this node need 9\d\d\.\d MiB, more than its 700\.0 MiB of RAM"):
        prepare(compose_cfg([*WIDER, "strategy=ddp", "devices=2"]))
    assert prepare(compose_cfg([*WIDER, "strategy=fsdp", "devices=2"])).world_size == 2


def test_a_machine_whose_memory_is_not_known_refuses_nothing(ram):
    ram(0)
    assert prepare(compose_cfg([*TINY_GPT, "model.block_size=1024", "data.batch_size=64"]))
