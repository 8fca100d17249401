"""strategy=model_parallel (FSDP2 x tensor parallel on a 2-D mesh) and strategy=hsdp (replicate x
shard): plans and their refusals without processes; at 4 CPU processes (a 2x2 mesh) the same
losses as ddp on the same global batch, and checkpoints that resume exactly across meshes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.construction import tensor_parallel
from framework.errors import ConfigError
from framework.models.gpt import GPT
from framework.strategy.hsdp import HSDPStrategy
from framework.strategy.model_parallel import ModelParallelStrategy
from tests.conftest import (
    TINY_GPT,
    checkpoint_at,
    checkpoints,
    load_model_state,
    load_optimizer_state,
    metric_values,
    run_inprocess,
)
from tests.helpers.torchrun import free_port, torchrun

# ---- plans and meshes, no processes --------------------------------------------------------------


def _strategy(devices=4, **kwargs) -> ModelParallelStrategy:
    strategy = ModelParallelStrategy(**kwargs)
    strategy.devices = devices
    return strategy


def _shape(strategy, world: int) -> tuple[int, int]:
    dims = strategy.parallel_dims(world)
    return dims.data_parallel, dims.tensor


def test_mesh_shape_resolves_auto_like_lightning():
    assert _shape(_strategy(4), 4) == (1, 4)  # auto: tensor parallel within a node
    assert _shape(_strategy(4), 8) == (2, 4)  # two nodes: data parallel across them
    assert _shape(_strategy(4, tensor_parallel_size=2), 4) == (2, 2)
    assert _shape(_strategy(4, data_parallel_size=4), 4) == (4, 1)
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3 does not divide the 4 ranks"):
        _shape(_strategy(4, tensor_parallel_size=3), 4)
    with pytest.raises(ConfigError, match=r"data_parallel_size=3 x strategy.tensor_parallel_size=2 is 6 ranks"):
        _shape(_strategy(4, tensor_parallel_size=2, data_parallel_size=3), 4)


def test_gpt_plan_splits_every_projection_and_sequence_parallel_adds_the_norms():
    model = GPT(n_layer=2, n_embd=32, n_head=4)
    plan, source = tensor_parallel.plan_for(model, None, sequence_parallel=False)
    chosen = tensor_parallel.expand(model, plan)
    assert source == "GPT.tensor_parallel_plan"
    assert chosen == {f"blocks.{i}.{name}": style for i in range(2) for name, style in
                      [("attn.qkv", "colwise_fused3"), ("attn.proj", "rowwise"), ("mlp.0", "colwise"),
                       ("mlp.2", "rowwise")]}
    with_sp = tensor_parallel.expand(model, tensor_parallel.plan_for(model, None, sequence_parallel=True)[0])
    assert with_sp["blocks.0"] == "split_sequence" and with_sp["ln_f"] == "gather_sequence"
    assert with_sp["blocks.1.ln2"] == "sequence_parallel" and "blocks.1" not in with_sp
    assert tensor_parallel.plan_problems(model, plan, source, 4, False) == []


def test_hugging_face_plan_comes_from_the_config_prefixed_with_the_base_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    plan, source = tensor_parallel.plan_for(model, None, sequence_parallel=False)
    assert source == "LlamaConfig.base_model_tp_plan"
    assert tensor_parallel.expand(model, plan)["model.layers.0.self_attn.o_proj"] == "rowwise"
    assert len(tensor_parallel.expand(model, plan)) == 7
    assert tensor_parallel.plan_problems(model, plan, source, 2, False) == []
    # 4 ranks cannot share 2 key/value heads
    assert any("num_key_value_heads=2" in p for p in tensor_parallel.plan_problems(model, plan, source, 4, False))


@pytest.mark.parametrize("model,plan,size,sequence_parallel,fragment", [
    (nn.Sequential(nn.Linear(4, 8)), None, 2, False, "Sequential has no tensor-parallel plan"),
    (GPT(n_layer=1, n_embd=32, n_head=2), None, 4, False, "tensor_parallel_size=4 does not divide model.n_head=2"),
    (nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 4)), {"0": "colwise", "1": "rowwise"}, 4, False,
     "tensor_parallel_size=4 does not divide 0's 6 output features"),
    (GPT(n_layer=1, n_embd=32, n_head=2), {"blocks.*.ln1": "colwise"}, 2, False, "blocks.0.ln1 is a LayerNorm"),
    (GPT(n_layer=1, n_embd=32, n_head=2), {"blocks.*.mlp.0": "diagonal"}, 2, False, "unknown tensor-parallel style"),
    (GPT(n_layer=1, n_embd=32, n_head=2), {"blocks.*.nothing": "colwise"}, 2, False, "'blocks.*.nothing' matches no"),
    (GPT(n_layer=1, n_embd=32, n_head=2), {"blocks.*.mlp.0": "colwise"}, 2, True, "says nowhere where the sequence"),
])
def test_plan_problems_name_the_module_and_the_fix(model, plan, size, sequence_parallel, fragment):
    found, source = (tensor_parallel.plan_for(model, plan, sequence_parallel))
    problems = tensor_parallel.plan_problems(model, found, source or "strategy.tp_plan", size, sequence_parallel)
    assert any(fragment in p for p in problems), problems


def test_hsdp_shard_groups_stay_within_a_node():
    def hsdp(**settings) -> HSDPStrategy:
        strategy = HSDPStrategy(**settings)
        strategy.devices = 4
        return strategy

    dims = hsdp().parallel_dims(8)
    assert (dims.replicate, dims.shard) == (2, 4) and hsdp().layout(8).state_shards == 4
    dims = hsdp(shard_size=2).parallel_dims(8)
    assert (dims.replicate, dims.shard) == (4, 2)
    with pytest.raises(ConfigError, match="shard_size=3 does not divide the 4 ranks of a node"):
        hsdp(shard_size=3).parallel_dims(8)


# ---- 4 processes: a 2x2 mesh against ddp ---------------------------------------------------------
# The same global batch of 16 everywhere: ddp@2 x 8, model_parallel 2x2 (2 data-parallel ranks) x 8,
# hsdp 2x2 (4 data-parallel ranks) x 4. Sequence parallelism and gradient clipping on (the norm is
# taken over parameters on two meshes); DCP checkpoints every 2 steps for the resumes.
STEPS = 4
BASE = [*TINY_GPT, "model.n_layer=2", f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.val_every=2",
        "model.dropout=0.0", "trainer.val_at_start=false", "callbacks=[checkpoint]", "trainer.clip_grad_norm=0.5",
        "checkpoint_io=dcp", "callbacks.checkpoint.every_n_steps=2"]
MODEL_PARALLEL = ["strategy=model_parallel", "devices=4", "strategy.tensor_parallel_size=2",
                  "strategy.sequence_parallel=true"]
HSDP = ["strategy=hsdp", "devices=4", "strategy.shard_size=2", "data.batch_size=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_d")
    out = {"ddp": root / "ddp", "model_parallel": root / "model_parallel", "hsdp": root / "hsdp"}
    run_inprocess([*BASE, "strategy=ddp", "devices=2"], out["ddp"])
    run_inprocess([*BASE, *MODEL_PARALLEL], out["model_parallel"])
    run_inprocess([*BASE, *HSDP], out["hsdp"])
    return out


@pytest.mark.slow
@pytest.mark.matrix(strategy="model_parallel")
def test_model_parallel_2x2_with_sequence_parallel_matches_ddp(runs):
    ddp, mp = metric_values(runs["ddp"]), metric_values(runs["model_parallel"])
    assert len(mp) == STEPS and mp[-1] < mp[0]
    torch.testing.assert_close(torch.tensor(mp), torch.tensor(ddp), rtol=1e-5, atol=1e-5)
    # the gradient norm itself, over parameters split across the tensor-parallel ranks and replicated
    # over the data-parallel ones (clipping rescales the gradients, and Adam would hide a wrong scale)
    norms_ddp, norms_mp = metric_values(runs["ddp"], "train/grad_norm"), metric_values(runs["model_parallel"], "train/grad_norm")
    assert len(norms_mp) == STEPS and min(norms_mp) > 0.5  # above the clip: every step was clipped by it
    torch.testing.assert_close(torch.tensor(norms_mp), torch.tensor(norms_ddp), rtol=1e-5, atol=1e-6)
    final_ddp = load_model_state(checkpoint_at(runs["ddp"], STEPS))
    final_mp = load_model_state(checkpoint_at(runs["model_parallel"], STEPS))
    assert set(final_mp) == set(final_ddp) and final_mp["blocks.0.attn.qkv.weight"].shape == (96, 32)  # gathered whole
    for name in final_ddp:  # the fused q/k/v rows in their order
        torch.testing.assert_close(final_mp[name], final_ddp[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.matrix(strategy="hsdp")
def test_hsdp_2x2_matches_ddp(runs):
    torch.testing.assert_close(torch.tensor(metric_values(runs["hsdp"])), torch.tensor(metric_values(runs["ddp"])), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("source,into", [("ddp", MODEL_PARALLEL), ("model_parallel", ["strategy=ddp", "devices=2"])],
                         ids=["ddp_to_model_parallel", "model_parallel_to_ddp"])
def test_resume_across_meshes_is_exact(runs, tmp_path, source, into):
    """Half a run on one mesh, the other half on another: the straight run's last two losses and
    final state (DCP resharded on read, the fused q/k/v placed back as they were split)."""
    run_inprocess([*BASE, *into, f"ckpt_path={checkpoint_at(runs[source], 2)}"], tmp_path)
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path)), torch.tensor(metric_values(runs["ddp"])[2:]), rtol=1e-5,
                               atol=1e-5)
    resumed, straight = checkpoint_at(tmp_path, STEPS), checkpoint_at(runs["ddp"], STEPS)
    for name, value in load_model_state(straight).items():
        torch.testing.assert_close(load_model_state(resumed)[name], value, rtol=1e-5, atol=1e-6, msg=name)
    state = load_optimizer_state(resumed)["state"]["blocks.1.attn.qkv.weight"]
    torch.testing.assert_close(state["exp_avg"], load_optimizer_state(straight)["state"]["blocks.1.attn.qkv.weight"]["exp_avg"],
                               rtol=1e-5, atol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("source,into", [("ddp", ["strategy=single_device", "data.batch_size=16"]),
                                         ("model_parallel", ["strategy=single_device", "data.batch_size=16"]),
                                         ("hsdp", ["strategy=ddp", "devices=2"])],
                         ids=["ddp@2x8_to_one_x16", "model_parallel_2x2_to_one_x16", "hsdp@4x4_to_ddp@2x8"])
def test_a_resume_in_other_data_shares_continues_on_the_next_sample(runs, tmp_path, source, into, capsys):
    """The data position is kept in samples of the epoch's order: resumed with another number of
    data-parallel ranks and per-rank batch (the same global batch of 16), the run trains on the very
    samples the straight run trains on next, and so gives its losses."""
    run_inprocess([*BASE, *into, f"ckpt_path={checkpoint_at(runs[source], 2)}"], tmp_path)
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path)), torch.tensor(metric_values(runs["ddp"])[2:]), rtol=1e-5,
                               atol=1e-5)
    if "strategy=single_device" in into:  # (a worker's output goes to the launcher, not to capsys)
        assert "the data continues at sample 32 of" in capsys.readouterr().out


@pytest.mark.slow
def test_llama_splits_by_its_own_plan_and_matches_one_process(tmp_path):
    """transformers' base_model_tp_plan at 2 tensor-parallel ranks (the torch checkpoint format:
    full state gathered), against the same model in one process; built on the meta device
    (tests/strategy/test_sharded_from_birth.py: its rotary buffers are made again after the shards)."""
    llama = ["model=hf_causal_lm", "model/config=llama", "model.config.hidden_size=32", "model.config.intermediate_size=64",
             "data.block_size=32", "data.max_bytes=300000", "data.batch_size=8", "data.val_batch_size=32",
             "trainer.val_batches=2", "trainer.progress_bar=false", "trainer.plot=false", "trainer.max_steps=3",
             "trainer.log_every=1", "trainer.val_every=3", "trainer.val_at_start=false", "callbacks=[checkpoint]"]
    run_inprocess([*llama, "strategy=model_parallel", "devices=2"], tmp_path / "tp")
    run_inprocess(llama, tmp_path / "one")
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "tp")), torch.tensor(metric_values(tmp_path / "one")),
                               rtol=1e-5, atol=1e-5)
    split, whole = load_model_state(checkpoints(tmp_path / "tp")[-1]), load_model_state(checkpoints(tmp_path / "one")[-1])
    for name, value in whole.items():
        torch.testing.assert_close(split[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_hsdp_over_two_torchrun_nodes_shards_within_each_node(runs, tmp_path):
    """Two "nodes" of 2 processes each (two torchrun agents, c10d rendezvous on this machine):
    hsdp's default shard group is one node (2 ranks), replicated across the nodes; the same losses
    as ddp on the same global batch."""
    port = free_port()
    node = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "hsdp"]
    args = [*BASE, "strategy=hsdp", "devices=2", "num_nodes=2", "data.batch_size=4"]
    nodes = [torchrun(node, args, tmp_path) for _ in range(2)]
    outputs = [p.communicate(timeout=400)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(outputs)
    assert any("hsdp: mesh: 2 replica(s) x 2 shard(s)" in out for out in outputs), outputs
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "outputs" / "torchrun-hsdp")),
                               torch.tensor(metric_values(runs["ddp"])), rtol=1e-5, atol=1e-5)
