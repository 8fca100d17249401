"""The built-in GPT's mixture of experts (framework/models/moe.py): routing computed as a per-token
reference computes it, dropless and with a capacity; the balancing and z-losses and their values;
DeepSeek-V3's bias balancing; active parameters and FLOPs; and a run as a user types it, then
`framework test` and `generate` on it."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from framework.cli import main as framework_main
from framework.models.flops import training_flops_per_item
from framework.models.gpt import GPT
from framework.models.moe import MoE, MoESettings
from framework.models.moe_stats import (
    describe_experts,
    moe_layers,
    parameter_counts,
    router_losses,
    router_values,
    update_expert_biases,
)
from framework.plotting.figures import metric_panels
from framework.plotting.run_data import read_run
from tests.conftest import TINY_GPT, metric_values, run_inprocess

SMALL = {"vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16, "dropout": 0.0}


def reference(layer: MoE, x: torch.Tensor, capacity: int | None = None) -> torch.Tensor:
    """Token by token: its top-k experts' outputs weighted by the router (an expert past its
    capacity, in token order, skipped), plus the shared experts."""
    s, e = layer.settings, layer.experts
    flat = x.reshape(-1, x.shape[-1])
    logits = layer.router(flat).float()
    scores = logits.softmax(-1) if s.score == "softmax" else logits.sigmoid()
    taken = [0] * s.num_experts
    rows = []
    for t in range(flat.shape[0]):
        chosen = scores[t].topk(s.top_k).indices.tolist()
        weights = scores[t, chosen]
        if s.normalize_weights:
            weights = weights / weights.sum()
        row = torch.zeros_like(flat[t])
        for j, i in enumerate(chosen):
            if capacity is not None and taken[i] >= capacity:
                continue
            taken[i] += 1
            row = row + weights[j] * (F.gelu(flat[t] @ e.w1[i] + e.b1[i]) @ e.w2[i] + e.b2[i])
        if layer.shared is not None:
            row = row + layer.shared(flat[t])
        rows.append(row)
    return torch.stack(rows).view(x.shape)


def reference_with_bias(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Top-1 chosen by score + bias, weighted by the score alone (normalised: 1)."""
    e, flat = layer.experts, x.reshape(-1, x.shape[-1])
    chosen = (layer.router(flat).softmax(-1) + layer.expert_bias).argmax(-1)
    return torch.stack([F.gelu(flat[t] @ e.w1[i] + e.b1[i]) @ e.w2[i] + e.b2[i] for t, i in enumerate(chosen.tolist())])


def test_num_experts_0_is_the_dense_model_bit_for_bit():
    torch.manual_seed(0)
    dense = GPT(**SMALL)
    torch.manual_seed(0)
    zero = GPT(**SMALL, moe=MoESettings(num_experts=0))
    a, b = dense.state_dict(), zero.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randint(0, 64, (2, 16))
    assert torch.equal(dense(x), zero(x))
    assert describe_experts(zero) is None and router_losses(zero, summed=True) is None


@pytest.mark.parametrize("settings", [
    {"num_experts": 4, "top_k": 2},
    {"num_experts": 8, "top_k": 3, "score": "sigmoid", "shared_experts": 1},
    {"num_experts": 4, "top_k": 1, "normalize_weights": False, "expert_hidden": 8},
], ids=["softmax_top2", "sigmoid_top3_shared", "switch_top1"])
def test_dropless_routing_is_the_per_token_computation(settings):
    torch.manual_seed(1)
    layer = MoE(16, MoESettings(**settings), dropout=0.0)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(layer(x), reference(layer, x), rtol=1e-5, atol=1e-6)


