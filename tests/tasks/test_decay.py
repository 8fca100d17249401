"""Weight decay (trainer.decay_biases_and_norms=false, the default): biases and normalisation weights left out
by transformers' Trainer's rule, for the built-in GPT and a Hugging Face Llama; a checkpoint saved
with one parameter group resumes into two and back (framework/construction/named_state.py)."""
from __future__ import annotations

import pytest
import torch

from framework.construction.named_state import load_optimizer_state_by_name, optimizer_state_by_name, regrouped
from framework.models.gpt import GPT
from framework.tasks.decay import decay_groups, no_decay_names


def test_biases_and_norms_are_left_out_of_weight_decay_as_transformers_leaves_them():
    gpt = GPT(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=8)
    left_out = no_decay_names(gpt)
    assert {"blocks.0.ln1.weight", "blocks.0.ln1.bias", "ln_f.weight", "blocks.0.attn.qkv.bias"} <= left_out
    assert not {"tok_emb.weight", "blocks.0.attn.qkv.weight", "pos_emb.weight"} & left_out
    transformers = pytest.importorskip("transformers")
    trainer_pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, attention_bias=True))
    patterns = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    decayed = set(trainer_pt_utils.get_parameter_names(llama, [torch.nn.LayerNorm], patterns))
    assert {n for n, _ in llama.named_parameters()} - no_decay_names(llama) == decayed  # transformers' Trainer


def test_the_optimizer_gets_two_groups_and_a_one_group_state_loads_into_them():
    torch.manual_seed(0)
    gpt = GPT(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=8)
    plain = torch.optim.AdamW(gpt.parameters(), lr=1e-2, weight_decay=0.1)
    grouped = decay_groups(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1), gpt)(gpt.parameters())
    assert [g["weight_decay"] for g in grouped.param_groups] == [0.1, 0.0]
    assert sum(len(g["params"]) for g in grouped.param_groups) == len(list(gpt.parameters()))
    gpt(torch.randint(0, 32, (2, 8))).sum().backward()
    plain.step()
    saved = optimizer_state_by_name(gpt, plain)
    load_optimizer_state_by_name(gpt, grouped, regrouped(saved, gpt, grouped))
    assert [g["weight_decay"] for g in grouped.param_groups] == [0.1, 0.0]  # the grouping kept
    for name, p in gpt.named_parameters():
        torch.testing.assert_close(grouped.state[p]["exp_avg"], plain.state[p]["exp_avg"], msg=name)
    back = optimizer_state_by_name(gpt, grouped)
    fresh = torch.optim.AdamW(gpt.parameters(), lr=1e-2, weight_decay=0.1)
    load_optimizer_state_by_name(gpt, fresh, regrouped(back, gpt, fresh))
    assert [g["weight_decay"] for g in fresh.param_groups] == [0.1]
