"""strategy=pipeline (pipeline stages x FSDP2 on torch.distributed.pipelining): the split and the
refusals without processes; at 2 and 4 gloo processes, under the schedules of each stage layout
(one stage a rank, looped, V), with FSDP2 inside a stage, the losses, gradient norms and final
weights of one process at the same global batch; checkpoints that resume across stage counts and
strategies (both ways); the classifier; scoring a pipelined run's checkpoint."""
from __future__ import annotations

import re

import pytest
import torch

from framework.construction.stage_modules import RankPart, layer_groups, model_split, model_stages
from framework.errors import ConfigError, ExitCode, RunExit
from framework.models.gpt import GPT
from framework.models.mlp import MLP
from framework.strategy.model_parallel import ModelParallelStrategy
from framework.strategy.pipeline import PipelineStrategy
from tests.conftest import (
    DIGITS,
    TINY_GPT,
    assert_close_weights,
    checkpoint_at,
    checkpoints,
    load_model_state,
    load_optimizer_state,
    metric_values,
    run_inprocess,
)

# ---- no processes -------------------------------------------------------------------------------


def _strategy(devices: int = 2, batch: int = 8, **kwargs) -> PipelineStrategy:
    from framework.config.loop_settings import LoopSettings

    strategy = PipelineStrategy(**kwargs)
    strategy.devices = devices
    strategy.configure_loop(LoopSettings(micro_batch_size=batch))
    return strategy


def _shape(strategy, world: int) -> tuple[int, int, int]:
    """(pipeline, data-parallel, tensor-parallel sizes) of the strategy's layout at `world` ranks."""
    dims = strategy.parallel_dims(world)
    return dims.pipeline, dims.data_parallel, dims.tensor


def test_mesh_and_microbatches_resolve_auto():
    assert _shape(_strategy(), 4) == (4, 1, 1)  # auto: every rank a pipeline rank
    assert _shape(_strategy(pipeline_parallel_size=2), 4) == (2, 2, 1)
    assert _shape(_strategy(tensor_parallel_size=2), 8) == (4, 1, 2)  # auto: the ranks over the tensor-parallel size
    assert _shape(_strategy(pipeline_parallel_size=2, tensor_parallel_size=2), 8) == (2, 2, 2)
    assert _strategy(pipeline_parallel_size=2).pipeline.microbatch_count(2) == 2  # auto: the stage count (2 pipeline ranks)
    assert _strategy(schedule="interleaved_1f1b", stages_per_rank=3).pipeline.microbatch_count(2) == 6
    assert _strategy(schedule="zbv_zero_bubble").pipeline.stage_count(2) == 4  # a V: two stages a rank
    with pytest.raises(ConfigError, match=r"pipeline_parallel_size=3 does not divide the 4 ranks"):
        _shape(_strategy(pipeline_parallel_size=3), 4)
    with pytest.raises(ConfigError, match=r"pipeline_parallel_size=2 x strategy.tensor_parallel_size=2 does not divide the 6"):
        _shape(_strategy(pipeline_parallel_size=2, tensor_parallel_size=2), 6)
    with pytest.raises(ConfigError, match=r"2 x strategy.data_parallel_size=3 x strategy.tensor_parallel_size=1 is 6 ranks"):
        _shape(_strategy(pipeline_parallel_size=2, data_parallel_size=3), 4)