def test_a_capacity_drops_what_is_past_it_and_says_how_much():
    torch.manual_seed(2)
    layer = MoE(16, MoESettings(num_experts=4, top_k=2, capacity_factor=0.5), dropout=0.0)
    x = torch.randn(2, 8, 16)
    capacity = math.ceil(0.5 * 16 * 2 / 4)  # 4 of the 32 token-slots per expert
    torch.testing.assert_close(layer(x), reference(layer, x, capacity), rtol=1e-5, atol=1e-6)
    routed = torch.bincount(layer.router(x.reshape(-1, 16)).softmax(-1).topk(2).indices.flatten(), minlength=4)
    dropped = float((routed - routed.clamp(max=capacity)).sum()) / 32
    assert dropped > 0
    assert float(router_values(layer)["moe_dropped"]) == pytest.approx(dropped)


def test_the_balancing_and_z_losses_are_the_switch_and_st_moe_formulas():
    torch.manual_seed(3)
    settings = MoESettings(num_experts=4, top_k=2, balance_coef=0.1, z_loss_coef=0.01)
    layer = MoE(16, settings, dropout=0.0)
    x = torch.randn(24, 16)
    layer(x)
    logits = layer.router(x)
    probabilities = logits.softmax(-1)
    fraction = torch.bincount(probabilities.topk(2).indices.flatten(), minlength=4) / (24 * 2)
    balance = 4 * (fraction * probabilities.mean(0)).sum()
    z = torch.logsumexp(logits, -1).pow(2).mean()
    mean = router_losses(layer, summed=False)
    torch.testing.assert_close(mean, 0.1 * balance + 0.01 * z)
    torch.testing.assert_close(router_losses(layer, summed=True), mean * 24)  # divided later by the step's tokens
    values = router_values(layer)
    assert float(values["moe_balance_loss"]) == pytest.approx(float(balance.detach()), rel=1e-5)
    assert float(values["moe_z_loss"]) == pytest.approx(float(z.detach()), rel=1e-5)
    assert float(values["moe_load_max/0"]) == pytest.approx(float(fraction.max() * 4), rel=1e-6)
    mean.backward()
    assert layer.router.weight.grad.abs().sum() > 0  # the balancing loss trains the router
    assert MoESettings(num_experts=4, balance="none").adds_loss is False


@pytest.mark.parametrize("summed", [True, False])
def test_a_pipeline_stage_backpropagates_its_layers_losses_as_if_added_to_the_loss(summed):
    """Under pipeline stages only the last computes the loss: each stage's routing losses join its
    own backward (framework/models/stage_routing.py) with the microbatch loss's weight, and give
    the gradients that adding them to the loss gives, in the router and in the stage's input."""
    from framework.models.stage_routing import StageRouting

    torch.manual_seed(5)
    stage = torch.nn.Sequential(MoE(16, MoESettings(num_experts=4, top_k=2, balance_coef=0.1, z_loss_coef=0.01),
                                    dropout=0.0, layer=0),
                                MoE(16, MoESettings(num_experts=4, top_k=1, balance_coef=0.3), dropout=0.0, layer=1))
    x, downstream, weight = torch.randn(2, 12, 16), torch.randn(2, 12, 16), 1 / 37

    def grads(joined: bool):
        stage.zero_grad()
        inputs = x.clone().requires_grad_()
        out = stage(inputs)
        loss = (out * downstream).sum() * weight  # what the later stages make of this stage's output
        if not joined:
            loss = loss + router_losses(stage, summed) * weight
        loss.backward()
        return [inputs.grad] + [p.grad.clone() for p in stage.parameters()]

    added = grads(joined=False)
    routing = StageRouting({0: stage})
    routing.weigh_losses(weight, summed)
    joined = grads(joined=True)
    assert stage[0].router.weight.grad.abs().sum() > 0
    for a, b in zip(added, joined):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-8)


