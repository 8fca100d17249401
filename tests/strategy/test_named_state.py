"""single_device's by-name state without torch.distributed.checkpoint: the same layout DCP's
state_dict API produces (tied weights included), and an exact round trip."""
from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from framework.construction.named_state import load_optimizer_state_by_name, optimizer_state_by_name
from framework.models.gpt import GPT
from tests.conftest import assert_state_equal


def trained_gpt(seed: int):
    torch.manual_seed(seed)
    model = GPT(n_layer=1, n_embd=32, n_head=2, block_size=16, dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        x = torch.randint(0, 256, (4, 16))
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_the_same_layout_as_torch_distributed_checkpoint():
    model, optimizer = trained_gpt(0)
    options = StateDictOptions(full_state_dict=True)
    assert_state_equal(optimizer_state_by_name(model, optimizer), get_optimizer_state_dict(model, optimizer, options=options))
    assert list(model.state_dict()) == list(get_model_state_dict(model, options=options))  # tied head.weight too


def test_round_trip_into_another_optimizer():
    model, optimizer = trained_gpt(0)
    other_model, other = trained_gpt(1)
    other_model.load_state_dict(model.state_dict())
    load_optimizer_state_by_name(other_model, other, optimizer_state_by_name(model, optimizer))
    assert_state_equal(optimizer_state_by_name(other_model, other), optimizer_state_by_name(model, optimizer))