@pytest.mark.parametrize("settings,devices,world,shape", [
    ({"pipeline_parallel_size": 2}, 4, 4, (2, 1, 2)),  # tensor auto: the node's devices the stages leave
    ({"pipeline_parallel_size": 2, "tensor_parallel_size": 1}, 4, 4, (2, 2, 1)),
    ({"pipeline_parallel_size": 2, "data_parallel_size": 2}, 4, 4, (2, 2, 1)),
    ({"pipeline_parallel_size": 2}, 4, 16, (2, 2, 4)),  # 2 nodes of 4: tensor within a node
    ({"pipeline_parallel_size": 4}, 8, 8, (4, 1, 2)),
])
def test_model_parallel_with_stages_is_the_pipeline_on_a_3d_mesh(settings, devices, world, shape):
    """strategy=model_parallel strategy.pipeline_parallel_size=N lays the pipeline out on a 3-D
    mesh from model_parallel's own keys, and stays the option the user chose (its name in every
    message); without stages it is the 2-D mesh."""
    strategy = ModelParallelStrategy(**settings)
    assert type(strategy) is ModelParallelStrategy and strategy.name == "model_parallel" and strategy.abilities.pipeline_stages
    strategy.devices = devices
    assert _shape(strategy, world) == shape
    strategy.num_nodes = world // devices
    assert strategy.abilities.splits_layers == (shape[2] > 1)
    assert not ModelParallelStrategy(tensor_parallel_size=2).abilities.pipeline_stages


@pytest.mark.parametrize("settings,fragment", [
    ({"schedule": "gpipe"}, "strategy.schedule=gpipe sets the pipeline, but strategy.pipeline_parallel_size is 1"),
    ({"microbatches": 4}, "or drop strategy.microbatches"),
    ({"pipeline_parallel_size": 2, "sequence_parallel": True}, "set strategy.sequence_parallel=false"),
])
def test_model_parallel_refuses_pipeline_keys_without_stages_and_sequence_parallel_with_them(settings, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        ModelParallelStrategy(**settings)


@pytest.mark.parametrize("settings,model,fragment", [
    ({"pipeline_parallel_size": 3}, GPT(n_layer=4), "pipeline_parallel_size=3 does not divide the 2 ranks"),
    ({"schedule": "chimera"}, GPT(n_layer=4), "strategy.schedule=chimera is not a schedule"),
    ({"microbatches": 3}, GPT(n_layer=4), "strategy.microbatches=3 does not divide data.batch_size=8"),
    ({"microbatches": 1}, GPT(n_layer=4), "needs at least one microbatch per stage"),
    ({"schedule": "looped_bfs"}, GPT(n_layer=4), "set strategy.stages_per_rank to 2 or more"),
    ({}, GPT(n_layer=1), "2 stages for a model of 1 layer(s)"),
    ({"layers_per_stage": [1, 2]}, GPT(n_layer=4), "adds up to 3 layers, but the model has 4"),
    ({}, torch.nn.Linear(4, 4), "Linear has no sequence of layers the framework can split"),
    ({"tensor_parallel_size": 2}, GPT(n_layer=4, n_head=3, n_embd=48), "tensor_parallel_size=2 does not divide model.n_head=3"),
])
def test_refusals_name_the_key_and_the_fix(settings, model, fragment):
    problems = _strategy(devices=4 if "tensor_parallel_size" in settings else 2, **settings).problems(model)
    assert len(problems) == 1 and fragment in problems[0], problems


def test_layers_are_split_by_parameters_with_the_embedding_and_head_where_they_sit():
    gpt = GPT(vocab_size=256, n_layer=6, n_embd=32, n_head=2, block_size=32)
    # the first stage's embeddings and the last stage's head copy (a block: ~12.7k; the embedding ~9k)
    assert model_split(gpt, 2) == [range(0, 3), range(3, 6)]
    assert model_split(gpt, 3, [1, 2, 3]) == [range(0, 1), range(1, 3), range(3, 6)]
    mlp = MLP(in_features=64, hidden=128, depth=2, num_classes=10)
    assert layer_groups(mlp) == [[0, 1, 2], [3, 4, 5], [6]]  # a Linear with its ReLU and Dropout


def test_the_ranks_parts_together_are_the_models_state_dict():
    gpt = GPT(vocab_size=64, n_layer=4, n_embd=32, n_head=2, block_size=16)
    split = model_split(gpt, 4)
    stages = model_stages(gpt, split)
    parts = [RankPart(gpt, {i: stages[i]}, 4) for i in range(4)]
    names = [set(part.state_dict()) for part in parts]
    assert set().union(*names) == set(gpt.state_dict())
    assert sum(len(n) for n in names) == len(gpt.state_dict())  # each name once (head.weight: the last stage's copy)
    assert parts[3].tied_copies() == {"tok_emb.weight": "head.weight"} and parts[0].tied_copies() == {}
    v = RankPart(gpt, {0: stages[0], 3: stages[3]}, 4)  # a V schedule's first rank: both ends
    assert {"tok_emb.weight", "head.weight", "blocks.0.ln1.weight", "blocks.3.ln1.weight"} <= set(v.state_dict())


def test_a_model_of_its_own_is_cut_where_its_pipeline_layers_say():
    """A user's model: `pipeline_layers` naming a nested sequence; its stages in a row compute the
    model, under its own names."""

    class Deep(torch.nn.Module):
        pipeline_layers = "body.layers"

        def __init__(self):
            super().__init__()
            self.body = torch.nn.Module()
            self.body.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                                   torch.nn.Linear(8, 2))

        def forward(self, x):
            return self.body.layers(x)

    model, x = Deep(), torch.randn(3, 4)
    stages = model_stages(model, model_split(model, 2))
    assert [list(s.get_submodule("body.layers")) for s in stages] == [["0", "1"], ["2", "3"]]  # the ReLU with its Linear
    out = x
    for stage in stages:
        out = stage(out)
    assert torch.equal(out, model(x))
    assert set(RankPart(model, dict(enumerate(stages)), 2).state_dict()) == set(model.state_dict())