def test_bias_balancing_moves_towards_the_idle_experts_and_forgets_a_left_out_step():
    torch.manual_seed(4)
    layer = MoE(16, MoESettings(num_experts=4, top_k=1, balance="bias", bias_rate=0.02), dropout=0.0)
    assert "expert_bias" in layer.state_dict() and not layer.settings.adds_loss
    x = torch.randn(40, 16)
    layer(x)
    counts = layer.record.counts.float()
    update_expert_biases(layer, stepped=False)  # a step the guard left out: its counts forgotten
    assert torch.equal(layer.expert_bias, torch.zeros(4))
    layer(x)
    layer(x)  # two micro-batches of one step
    update_expert_biases(layer)
    assert torch.equal(layer.expert_bias, 0.02 * torch.sign(counts.mean() - counts))
    # the bias changes which experts are chosen (the busiest loses tokens, the idlest gains), not
    # their weights: the output is the scores' weighting of the newly chosen experts
    layer(x)
    busiest, idlest = int(counts.argmax()), int(counts.argmin())
    assert layer.record.counts[busiest] < counts[busiest] and layer.record.counts[idlest] > counts[idlest]
    torch.testing.assert_close(layer(x), reference_with_bias(layer, x), rtol=1e-5, atol=1e-6)
    assert router_losses(layer, summed=False) is None  # no auxiliary loss


def test_an_activation_checkpoints_recompute_counts_nothing_twice():
    torch.manual_seed(5)
    layer = MoE(16, MoESettings(num_experts=4, top_k=2, balance="bias"), dropout=0.0)
    x = torch.randn(10, 16, requires_grad=True)
    checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert float(layer.step_counts.sum()) == 10 * 2


def test_active_parameters_and_flops_count_a_tokens_experts_only():
    moe = GPT(**SMALL, moe=MoESettings(num_experts=8, top_k=2))
    total, active = parameter_counts(moe)
    experts = sum(p.numel() for layer in moe_layers(moe) for p in layer.experts.parameters())
    assert total == sum(p.numel() for p in moe.parameters())
    assert active == total - experts + experts * 2 // 8
    assert "8 experts, top-2" in describe_experts(moe) and f"{active:,} active" in describe_experts(moe)
    dense = GPT(**SMALL)  # an expert is the dense MLP: a token's FLOPs are top_k MLPs' plus the router's
    mlp = sum(m.weight.numel() for b in dense.blocks for m in (b.mlp[0], b.mlp[2]))
    router = sum(layer.router.weight.numel() for layer in moe_layers(moe))
    assert training_flops_per_item(moe, 16) == pytest.approx(training_flops_per_item(dense, 16) + 6 * (mlp + router))


def test_a_moe_run_as_typed_then_test_and_generate_on_it(tmp_path):
    out = tmp_path / "run"
    run_inprocess([*TINY_GPT, "model.n_layer=2", "model.moe.num_experts=4", "model.moe.top_k=2",
                   "model.moe.layers=[1]", "trainer.max_steps=8", "trainer.val_every=8"], out)
    losses = metric_values(out)
    assert losses[-1] < losses[0]
    header = open(out / "metrics.csv").readline()
    assert "train/moe_balance_loss" in header and "train/moe_load_max/1" in header and "moe_load_max/0" not in header
    assert all(v >= 1.0 for v in metric_values(out, "train/moe_load_max/1"))
    assert all(0.9 <= v < 1.5 for v in metric_values(out, "train/moe_balance_loss"))  # 1 is perfect balance
    panels = {name: [key for key, _ in keys] for name, _, keys, _ in metric_panels([read_run(out)])}
    assert panels["moe_load_max"] == ["train/moe_load_max/1"]  # one panel, a line per MoE layer
    assert framework_main(["test", str(out), "trainer.test_batches=1"]) == 0
    assert json.loads((out / "test_metrics.json").read_text())["metrics"]["test/loss"] > 0
    assert framework_main(["generate", str(out), "--prompt", "import", "--greedy", "--max-new-tokens", "5",
                           "-o", str(tmp_path / "g.jsonl")]) == 0
    assert json.loads((tmp_path / "g.jsonl").read_text())["new_tokens"] == 5


