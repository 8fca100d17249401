"""A Hugging Face mixture of experts' experts spread over ranks with transformers' own plan
(strategy.expert_parallel_size, framework/strategy/mesh/hf_experts.py): at 2 processes (experts 2)
and at 4 (experts 2 x fsdp 2) the losses, gradient norms, balancing loss and load are one process's
on the same global batch, each rank holds its share of the experts, and the checkpoint holds every
expert under transformers' names: it resumes sample-exact in one process."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import (
    TINY_GPT,
    assert_close_metrics,
    assert_close_weights,
    checkpoint_at,
    load_model_state,
    metric_values,
    run_inprocess,
)
from tests.helpers.run_cache import trained_run

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

STEPS = 4
BASE = [*(o for o in TINY_GPT if not o.startswith("model.")), "model=hf_causal_lm", "data.block_size=32",
        "model/config=qwen3_moe", "model.config.hidden_size=32", "model.config.moe_intermediate_size=32",
        "model.config.num_attention_heads=2", "model.config.num_key_value_heads=2", "model.config.num_experts=4",
        "model.config.router_aux_loss_coef=0.05", "model.attn_implementation=eager", f"trainer.max_steps={STEPS}",
        "trainer.log_every=1", "trainer.val_every=100", "trainer.val_at_start=false", "trainer.clip_grad_norm=1.0",
        "trainer.accumulate=2", "callbacks=[checkpoint]", f"callbacks.checkpoint.every_n_steps={STEPS // 2}",
        "callbacks.checkpoint.keep_last_k=4"]
LAYOUTS = {
    "one": ["data.batch_size=16"],
    "ep2": ["strategy=fsdp", "devices=2", "strategy.expert_parallel_size=2"],
    "ep2xfsdp2": ["strategy=fsdp", "devices=4", "strategy.expert_parallel_size=2", "data.batch_size=4"],
}


@pytest.mark.parametrize("layout", ["ep2", "ep2xfsdp2"])
def test_transformers_plan_spreads_the_experts_and_gives_one_processs_numbers(layout):
    one, other = trained_run([*BASE, *LAYOUTS["one"]]), trained_run([*BASE, *LAYOUTS[layout]])
    assert_close_metrics(other, one, ("train/loss", "train/grad_norm", "train/moe_balance_loss", "train/moe_load_max/1"),
                         STEPS)
    # every expert, under transformers' names
    assert load_model_state(checkpoint_at(other, STEPS))["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 32)
    assert_close_weights(checkpoint_at(one, STEPS), checkpoint_at(other, STEPS))


def test_a_checkpoint_of_spread_experts_resumes_sample_exact_in_one_process(tmp_path):
    straight = trained_run([*BASE, *LAYOUTS["ep2"]])
    run_inprocess([*BASE, *LAYOUTS["one"], f"ckpt_path={checkpoint_at(straight, STEPS // 2)}"], tmp_path)
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path)), torch.tensor(metric_values(straight)[STEPS // 2:]),
                               rtol=1e-5, atol=1e-5)