def test_plan_shows_each_stage_and_the_schedules_bubble():
    gpt = GPT(vocab_size=256, n_layer=4, n_embd=32, n_head=2)
    lines = _strategy(schedule="gpipe", microbatches=4).layout(2, gpt).lines
    assert "2 pipeline x 1 data-parallel ranks, 2 stages" in lines[0] and "4 microbatches of 2" in lines[0]
    assert lines[1] == "stages: 0: layers 0-1, 37,696 parameters; 1: layers 2-3, 33,664 parameters"
    assert "37,696 parameters (60% of the model's 63,168" in lines[2]
    assert "bubble 20% of a step by its theory" in lines[3] and "keeps 4 microbatch(es)" in lines[3]  # (p-1)/(m+p-1)


@pytest.mark.parametrize("devices,settings,states,activations", [
    (2, {"schedule": "gpipe", "microbatches": 4}, 16 * 37_696, 0.5),  # all 4 in flight, half the layers
    (2, {"microbatches": 4}, 16 * 37_696, 0.25),  # 1F1B: 2 of the 4 in flight
    (4, {"pipeline_parallel_size": 2}, 8 * 37_696 + 8 * 37_696 / 2, 0.5),  # weights and gradients whole, Adam's sharded
])
def test_plan_estimates_the_most_loaded_ranks_states_and_first_stage_activations(devices, settings, states, activations):
    """fp32 AdamW: 4 bytes each of weight, gradient and two moments per parameter the rank holds
    (its stages', the tied head's copy counted: 37,696 on the first of 2 stages); the first stage's
    activations: its layers' share x the microbatches in flight / their count."""
    from framework.planning.memory import ModelStats, estimate

    gpt = GPT(vocab_size=256, n_layer=4, n_embd=32, n_head=2)
    strategy = _strategy(devices, **settings)
    layout = strategy.layout(devices, gpt)
    assert layout.held_parameters == 37_696
    stats = ModelStats(params=63_168, largest_unit=0, held_params=layout.held_parameters)
    assert estimate(strategy, stats, devices).device == pytest.approx(states)
    assert layout.activation_share == pytest.approx(activations)


TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
                   "looped_bfs": "ScheduleLoopedBFS", "interleaved_zero_bubble": "ScheduleInterleavedZeroBubble",
                   "zbv_zero_bubble": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
