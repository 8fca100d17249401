"""The mesh strategy is a loop over appliers: no branch on a dimension in strategy.py, no file of
framework/strategy/mesh over 300 lines, every applier in ORDER with the base surface, and the
layouts' appliers as their dims call for them (without processes)."""
from __future__ import annotations

import re

import pytest
import torch

from framework.strategy.fsdp import FSDPStrategy
from framework.strategy.hsdp import HSDPStrategy
from framework.strategy.layout import StateLayout
from framework.strategy.mesh import strategy as mesh_strategy
from framework.strategy.mesh.applier import Applier
from framework.strategy.model_parallel import ModelParallelStrategy
from framework.strategy.pipeline import PipelineStrategy
from tests.conftest import ROOT, checkpoint_at, load_model_state, metric_values
from tests.helpers.run_cache import trained_run
from tests.helpers.two_ranks import BASE, STEPS, shared

MESH = ROOT / "framework" / "strategy" / "mesh"
# whether the layout has stages, or a dimension's size compared: a branch on the layout
BRANCH = re.compile(r"\bpipelined\b|pipeline_stages|dims\.\w+\s*(==|!=|<=|>=|<|>)")


def test_the_mesh_strategy_has_no_branch_on_a_dimension():
    text = (MESH / "strategy.py").read_text()
    found = [f"strategy.py:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if BRANCH.search(line)]
    assert not found, "ask the appliers instead:\n" + "\n".join(found)
    assert BRANCH.search("if self.pipelined:") and BRANCH.search("x = dims.tensor > 1")  # the pattern itself
    assert BRANCH.search("can.pipeline_stages")


def test_no_file_of_the_mesh_strategy_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in MESH.rglob("*.py") if (n := len(p.read_text().splitlines())) > 300}
    assert not long, long


def test_divisibility_is_said_one_way_and_routing_layers_are_found_by_class():
    """Every layout rule of the form "X does not divide Y" comes from framework/errors.py `indivisible`
    (no message written by hand in the mesh or construction modules), and no mesh module probes a
    model's layers with hasattr for what the routing contract (framework/construction/routing.py) says."""
    roots = [MESH, ROOT / "framework" / "construction"]
    by_hand = [f"{path.relative_to(ROOT)}:{n}" for root in roots for path in root.rglob("*.py")
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"[\"'][^\"'#]*does not divide", line)]
    assert not by_hand, by_hand
    probes = [f"{path.relative_to(ROOT)}:{n}" for path in MESH.rglob("*.py")
              for n, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r"hasattr\([^)]*(token_group|num_experts|experts|record|loads)", line)]
    assert not probes, probes


def test_every_applier_keeps_to_the_base_surface():
    surface = {name for name in vars(Applier) if not name.startswith("__")}
    for kind in mesh_strategy.ORDER:
        assert issubclass(kind, Applier)
        extra = {name for name in vars(kind) if not name.startswith("_") and name not in surface}
        # an applier's own state may be attributes; its methods are the base's
        assert not {name for name in extra if callable(getattr(kind, name))}, (kind.__name__, extra)


def _kinds(strategy, world: int, devices: int | None = None) -> list[str]:
    strategy.devices = devices or world
    return [type(a).__name__ for a in strategy.appliers(world)]


@pytest.mark.parametrize("strategy,world,kinds", [
    (lambda: FSDPStrategy(), 2, ["RoutingApplier", "ShardingApplier"]),
    (lambda: FSDPStrategy(context_parallel_size=2), 4, ["ContextApplier", "RoutingApplier", "ShardingApplier"]),
    (lambda: FSDPStrategy(expert_parallel_size=2), 2, ["ExpertApplier", "ShardingApplier"]),
    (lambda: HSDPStrategy(shard_size=2), 4, ["RoutingApplier", "ShardingApplier"]),
    (lambda: ModelParallelStrategy(tensor_parallel_size=2), 4, ["TensorApplier", "RoutingApplier", "ShardingApplier"]),
    (lambda: PipelineStrategy(pipeline_parallel_size=2), 2, ["RoutingApplier", "PipelineApplier"]),
    (lambda: PipelineStrategy(pipeline_parallel_size=2), 4, ["RoutingApplier", "ShardingApplier", "PipelineApplier"]),
])
def test_a_layout_has_the_appliers_its_dims_call_for(strategy, world, kinds):
    assert _kinds(strategy(), world) == kinds


def test_what_a_layout_can_do_follows_from_its_appliers():
    pipeline = PipelineStrategy(pipeline_parallel_size=2)
    pipeline.devices = 2
    can = pipeline.abilities
    assert can.pipeline_stages and not can.manual_optimization and not can.position_ids and not can.loss_scaling
    assert pipeline.states == StateLayout("pipelined", data_parallel=1, tensor_parallel=1)
    assert not can.sharded_state and "inside its schedule" in can.single_optimizer_reason
    tensor = ModelParallelStrategy(tensor_parallel_size=2)
    tensor.devices = 2
    assert tensor.abilities.splits_layers and not tensor.abilities.pipeline_stages and tensor.abilities.loss_scaling
    context = FSDPStrategy(context_parallel_size=2)
    context.devices = 2
    assert not context.abilities.splits_layers and context.states.kind == "fully_sharded" and context.abilities.sharded_state


