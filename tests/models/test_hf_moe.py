"""Hugging Face mixtures of experts (model=hf_causal_lm model/config=qwen3_moe, mixtral, olmoe): their
own balancing loss counted as transformers counts it, but over the global batch (the data-parallel
ranks' tokens per expert), so that 2 processes train one process's numbers; a token's share of the
experts in FLOPs and `plan`."""
from __future__ import annotations

import pytest
import torch

from framework.models.flops import training_flops_per_item
from framework.models.hf_causal_lm import causal_lm
from framework.models.moe_stats import describe_experts, parameter_counts, router_losses, router_values
from tests.conftest import TINY_GPT, metric_values
from tests.helpers.run_cache import trained_run

pytest.importorskip("transformers")

FAMILIES = {
    "qwen3_moe": {"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                  "norm_topk_prob": True, "router_aux_loss_coef": 0.01},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 16,
                "router_aux_loss_coef": 0.02},
    "olmoe": {"model_type": "olmoe", "num_experts": 8, "num_experts_per_tok": 4, "intermediate_size": 16,
              "router_aux_loss_coef": 0.01},
}
SMALL = {"vocab_size": 64, "max_position_embeddings": 16, "num_hidden_layers": 2, "hidden_size": 32,
         "num_attention_heads": 2, "num_key_value_heads": 2}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_balancing_loss_is_transformers_own(family):
    torch.manual_seed(0)
    model = causal_lm(config={**SMALL, **FAMILIES[family]}, attn_implementation="eager")
    model.train()
    ids = torch.randint(0, 64, (3, 16))
    theirs = model(ids, output_router_logits=True).aux_loss
    coef = FAMILIES[family]["router_aux_loss_coef"]
    torch.testing.assert_close(router_losses(model, summed=False), coef * theirs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(router_losses(model, summed=True), coef * theirs * 48, rtol=1e-5, atol=1e-6)
    values = router_values(model)
    assert float(values["moe_balance_loss"]) == pytest.approx(float(theirs.detach()), rel=1e-5)
    assert {"moe_load_max/0", "moe_load_max/1", "moe_load_min/1"} <= set(values)
    model.eval()
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 16)))  # evaluation routes too, but counts nothing
    assert float(router_values(model)["moe_balance_loss"]) == pytest.approx(float(theirs.detach()), rel=1e-5)


def test_flops_and_plan_count_a_tokens_share_of_the_experts():
    model = causal_lm(config={**SMALL, **FAMILIES["qwen3_moe"]})
    total, active = parameter_counts(model)
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert active == total - experts + experts * 2 // 8
    assert f"{active:,} active per token" in describe_experts(model)
    assert training_flops_per_item(model, 16) is not None  # train/mfu is reported for it


@pytest.mark.slow
def test_two_processes_train_one_processs_numbers():
    """Mixtral at ddp@2 and at one process on the same global batch: the losses, the gradient
    norms and the balancing loss step by step."""
    base = [*(o for o in TINY_GPT if not o.startswith("model.")), "model=hf_causal_lm", "data.block_size=32",
            "model/config=mixtral", "model.config.hidden_size=32", "model.config.intermediate_size=32",
            "model.config.num_attention_heads=2", "model.config.num_key_value_heads=2",
            "model.config.router_aux_loss_coef=0.05", "model.attn_implementation=eager", "trainer.max_steps=3",
            "trainer.log_every=1", "trainer.val_every=100", "trainer.val_at_start=false", "trainer.clip_grad_norm=1.0"]
    one = trained_run([*base, "data.batch_size=16"])
    two = trained_run([*base, "strategy=ddp", "devices=2"])
    for key in ("train/loss", "train/grad_norm", "train/moe_balance_loss", "train/moe_load_max/1"):
        torch.testing.assert_close(torch.tensor(metric_values(two, key)), torch.tensor(metric_values(one, key)),
                                   rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_a_moe_family_exports_to_the_class_transformers_loads(tmp_path, family):
    """`framework convert --to hf`'s writer: the stacked experts under transformers' names, the same
    logits from transformers' own from_pretrained (the watched routers add nothing to the state)."""
    import transformers

    from framework.models.hf_causal_lm import save_for_hub

    config = {**SMALL, **FAMILIES[family]}
    model = causal_lm(config=config).eval()
    state = model.state_dict()
    assert not any("router_balance" in name for name in state)
    save_for_hub(state, {"config": config}, tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded).__name__ == type(model).__name__
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_spreading_a_familys_experts_says_what_stops_it(monkeypatch):
    """strategy.expert_parallel_size on a Hugging Face family (framework/strategy/mesh/hf_experts.py):
    transformers' plan, the model's own names, and each refusal naming the key and the fix."""
    from framework.strategy.mesh import hf_experts
    from framework.strategy.mesh.experts import expert_parameters, expert_problems

    model = causal_lm(config={**SMALL, **FAMILIES["qwen3_moe"]})
    assert list(hf_experts.concrete_plan(model, hf_experts.plan_of(model))) == [
        "model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.gate_up_proj",
        "model.layers.0.mlp.experts.down_proj", "model.layers.1.mlp.experts.down_proj",
        "model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]  # the weights before their modules
    assert len(expert_parameters(model)) == 4 and expert_problems(model, 2) == []
    assert "does not divide the model's 8 experts" in expert_problems(model, 3)[0]
    assert "takes data-parallel ranks only" in expert_problems(model, 2, tensor=2)[0]
    monkeypatch.setattr(hf_experts, "installed", lambda: "5.22.0")
    assert "from transformers 5.24 on (installed: 5.22.0); upgrade transformers" in expert_problems(model, 2)[0]


def test_a_whole_number_for_a_float_field_is_taken_as_the_float():
    """`model.config.router_aux_loss_coef=0`, as a user (and the pipeline's refusal) writes it: YAML
    reads an int, which transformers' strict config classes refuse; the field's declared float
    is given instead (an int field stays an int)."""
    config = causal_lm(config={**SMALL, **FAMILIES["qwen3_moe"], "router_aux_loss_coef": 0}).config
    assert config.router_aux_loss_coef == 0.0 and type(config.router_aux_loss_coef) is float
    assert type(config.hidden_size) is int


def test_the_layout_reaches_a_familys_router_watch_as_it_reaches_the_gpts_layers():
    """One contract (framework/construction/routing.py): the strategy sets every routing module's
    token group and counting, found by class; the Hugging Face router watch used to keep "default"
    (every rank) under tensor parallelism, whose ranks compute the same tokens, and counted each
    token once per tensor rank in its loads."""
    from framework.construction.routing import Routed
    from framework.models.gpt import GPT
    from framework.models.moe import MoESettings
    from framework.strategy.mesh.experts import experts_of, routing_counted, token_groups

    hub = causal_lm(config={**SMALL, **FAMILIES["qwen3_moe"]})
    gpt = GPT(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32, moe=MoESettings(num_experts=4))
    for model, family, count in ((hub, "HubExperts", 8), (gpt, "BuiltinExperts", 4)):
        routed = [m for m in model.modules() if isinstance(m, Routed)]
        assert routed and all(m.token_group == "default" and m.counting for m in routed)
        token_groups(model, None)
        routing_counted(model, False)
        assert all(m.token_group is None and not m.counting for m in routed)
        found = experts_of(model)
        assert type(found).__name__ == family and found.counts() == [count] and len(found.layers) == 2