def test_the_schedule_a_step_runs_is_the_chosen_one_with_the_configured_microbatches(one_rank_group, name):
    """What the worker's pipeline builds for a batch (framework/strategy/mesh/pipeline/run.py): torch's
    class of the chosen schedule (never a fallback to another), cutting each batch into
    strategy.microbatches (4 here, not the stage count), over the stages this rank holds."""
    import torch.distributed as dist

    from framework.strategy.mesh.dims import ParallelDims
    from framework.strategy.mesh.pipeline.run import PipelineRun
    from framework.strategy.mesh.pipeline.settings import PipelineSettings

    looped = name in ("interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble")
    settings = PipelineSettings(schedule=name, microbatches=4, stages_per_rank=2 if looped else 1)
    run = PipelineRun(settings, ParallelDims(pipeline=1), 0, torch.device("cpu"), "pipeline")
    run.group = dist.group.WORLD
    part = run.split(GPT(vocab_size=64, n_layer=4, n_embd=32, n_head=2, block_size=16))
    schedule = run._schedule_for(part, torch.zeros(8, 16, dtype=torch.long))
    assert type(schedule).__name__ == TORCH_SCHEDULES[name]
    assert schedule._n_microbatches == 4
    stages = 2 if looped or name in ("zbv_zero_bubble", "dualpipev") else 1  # a V holds both ends
    assert schedule._num_stages == stages == len(part.stages)


# ---- 2 and 4 processes ---------------------------------------------------------------------------

STEPS = 4
BASE = [*TINY_GPT, "model.n_layer=8", f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.val_every=2",
        "model.dropout=0.0", "trainer.val_at_start=false", "callbacks=[checkpoint]", "trainer.clip_grad_norm=0.5",
        "callbacks.checkpoint.every_n_steps=2"]