def test_abilities_combine_permissions_requirements_and_libraries():
    from framework.strategy.abilities import Abilities

    combined = Abilities().combined([Abilities(compile=False, native_libraries=("aio",)),
                                     Abilities(requires_cuda=True, single_optimizer_reason="why")])
    assert (combined.compile, combined.requires_cuda, combined.native_libraries) == (False, True, ("aio",))
    assert combined.single_optimizer_reason == "why" and combined.float64


def test_hsdp_with_experts_prints_the_experts_line_too():
    """A branch of the old strategy returned after the replicas' line: hsdp never said its experts."""
    from framework.config.loop_settings import LoopSettings
    from framework.models.gpt import GPT
    from framework.models.moe import MoESettings

    strategy = HSDPStrategy(shard_size=2, expert_parallel_size=2)
    strategy.devices = 4
    strategy.configure_loop(LoopSettings(micro_batch_size=2))
    model = GPT(block_size=16, n_layer=2, n_embd=16, n_head=2, moe=MoESettings(num_experts=4))
    lines = strategy.layout(4, model).lines
    assert any(line.startswith("mesh: 2 replica(s) x 2 shard(s)") for line in lines), lines
    assert any(line.startswith("expert parallel: 2 ranks, 2 of 4 experts each") for line in lines), lines


def test_replicas_of_sharded_groups_compose_with_tensor_and_pipeline_dimensions():
    """shard_size on model_parallel and pipeline: replicas x (shard x tensor) and pipeline x replicas
    (the sharding applier's hybrid mesh beside the others'); the pipeline's optimizer state is
    sharded over one shard group, not its replicas."""
    from framework.models.gpt import GPT

    tensor = ModelParallelStrategy(tensor_parallel_size=2, shard_size=1)
    tensor.devices = 4
    dims = tensor.parallel_dims(4)
    assert (dims.replicate, dims.shard, dims.tensor, dims.data_parallel) == (2, 1, 2, 2)
    stages = PipelineStrategy(pipeline_parallel_size=2, shard_size=2)
    stages.devices = 8
    dims = stages.parallel_dims(8)
    assert (dims.pipeline, dims.replicate, dims.shard) == (2, 2, 2)
    layout = stages.layout(8, GPT(n_layer=2, n_embd=32, n_head=2, block_size=32, vocab_size=64))
    assert layout.states.data_parallel == 2
    assert any("sharded over 2 data-parallel rank(s) (x 2 replicas)" in line for line in layout.lines)


# The reference: the shared fsdp run at 2 ranks x 8 (tests/helpers/two_ranks.py), a global batch of 16.
HYBRID = {
    "replicas2_x_tensor2": ["strategy=model_parallel", "devices=4", "strategy.tensor_parallel_size=2",
                            "strategy.shard_size=1", "data.batch_size=8"],
}  # pipeline stages x replicas: tests/strategy/test_pipeline.py's layouts (its model has the layers)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HYBRID))
def test_a_hybrid_layout_with_tensor_ranks_equals_one_process(name):
    reference, run = shared("fsdp"), trained_run([*BASE, *HYBRID[name]])
    for key in ("train/loss", "train/grad_norm", "val/loss"):
        got, want = metric_values(run, key), metric_values(reference, key)
        assert len(got) == len(want) > 0, key
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5, msg=key)
    assert min(metric_values(run, "train/grad_norm")) > 0.5  # every step clipped: the norm itself is compared
    final, straight = load_model_state(checkpoint_at(run, STEPS)), load_model_state(checkpoint_at(reference, STEPS))
    assert set(final) == set(straight)
    for key, value in straight.items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6, msg=key)


COLLECTIVE_FORWARD = {"fsdp", "fsdp_cpu_offload", "hsdp", "model_parallel", "pipeline", "deepspeed_stage_3",
                      "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme", "fairscale_fsdp", "xla_spmd",
                      "xla_fsdp"}


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "conf" / "strategy").glob("*.yaml") if p.stem != "auto"))
def test_a_shipped_strategy_says_whether_its_forward_is_collective(name):
    """Where it is (weights gathered, layers split, one SPMD program), every rank runs as many
    forwards: task=grpo's rollout then decodes every position on every rank; ddp's and ZeRO-1/2's
    ranks each stop when their own completions have (the ddp run of tests/tasks/test_grpo_runs.py)."""
    from omegaconf import OmegaConf

    from framework.config.targets import import_target

    strategy = import_target(OmegaConf.load(ROOT / "conf" / "strategy" / f"{name}.yaml")._target_, "strategy")()
    strategy.devices = 2
    assert strategy.abilities.collective_forward == (name in COLLECTIVE_FORWARD)