def test_lora_adapts_attention_and_shared_experts_and_refuses_the_routed_ones():
    from framework.adapter.lora import LoRA
    from framework.errors import ConfigError

    model = GPT(**SMALL, moe=MoESettings(num_experts=4, shared_experts=1, layers=[1]))
    targets = LoRA().targets(model)
    assert targets == ["blocks.0.attn.qkv", "blocks.1.attn.qkv", "blocks.0.attn.proj", "blocks.1.attn.proj",
                       "blocks.0.mlp.0", "blocks.0.mlp.2", "blocks.1.moe.shared.0", "blocks.1.moe.shared.2"]
    with pytest.raises(ConfigError, match="'experts': a mixture's routed experts are stacked weights"):
        LoRA(target_modules=["experts"]).targets(model)
    with pytest.raises(ConfigError, match="'mlpp' match no linear layer"):  # a name given by hand must match
        LoRA(target_modules=["qkv", "mlpp"]).targets(model)


def test_a_rank_whose_experts_get_no_token_still_joins_the_backward():
    """Under expert parallelism a rank may receive no token for any of its experts: its (empty)
    output is still joined to the tokens and to every weight, so its backward runs the all-to-alls
    its peers run (else they wait for it forever) and its experts' gradients are zeros, not None
    (else the gradient norm's all-reduce waits)."""
    experts = MoE(16, MoESettings(num_experts=4), dropout=0.0).experts
    arrived = torch.zeros(0, 16, requires_grad=True)
    experts.run_local(arrived, [0, 0, 0, 0]).sum().backward()
    assert arrived.grad is not None and arrived.grad.shape == (0, 16)
    assert all(p.grad is not None and not p.grad.any() for p in experts.parameters())


def test_plan_says_each_ranks_experts_and_what_it_gathers(tmp_path):
    """Under expert parallelism a Block's experts are spread, never gathered: the unit fsdp gathers
    at once is the Block without them (the memory estimate's gathered term)."""
    from framework.strategy.fsdp import FSDPStrategy
    from tests.helpers.in_process import run_command

    model = GPT(**SMALL, moe=MoESettings(num_experts=8))
    gathered = {}
    for ep in (1, 2):
        strategy = FSDPStrategy(expert_parallel_size=ep, min_unit_params=1000)
        strategy.devices = 2
        gathered[ep] = strategy.units(model).gathered
    experts = sum(p.numel() for p in model.blocks[0].moe.experts.parameters())
    assert gathered[2] == [gathered[1][0] - experts, gathered[1][1] - experts, gathered[1][2]]
    shown = run_command(["plan", "model.moe.num_experts=8", "strategy=fsdp", "devices=2",
                         "strategy.expert_parallel_size=2"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "expert parallel: 2 ranks, 4 of 8 experts each in 2 mixture-of-experts layer(s)" in shown.stdout
    assert "sent per rank per step" in shown.stdout and "active per token" in shown.stdout
    # at 4 ranks, EP 2 x FSDP 2: each rank holds half the experts (replicated twice), the rest a quarter
    from framework.planning.memory import estimate, model_stats
    from framework.preflight import prepare
    from tests.conftest import compose_cfg

    cfg = compose_cfg(["model.moe.num_experts=8", "strategy=fsdp", "devices=4", "strategy.expert_parallel_size=2"])
    prepared = prepare(cfg, strict=False)
    stats, _ = model_stats(cfg, prepared.plugins, prepared.model)
    spread = sum(p.numel() for name, p in prepared.model.named_parameters() if ".moe.experts." in name)
    assert stats.spread_params == spread > 0 and stats.spread_ranks == 2
    states = estimate(prepared.plugins.strategy, stats, 4)
    assert states.device == 16 * ((stats.params - spread) / 4 + spread / 2) + 8 * stats.largest_unit
    assert states.formula.startswith("16(Ψ-Ψe)/N + 16Ψe/E")