PIPELINES = {  # one stage a rank, looped, V; at 4 processes also FSDP2 within each stage
    "1f1b@2": ["devices=2"],
    "gpipe@2 accumulating": ["devices=2", "strategy.schedule=gpipe", "data.batch_size=4", "trainer.accumulate=2"],
    "interleaved_1f1b@2 recomputing": ["devices=2", "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2",
                                       "trainer.activation_checkpointing=true"],
    "zbv_zero_bubble@2": ["devices=2", "strategy.schedule=zbv_zero_bubble"],
    "dualpipev@2": ["devices=2", "strategy.schedule=dualpipev", "strategy.microbatches=4"],
    "interleaved_zero_bubble@4": ["devices=4", "strategy.schedule=interleaved_zero_bubble",
                                  "strategy.stages_per_rank=2"],
    "1f1b@2xfsdp@2": ["devices=4", "strategy.pipeline_parallel_size=2", "data.batch_size=4", "checkpoint_io=dcp"],
    # pipeline x data x tensor 2x1x2, spelled as model_parallel with stages (tensor_parallel_size auto: 2)
    "1f1b@2xtp@2": ["strategy=model_parallel", "devices=4", "strategy.pipeline_parallel_size=2", "checkpoint_io=dcp"],
    # pipeline x replicas of a one-rank shard group (hybrid sharding of each stage)
    "1f1b@2xreplicas@2": ["devices=4", "strategy.pipeline_parallel_size=2", "strategy.shard_size=1", "data.batch_size=4"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    out = {"one": root / "one"}
    run_inprocess([*BASE, "strategy=single_device"], out["one"])
    for name, settings in PIPELINES.items():
        out[name] = root / name.replace("@", "_at_").replace(" ", "_")
        chosen = [] if settings[0].startswith("strategy=") else ["strategy=pipeline"]
        run_inprocess([*BASE, *chosen, *settings], out[name])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", PIPELINES)
@pytest.mark.matrix(strategy="pipeline")
def test_every_layout_gives_one_processs_losses_norms_and_weights(runs, name):
    """Same global batch (8): the losses and the clipped gradient's norm (over every stage, the tied
    head counted once) at every step, and the final weights, as one process computes them."""
    one, pipelined = metric_values(runs["one"]), metric_values(runs[name])
    assert len(pipelined) == STEPS and pipelined[-1] < pipelined[0]
    torch.testing.assert_close(torch.tensor(pipelined), torch.tensor(one), rtol=1e-5, atol=1e-5)
    norms = metric_values(runs[name], "train/grad_norm")
    assert min(norms) > 0.5  # above the clip: every step was clipped by it
    torch.testing.assert_close(torch.tensor(norms), torch.tensor(metric_values(runs["one"], "train/grad_norm")), rtol=1e-5,
                               atol=1e-6)
    torch.testing.assert_close(torch.tensor(metric_values(runs[name], "val/loss")), torch.tensor(metric_values(runs["one"], "val/loss")),
                               rtol=1e-5, atol=1e-5)
    assert_close_weights(checkpoint_at(runs["one"], STEPS), checkpoint_at(runs[name], STEPS))


@pytest.mark.slow
def test_the_checkpoint_is_the_unsplit_models(runs):
    """Whole-model names, the tied head saved as the embedding (one tensor), the optimizer state of
    each parameter once, under the one-process run's names."""
    state = load_model_state(checkpoint_at(runs["1f1b@2"], STEPS))
    assert state["head.weight"].data_ptr() == state["tok_emb.weight"].data_ptr()
    mine, theirs = load_optimizer_state(checkpoint_at(runs["1f1b@2"], STEPS)), load_optimizer_state(checkpoint_at(runs["one"], STEPS))
    assert set(mine["state"]) == set(theirs["state"]) and mine["param_groups"] == theirs["param_groups"]
    torch.testing.assert_close(mine["state"]["blocks.7.mlp.0.weight"]["exp_avg_sq"],
                               theirs["state"]["blocks.7.mlp.0.weight"]["exp_avg_sq"], rtol=1e-5, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("source,into", [
    ("1f1b@2", ["strategy=pipeline", "devices=4", "strategy.microbatches=4"]),
    ("1f1b@2", ["strategy=single_device"]),
    ("one", ["strategy=pipeline", "devices=2", "strategy.schedule=dualpipev", "strategy.microbatches=4"]),
    ("1f1b@2xfsdp@2", ["strategy=fsdp", "devices=2", "data.batch_size=4"]),
    ("1f1b@2xtp@2", ["strategy=model_parallel", "devices=2"]),
    ("one", ["strategy=pipeline", "devices=4", "strategy.tensor_parallel_size=2", "strategy.pipeline_parallel_size=2",
             "strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2"]),
], ids=["2_stages_to_4", "2_stages_to_one_process", "one_process_to_a_V", "dcp_pipeline_x_fsdp_to_fsdp",
        "dcp_pipeline_x_tensor_to_model_parallel", "one_process_to_interleaved_pipeline_x_tensor"])
def test_a_checkpoint_resumes_at_another_stage_count_and_strategy(runs, tmp_path, source, into):
    run_inprocess([*BASE, *into, f"ckpt_path={checkpoint_at(runs[source], 2)}"], tmp_path)
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path)), torch.tensor(metric_values(runs["one"])[2:]), rtol=1e-5,
                               atol=1e-5)
    assert_close_weights(checkpoint_at(runs["one"], STEPS), checkpoint_at(tmp_path, STEPS))


@pytest.mark.slow
@pytest.mark.parametrize("layers,fragment", [(9, 'Missing key(s) in state_dict: "blocks.8.attn.proj.bias"'),
                                             (7, 'Unexpected key(s) in state_dict: "blocks.7.attn.proj.bias"')])
def test_a_checkpoint_of_other_layers_is_refused_naming_them(runs, tmp_path, capsys, layers, fragment):
    """Every rank stops alike (exit 2), though only the last stage's lacks or gains layers."""
    with pytest.raises(RunExit) as refused:
        run_inprocess([*BASE, f"model.n_layer={layers}", "strategy=pipeline", "devices=2",
                       f"ckpt_path={checkpoint_at(runs['1f1b@2'], 2)}"], tmp_path)
    assert refused.value.code == ExitCode.USER_ERROR
    err = capsys.readouterr().err
    assert "does not fit this model/optimizer" in err and fragment in err, err[-2000:]


