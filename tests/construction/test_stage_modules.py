"""A GPT cut into pipeline stages (framework/construction/stage_modules.py) computes what the
whole model computes, and its stages' parameter names together are the model's own."""
from __future__ import annotations

import pytest
import torch

from framework.construction.stage_modules import model_stages
from framework.construction.stages import balanced_split
from framework.models.gpt import GPT


def model() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32)


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_the_stages_in_a_row_compute_the_model_and_name_its_parameters(stages):
    gpt = model()
    tokens = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    split = balanced_split([sum(p.numel() for p in b.parameters()) for b in gpt.blocks], stages)
    parts = model_stages(gpt, split)
    x = tokens
    for part in parts:
        x = part(x)
    assert torch.equal(x, gpt(tokens))  # the same operations in the same order: bit for bit
    names = [name for part in parts for name in part.state_dict()]
    assert sorted(names) == sorted(gpt.state_dict())  # a checkpoint of the stages is the model's
    assert len(names) == len(set(names))
    # the stages hold the model's own layers; only a tied head on another stage is a copy
    assert parts[0].tok_emb is gpt.tok_emb and parts[-1].blocks[str(3)] is gpt.blocks[3]
    assert parts[-1].tied_copy == (stages > 1)
    if stages > 1:
        assert parts[-1].head.weight is not gpt.tok_emb.weight
        assert torch.equal(parts[-1].head.weight, gpt.tok_emb.weight)