@pytest.mark.slow
def test_the_classifier_pipelined_gives_one_processs_numbers(tmp_path):
    """The MLP's net split into stages (a Linear with its ReLU and Dropout a layer), each sample's
    mean loss as one process computes it."""
    digits = [*DIGITS, "trainer.max_steps=3", "trainer.log_every=1", "data.batch_size=16", "trainer.val_every=3",
              "callbacks=[checkpoint]", "model.depth=3"]
    run_inprocess([*digits, "strategy=single_device"], tmp_path / "one")
    run_inprocess([*digits, "strategy=pipeline", "devices=2", "strategy.layers_per_stage=[1,3]"], tmp_path / "pp")
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "pp")), torch.tensor(metric_values(tmp_path / "one")),
                               rtol=1e-5, atol=1e-5)
    for key in ("val/loss", "val/accuracy"):
        assert metric_values(tmp_path / "pp", key) == pytest.approx(metric_values(tmp_path / "one", key), abs=1e-5)
    assert_close_weights(checkpoints(tmp_path / "one")[-1], checkpoints(tmp_path / "pp")[-1])


@pytest.mark.slow
def test_lora_adapters_pipelined_train_save_and_resume_as_in_one_process(tmp_path):
    """The adapters of every stage in the checkpoint (a rank holds only its own), the frozen head's
    copy frozen too; resumed in one process, the straight run's numbers."""
    lora = [*BASE, "model.n_layer=4", "adapter=lora", "trainer.clip_grad_norm=null"]
    run_inprocess([*lora, "strategy=single_device"], tmp_path / "one")
    run_inprocess([*lora, "strategy=pipeline", "devices=2"], tmp_path / "pp")
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "pp")), torch.tensor(metric_values(tmp_path / "one")),
                               rtol=1e-5, atol=1e-5)
    saved = load_model_state(checkpoint_at(tmp_path / "pp", 2))
    assert len(saved) == 32 and all(".lora_" in name for name in saved)  # 4 blocks x 4 layers x (A, B)
    run_inprocess([*lora, "strategy=single_device", f"ckpt_path={checkpoint_at(tmp_path / 'pp', 2)}"], tmp_path / "resumed")
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "resumed")), torch.tensor(metric_values(tmp_path / "one")[2:]),
                               rtol=1e-5, atol=1e-5)
    assert_close_weights(checkpoint_at(tmp_path / "one", STEPS), checkpoint_at(tmp_path / "resumed", STEPS))


@pytest.mark.slow
def test_looped_bfs_without_clipping_sums_the_tied_heads_gradient_as_one_process(tmp_path):
    """Unclipped, a wrong sum of the tied head's two gradients (the embedding's, on the first stage,
    and the head copy's, on the last) changes the update itself: the losses and final weights
    are one process's. Under looped_bfs, the one schedule the other layouts do not run."""
    unclipped = [*BASE, "trainer.clip_grad_norm=null", "trainer.max_steps=3", "trainer.val_every=3"]
    run_inprocess([*unclipped, "strategy=single_device"], tmp_path / "one")
    run_inprocess([*unclipped, "strategy=pipeline", "devices=2", "strategy.schedule=looped_bfs",
                   "strategy.stages_per_rank=2"], tmp_path / "pp")
    for key in ("train/loss", "val/loss"):
        assert len(metric_values(tmp_path / "one", key)) == (3 if key == "train/loss" else 1)
        torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "pp", key)),
                                   torch.tensor(metric_values(tmp_path / "one", key)), rtol=1e-5, atol=1e-5, msg=key)
    assert_close_weights(checkpoint_at(tmp_path / "one", 3), checkpoint_at(tmp_path / "pp", 3))


@pytest.mark.slow
def test_framework_test_scores_a_pipelined_run_under_its_pipeline_as_one_process_does(runs):
    """`framework test CHECKPOINT` of a 1f1b@2 run scores it under the run's own pipeline (2
    processes): the one-process run's scores of its own (equal) checkpoint."""
    import json

    from framework.cli import main as framework_main

    scores = {}
    for name in ("one", "1f1b@2"):
        assert framework_main(["test", str(checkpoint_at(runs[name], STEPS)), "trainer.test_batches=2"]) == 0
        record = json.loads((runs[name] / "test_metrics.json").read_text())
        scores[name] = record["metrics"]
        assert record["world_size"] == (1 if name == "one" else 2)
    assert scores["one"].keys() == scores["1f1b@2"].keys() and "test/loss" in scores["one"]
    for key, value in scores["one"].items():
        assert scores["1f1b@2"][key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.slow
def test_a_pipelined_run_that_diverges_stops_with_exit_3_keeping_its_finite_checkpoints(tmp_path):
    """lr=1e4: the loss becomes non-finite (trainer.on_nonfinite=stop); the ranks of every stage
    stop together, exit 3, no checkpoint of non-finite weights written."""
    with pytest.raises(RunExit) as stopped:
        run_inprocess([*BASE, "strategy=pipeline", "devices=2", "optimizer.lr=1e4", "trainer.max_steps=40",
                       "trainer.log_every=1", "callbacks.checkpoint.every_n_steps=1"], tmp_path)
    assert stopped.value.code == ExitCode.DIVERGED
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    stopped_at = summary["diverged"]["stopped_at"]
    assert summary["status"] == "diverged" and 1 < stopped_at < 40
    saved = sorted((tmp_path / "checkpoints").glob("step_*"))
    # a checkpoint every step: those before the non-finite one, each of finite weights, and none after
    assert [int(s.name.split("_")[1]) for s in saved] == list(range(1, stopped_at))[-len(saved):] and saved
    for checkpoint in saved:
        state = load_model_state(checkpoint)
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), checkpoint


@pytest.mark.slow
@pytest.mark.matrix(strategy="pipeline", precision="bf16")
def test_bf16_autocast_pipelined_gives_one_processs_bf16_numbers(tmp_path):
    """bf16 autocast runs inside the schedule's forwards. Within bf16's rounding, not float32's: a
    microbatch's weight gradients are rounded to bf16 by its own matmuls, one process's by one over
    the whole batch."""
    bf16 = [*BASE, "model.n_layer=4", "trainer.max_steps=3", "precision=bf16", "trainer.val_every=3"]
    run_inprocess([*bf16, "strategy=single_device"], tmp_path / "one")
    run_inprocess([*bf16, "strategy=pipeline", "devices=2"], tmp_path / "pp")
    for key in ("train/loss", "val/loss"):
        torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "pp", key)),
                                   torch.tensor(metric_values(tmp_path / "one", key)), rtol=2e-3, atol=0, msg=key)
    assert metric_values(tmp_path / "pp")[0] == pytest.approx(metric_values(tmp_path / "one")[0], abs=1e-5)  # same start


HF_FAMILIES = {  # tiny decoders of each family, dropout off; qwen2 and gpt2 with a tied head
    "llama": ["model/config=llama", "model.config.hidden_size=32", "model.config.intermediate_size=64",
              "model.config.num_hidden_layers=4"],
    "qwen2": ["model/config=qwen2", "model.config.hidden_size=32", "model.config.intermediate_size=64",
              "model.config.num_hidden_layers=4", "+model.config.tie_word_embeddings=true"],
    "gpt2": ["model/config=gpt2", "model.config.n_embd=32", "model.config.n_layer=4", "+model.config.resid_pdrop=0",
             "+model.config.embd_pdrop=0", "+model.config.attn_pdrop=0"],
}
HF_LAYOUTS = {"llama": ["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=2"],
              "qwen2": ["strategy.schedule=dualpipev", "strategy.microbatches=4"], "gpt2": []}


def test_hugging_face_stages_keep_the_models_names_and_outputs():
    """Each family's stages in a row compute the model's logits exactly, and a V schedule's first
    rank (the first and last stages) holds the model's names, the rotary embedding once."""
    transformers = pytest.importorskip("transformers")
    from framework.models.hf_stages import add_pipeline_stages

    configs = [transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=64),
               transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=64, tie_word_embeddings=True),
               transformers.GPT2Config(n_embd=32, n_layer=4, n_head=4, vocab_size=64, n_positions=32, bos_token_id=0,
                                       eos_token_id=0)]
    for config in configs:
        for attention in ("sdpa", "eager"):
            torch.manual_seed(0)
            lm = add_pipeline_stages(transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention))
            ids = torch.randint(0, 64, (2, 16))
            stages = model_stages(lm.eval(), model_split(lm, 4))
            x = ids
            for stage in stages:
                x = stage(x)
            assert torch.equal(x, lm(ids).logits), (config.model_type, attention)
            names = set(RankPart(lm, {0: stages[0], 3: stages[3]}, 4).state_dict())
            assert {n for n in lm.state_dict() if ".layers.1." not in n and ".h.1." not in n
                    and ".layers.2." not in n and ".h.2." not in n} == names, config.model_type


@pytest.mark.slow
@pytest.mark.parametrize("family", HF_FAMILIES)
def test_hugging_face_families_pipelined_give_one_processs_numbers(tmp_path, family):
    pytest.importorskip("transformers")
    hf = ["model=hf_causal_lm", *HF_FAMILIES[family], "data.block_size=32", "data.max_bytes=300000",
          "data.batch_size=8", "data.val_batch_size=32", "trainer.val_batches=2", "trainer.progress_bar=false",
          "trainer.plot=false", "trainer.max_steps=3", "trainer.log_every=1", "trainer.val_every=3",
          "trainer.val_at_start=false", "callbacks=[checkpoint]", "trainer.clip_grad_norm=0.5"]
    run_inprocess([*hf, "strategy=single_device"], tmp_path / "one")
    run_inprocess([*hf, "strategy=pipeline", "devices=2", *HF_LAYOUTS[family]], tmp_path / "pp")
    for key in ("train/loss", "train/grad_norm", "val/loss"):
        torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "pp", key)),
                                   torch.tensor(metric_values(tmp_path / "one", key)), rtol=1e-5, atol=1e-5, msg=key)
    assert_close_weights(checkpoints(tmp_path / "one")[-1], checkpoints(tmp_path / "pp")[-1])


@pytest.mark.slow
def test_values_a_task_logs_beside_its_loss_are_logged_under_pipeline(tmp_path, monkeypatch):
    """A task whose training_step returns {"loss", "accuracy"} (and whose summed_loss does the same
    for the stages) logs train/accuracy under pipeline stages as on one process, step by step; its
    mean loss (a training_step of its own: not normalised by the step's tokens) is the one process's."""
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "tests.helpers.")
    task = ["task._target_=tests.helpers.lm_tasks.LanguageModelingWithAccuracy", "trainer.max_steps=2",
            "trainer.log_every=1", "model.dropout=0.0", "trainer.val_at_start=false", "model.n_layer=2"]
    run_inprocess([*TINY_GPT, *task, "strategy=single_device"], tmp_path / "one")
    run_inprocess([*TINY_GPT, *task, "strategy=pipeline", "devices=2"], tmp_path / "pp")
    accuracy = metric_values(tmp_path / "pp", "train/accuracy")
    assert len(accuracy) == 2 and all(0.0 < a < 1.0 for a in accuracy)
    torch.testing.assert_close(torch.tensor(accuracy), torch.tensor(metric_values(tmp_path / "one", "train/accuracy")),
                               rtol=0, atol=0.01)  # an argmax tie may flip one token of the 256
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "pp")), torch.tensor(metric_values(tmp_path / "one")),
                               rtol=1e-5, atol=1e-5)
