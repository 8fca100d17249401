"""fault_tolerance=torchft: replica groups that go on without a dead peer and heal from a live one.

The end-to-end tests run `python train.py fault_tolerance=torchft ...` as a user types it: one
command starts torchft's lighthouse and every group; a group SIGKILLs itself mid-run
(tests/helpers/killer.py), the command restarts it, it copies a live peer's state and both end
with bit-equal weights (the digests in their summary.json)."""
from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from framework.config.resolvers import example_data
from framework.data.sampler import EpochSampler, rank_sampler
from framework.errors import ConfigError, ExitCode
from framework.fault_tolerance.base import GroupLayout
from framework.fault_tolerance.torchft import TorchFT, _layout_code
from framework.launch.replica_groups import group_command
from framework.strategy.ddp import DDPStrategy
from tests.conftest import ROOT, TINY_GPT, checkpoint_at, checkpoints, compose_cfg, run_train
from tests.helpers.in_process import run_command
from tests.helpers.killer import dealt_runs

ENV = {"PYTHONPATH": str(ROOT), "FRAMEWORK_TRUST_ALLOW": "tests.helpers."}  # the fault injectors are test code
FAST = ["fault_tolerance=torchft", "fault_tolerance.heartbeat_timeout_ms=1000", "fault_tolerance.join_timeout_ms=200",
        "fault_tolerance.quorum_timeout_s=120", "fault_tolerance.step_timeout_s=30"]


# ---- no processes -------------------------------------------------------------------------------

def test_each_group_reads_its_own_block_of_every_steps_shares():
    """Group g of G takes shares g*n .. g*n+n-1 of the G*n data-parallel shares: together the
    groups read what one run of G*n ranks reads, each sample once."""
    seen = []
    for group in range(2):
        for rank in range(2):
            strategy = DDPStrategy()
            strategy.replica_share = (2, group)
            strategy.__class__ = type("Rank", (DDPStrategy,), {"world_size": 2, "global_rank": rank})
            sampler = rank_sampler(list(range(40)), strategy, shuffle=True, seed=3)
            assert sampler.replicas == 4 and sampler.rank == group * 2 + rank
            seen.extend(iter(sampler))
    assert sorted(seen) == list(range(40))


@pytest.mark.parametrize("settings,fragment", [
    ({"min_replicas": 3}, "fault_tolerance.min_replicas=3 is more than fault_tolerance.replica_groups=2"),
    ({"replica_id": 2, "lighthouse": "host:1"}, "fault_tolerance.replica_id=2: the groups are numbered 0 to 1"),
    ({"replica_id": 0}, "start one with `framework lighthouse` and pass its address"),
])
def test_its_own_settings_are_judged_before_launch(settings, fragment):
    assert any(fragment in problem for problem in TorchFT(**settings).problems())


@pytest.mark.parametrize("overrides,fragment", [
    ([*TINY_GPT, "strategy=deepspeed_stage_2", "devices=2"], "fault_tolerance=torchft with strategy=deepspeed_stage_2: "
     "DeepSpeed's engine reduces the gradients and steps the optimizer in one call"),
    ([*TINY_GPT, "strategy=ddp_sharded", "devices=2"], "with strategy=ddp_sharded: fairscale's sharded optimizer (OSS)"),
    ([*TINY_GPT, "strategy=fsdp_cpu_offload", "devices=2", "fault_tolerance.process_group=nccl"],
     "offloading to the CPU: the gradients the groups average live in host memory"),
    (["model=gan", "data=gaussian_ring", "task=gan"], "with a task that steps its optimizers itself"),
])
def test_what_a_replica_group_cannot_be_is_refused_by_the_table(overrides, fragment):
    from framework.preflight import prepare

    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        prepare(compose_cfg(["fault_tolerance=torchft", *overrides]))


@pytest.mark.parametrize("strategy", ["fairscale_fsdp", "single_xla", "xla_spmd", "xla_fsdp"])
def test_strategies_that_cannot_be_replica_groups_say_why(strategy):
    """The refusal's reason is the strategy's own (the table adds the option names and the fix)."""
    from omegaconf import OmegaConf

    from framework.config.compatibility import judge
    from framework.config.plan_facts import Plan
    from framework.config.targets import import_target
    from framework.fault_tolerance.torchft import TorchFT

    target = OmegaConf.load(ROOT / "conf" / "strategy" / f"{strategy}.yaml")._target_
    chosen = import_target(target, "strategy")()
    plan = Plan(chosen.accelerator, chosen, chosen.precision, chosen.checkpoint_io, chosen.cluster, 2, 1,
                fault_tolerance=TorchFT())
    reason = {"fairscale_fsdp": "fairscale keeps the parameters flattened", "single_xla": "XLA compiles the step",
              "xla_spmd": "XLA compiles the step", "xla_fsdp": "XLA compiles the step"}[strategy]
    assert any(r.startswith(f"fault_tolerance=torchft with strategy={strategy}: {reason}") for r in judge(plan)[0])


@pytest.mark.parametrize("strategy", ["hsdp", "model_parallel", "pipeline", "fsdp_cpu_offload"])
def test_every_layout_of_the_mesh_can_be_a_replica_group(strategy):
    from framework.preflight import prepare

    prepared = prepare(compose_cfg(["fault_tolerance=torchft", *TINY_GPT, "model.n_layer=2", f"strategy={strategy}",
                                    "devices=2"]), strict=False)
    assert not [r for r in prepared.refusals if "fault_tolerance" in r], prepared.refusals


class _Peers:
    """torchft's Manager as average_gradients uses it: each allreduce averages this group's tensor
    with the one other group's tensor of the same size (the peer's step loss and layout code, then
    its gradients)."""

    def __init__(self, *peer_tensors):
        self.peer = {t.numel(): t for t in peer_tensors}
        self.reported = []

    def allreduce(self, tensor):
        tensor.copy_((tensor + self.peer[tensor.numel()]) / 2)
        return self

    def wait(self):
        return None

    def errored(self):
        return None

    def report_error(self, err):
        self.reported.append(str(err))


def _group(layout: GroupLayout, peers: _Peers, new_in_quorum: bool) -> TorchFT:
    ft = TorchFT()
    ft._manager, ft._layout, ft._layout_code = peers, layout, _layout_code(layout, "cpu")
    ft._new_in_quorum, ft._speaks = new_in_quorum, False
    return ft


MINE = GroupLayout.of("strategy=ddp at 1 process a group", [("w", (4, 2), "torch.float32")])
OTHER = GroupLayout.of("strategy=ddp at 1 process a group", [("w", (2, 4), "torch.float32")])


def test_the_step_loss_and_gradients_are_averaged_over_groups_holding_the_same():
    weight = torch.nn.Parameter(torch.zeros(4, 2))
    weight.grad = torch.ones(4, 2)
    peer_shared = torch.cat([torch.tensor([5.0], dtype=torch.float64), _layout_code(MINE, "cpu")])
    peers = _Peers(peer_shared, torch.full((8,), 3.0))
    loss = _group(MINE, peers, new_in_quorum=True).average_gradients([weight], torch.tensor(2.0, dtype=torch.float64))
    assert loss.item() == 3.5 and torch.equal(weight.grad, torch.full((4, 2), 2.0)) and peers.reported == []


@pytest.mark.parametrize("new_in_quorum", [True, False], ids=["joining", "running"])
def test_groups_whose_ranks_hold_other_parts_never_average(new_in_quorum):
    """The joining group stops naming what its ranks hold; a running group leaves the step
    uncommitted (torchft's error) and its gradients untouched, and goes on."""
    weight = torch.nn.Parameter(torch.zeros(4, 2))
    weight.grad = torch.ones(4, 2)
    peers = _Peers(torch.cat([torch.tensor([5.0], dtype=torch.float64), _layout_code(OTHER, "cpu")]),
                   torch.full((8,), 3.0))
    group = _group(MINE, peers, new_in_quorum)
    if new_in_quorum:
        with pytest.raises(ConfigError, match=r"replica group 0 holds strategy=ddp at 1 process a group, and another "
                                              r"group in this step's quorum holds something else.*same strategy, devices"):
            group.average_gradients([weight], torch.tensor(2.0, dtype=torch.float64))
    else:
        group.average_gradients([weight], torch.tensor(2.0, dtype=torch.float64))
        assert len(peers.reported) == 1 and "holds something else" in peers.reported[0]
    assert torch.equal(weight.grad, torch.ones(4, 2))


def test_a_checkpoint_of_other_replica_groups_is_refused_naming_them():
    saved = TorchFT(replica_groups=2)
    saved._resumed = {"step": 12, "batches_committed": 24}
    with pytest.raises(ConfigError, match="resume with fault_tolerance.replica_groups=2, or under fault_tolerance=none"):
        TorchFT(replica_groups=3).load_state_dict(saved.state_dict())
    resumed = TorchFT(replica_groups=2)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.state_dict() == {"replica_groups": 2, "manager": {"step": 12, "batches_committed": 24}}


def test_each_group_runs_this_command_again_with_its_own_keys():
    argv = ["train.py", "trainer.max_steps=9", "fault_tolerance=torchft", "hydra.run.dir=x", "fault_tolerance.replica_id=5"]
    command = group_command(argv, 1, "http://host:7", ROOT / "out" / "replica_1", restarted=True)
    assert command[1:] == ["train.py", "trainer.max_steps=9", "fault_tolerance=torchft", "fault_tolerance.replica_id=1",
                           "fault_tolerance.lighthouse=http://host:7", f"hydra.run.dir={ROOT / 'out' / 'replica_1'}",
                           "resume=auto"]
    first = group_command([*argv, "resume=auto"], 0, "http://host:7", ROOT / "out" / "replica_0", restarted=False)
    assert "resume=auto" in first  # a user's resume of the whole run reaches every group


# ---- replica groups, killed and healed ----------------------------------------------------------

def _losses(run_dir) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


@pytest.mark.slow
@pytest.mark.parametrize("devices,killed,layout,shares", [
    (1, 1, [], 1), (2, 0, ["strategy=fsdp"], 2),
    (2, 1, ["strategy=model_parallel", "strategy.tensor_parallel_size=2"], 1),
    (2, 1, ["strategy=pipeline", "model.n_layer=2"], 1)],
    ids=["2_groups_x_1_process_group_1_killed", "2_groups_x_2_fsdp_processes_group_0_killed",
         "2_groups_x_tensor_parallel_2", "2_groups_x_2_pipeline_stages"])
def test_a_killed_group_is_restarted_heals_from_its_peer_and_ends_with_its_weights(tmp_path, devices, killed, layout,
                                                                                    shares):
    """At 2 x 2, FSDP2 shards within each group and the groups replicate (torchft's HSDP): the
    average and the heal go shard by shard, rank r to rank r; so do a tensor-parallel group's split
    layers and a pipeline's stages (both ranks of such a group read one data share: `shares`). Group
    0 is the one that writes the checkpoints while it lives: killed, the survivor writes them while
    it steps alone."""
    steps, killed_at = 40, 10
    args = [*TINY_GPT, *FAST, f"devices={devices}", f"trainer.max_steps={steps}", "trainer.log_every=5",
            "trainer.val_every=1000", "name=ft", "scheduler.total_steps=40", "callbacks.checkpoint.every_n_steps=1",
            "callbacks.checkpoint.keep_last_k=40",
            "+callbacks.killer._target_=tests.helpers.killer.KillReplicaGroupOnce", f"+callbacks.killer.group={killed}",
            f"+callbacks.killer.step={killed_at}", "+callbacks.pace._target_=tests.helpers.killer.PaceWhileAlone",
            "+callbacks.pace.seconds=1.5",  # the survivor waits for the restart (slower on a loaded machine)
            "+callbacks.samples._target_=tests.helpers.killer.RecordSamples"]
    args += layout
    result = run_train(args, tmp_path, timeout=600, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "outputs" / "ft"
    summary = json.loads((run / "summary.json").read_text())
    survivor, healed = summary["replica_groups"][1 - killed], summary["replica_groups"][killed]
    assert summary["weights_agree"], summary
    assert survivor["replicas"]["weights_sha256"] == healed["replicas"]["weights_sha256"]
    assert survivor["starts"] == 1 and survivor["exits"] == [0]
    assert healed["starts"] == 2 and healed["exits"][-1] == 0 and healed["exits"][0] != 0
    # the survivor went on alone: steps with one group taking part, committed (none lost)
    alone = survivor["replicas"]["participants"].get("1", 0)
    assert alone >= 1, survivor["replicas"]
    assert survivor["replicas"]["final_step"] == healed["replicas"]["final_step"] == steps
    # the restarted group copied the survivor's state once, past the step it died at
    (heal,) = healed["replicas"]["heals"]
    assert killed_at < heal["step"] < steps and heal["seconds"] < 30
    assert set(healed["replicas"]["participants"]) == {"2"}  # from its first step on, both take part again
    assert f"replicas: group {killed} healed from a live peer" in result.stdout
    for group in (survivor, healed):
        losses = _losses(run / f"replica_{group['replica_id']}")
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3, losses
    # after its heal the restarted group reads what it would have read undisturbed: the next samples
    # of its own share of the epoch's order, from the survivor's step on (not its own old position,
    # not another group's share)
    batch = 8  # TINY_GPT's data.batch_size, one micro-batch a step
    for rank in range(devices):
        records = run / f"replica_{killed}" / "samples"
        dealt = json.loads((records / "sampler.json").read_text())
        share = killed * shares + rank % shares  # a tensor-parallel group's or a pipeline's ranks read one share
        order = EpochSampler(dealt["length"], dealt["replicas"], share, shuffle=dealt["shuffle"],
                             seed=dealt["seed"])
        order.set_epoch(0)
        undisturbed = list(order)
        (first_life, first), *later = dealt_runs(records / f"rank{rank}.txt")
        assert first_life == (0, 0, 0) and first[:killed_at * batch] == undisturbed[:killed_at * batch]
        (step, epoch, _), after_heal = later[-1]
        assert step == heal["step"] and epoch == 0, later
        trained = (steps - heal["step"]) * batch
        assert after_heal[:trained] == undisturbed[heal["step"] * batch:steps * batch]
    # one live group wrote each checkpoint: while the killed group was away, the survivor did
    written = {g: {int(c.name.split("_")[1]) for c in (run / f"replica_{g}" / "checkpoints").glob("step_*")}
               for g in (0, 1)}
    assert not written[0] & written[1], written  # never both
    away = set(range(killed_at + 1, heal["step"]))  # steps the survivor trained alone
    assert away and away <= written[1 - killed], (away, written)
    assert not away & written[killed]
    if killed == 0:  # group 0 was the writer before it died
        assert set(range(1, killed_at + 1)) <= written[0], written


@pytest.mark.slow
def test_a_rollout_trained_several_steps_forms_each_steps_quorum_and_a_killed_group_heals_into_it(tmp_path):
    """task=grpo with task.num_iterations=2: one rollout, two optimizer steps, and each of them
    forms the groups' quorum (a group that dies between them is noticed at the second, not a
    rollout later). Group 1 is killed after step 5, the first step of its third rollout; restarted,
    it heals from the survivor between two iterations of one rollout (the survivor waits there for
    it: tests/helpers/killer.py RejoinMidRollout), copying the rolled batches still to train with
    the state, and both end with the same weights."""
    steps = 12
    args = [*FAST, "task=grpo", "data=prompt_files", f"data.files={example_data('arithmetic_prompts.jsonl')}",
            "data.max_prompt_tokens=8", "data.batch_size=2", "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
            "model.block_size=16", "task.num_generations=4", "task.max_completion_tokens=4", "task.stop='\\n'",
            "task.rewards=[exact_match,length]", "task.num_iterations=2", f"trainer.max_steps={steps}",
            "trainer.log_every=1", "trainer.val_every=1000", "trainer.progress_bar=false", "trainer.plot=false",
            "name=ft", "callbacks.checkpoint.every_n_steps=1000",
            "+callbacks.killer._target_=tests.helpers.killer.KillReplicaGroupOnce", "+callbacks.killer.group=1",
            "+callbacks.killer.step=5", "+callbacks.rejoin._target_=tests.helpers.killer.RejoinMidRollout"]
    result = run_train(args, tmp_path, timeout=600, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "outputs" / "ft" / "summary.json").read_text())
    assert summary["weights_agree"], summary
    survivor, healed = (group["replicas"] for group in summary["replica_groups"])
    (heal,) = healed["heals"]
    assert 5 < heal["step"] < steps and survivor["final_step"] == healed["final_step"] == steps
    assert heal["step"] % 2 == 1, heal  # after a rollout's first step: its second still to train
    # one quorum per optimizer step, the rollouts' second iterations included (a step the kill left
    # uncommitted is taken again: its quorum too)
    assert sum(survivor["participants"].values()) == steps + survivor["uncommitted_steps"], survivor
    assert survivor["participants"].get("1", 0) >= 1, survivor  # it went on alone while group 1 was away


@pytest.mark.slow
def test_a_run_whose_groups_all_stopped_resumes_and_its_checkpoint_resumes_under_plain_ddp(tmp_path):
    """2 groups x 2 ddp processes; a NaN in one group's step 5 is left out by every group (on_nonfinite=skip).
    One live group writes the checkpoints (with torchft's step); resume=auto
    restarts every group:
    the one with a checkpoint loads it, the other heals from it. The checkpoint also resumes under
    plain ddp."""
    base = [*TINY_GPT, *FAST, "strategy=ddp", "devices=2", "trainer.log_every=1", "trainer.val_every=1000", "name=ft",
            "scheduler.total_steps=18", "callbacks.checkpoint.every_n_steps=6", "trainer.on_nonfinite=skip"]
    # group 1's NaN at step 5 reaches every group through the average: each group's guard leaves it out
    first = run_train([*base, "trainer.max_steps=12", "+callbacks.nan._target_=tests.helpers.killer.NanInGroupOnce",
                       "+callbacks.nan.step=5"], tmp_path, env=ENV)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "outputs" / "ft"
    rows = {}
    for group in (0, 1):
        with open(run / f"replica_{group}" / "metrics.csv") as f:
            rows[group] = {int(row["step"]): row for row in csv.DictReader(f)
                       if row.get("train/loss") or row.get("train/skipped_step")}
        skipped = [step for step, row in rows[group].items() if row.get("train/skipped_step")]
        assert skipped == [5], (group, skipped)
    # train/loss: the groups' mean, the same in both logs; train/group_loss: each group's own data
    taken = [step for step in rows[0] if step != 5]
    assert len(taken) == 11
    for step in taken:
        mean, own = ([float(rows[g][step][key]) for g in (0, 1)] for key in ("train/loss", "train/group_loss"))
        assert mean[0] == mean[1] and abs(mean[0] - (own[0] + own[1]) / 2) < 1e-5 and own[0] != own[1], (step, mean, own)
    assert [p.name for p in checkpoints(run / "replica_0")] == ["step_000006", "step_000012"]
    assert not (run / "replica_1" / "checkpoints").exists()  # one group writes
    assert json.loads((run / "summary.json").read_text())["weights_agree"]  # a fresh run starts with both groups
    resumed = run_train([*base, "trainer.max_steps=18", "resume=auto"], tmp_path, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["weights_agree"]
    writer, healer = (group["replicas"] for group in summary["replica_groups"])
    (heal,) = healer["heals"]  # at 12, or later where the writer's first steps went ahead alone (join_timeout_ms)
    assert writer["heals"] == [] and 12 <= heal["step"] < 18
    assert writer["final_step"] == healer["final_step"] == 18
    # through the command's own entry in this process (its workers forked from its forkserver)
    plain = run_command(["train", *TINY_GPT, "strategy=ddp", "devices=2", "trainer.max_steps=15", "trainer.log_every=3",
                         "scheduler.total_steps=18", "name=plain", f"ckpt_path={checkpoint_at(run / 'replica_0', 12)}"],
                        tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    # it went on from step 12 (its only logged step is 15), from the trained weights: its loss (the
    # mean of steps 13-15) is where group 0's was over the same steps, not a fresh model's (~5.5)
    with open(tmp_path / "outputs" / "plain" / "metrics.csv") as f:
        logged = {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")}
    with open(run / "replica_0" / "metrics.csv") as f:
        grouped = {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")}
    assert list(logged) == [15], logged
    assert abs(logged[15] - sum(grouped[s] for s in (13, 14, 15)) / 3) < 0.2, (logged, grouped)
    assert logged[15] < grouped[1] - 0.3, (logged, grouped)
    assert json.loads((checkpoints(tmp_path / "outputs" / "plain")[-1] / "meta.json").read_text())["step"] == 15


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_framework_lighthouse_prints_the_address_groups_join_and_stops_on_ctrl_c():
    process = subprocess.Popen([sys.executable, "-m", "framework", "lighthouse", "--port", "0"], stdout=subprocess.PIPE,
                               text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = process.stdout.readline()
        assert re.match(r"lighthouse at http://\S+:\d+; groups join with fault_tolerance\.lighthouse=\S+:\d+", line), line
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()


@pytest.mark.slow
def test_groups_started_on_their_own_with_different_models_both_stop_naming_what_they_hold(tmp_path):
    """Two cluster jobs joining one lighthouse, one with a wider model by mistake: rank 0 of each
    would average gradients of other shapes; both stop (exit 2) at their first step, saying what
    their ranks hold."""
    from framework.launch.replica_groups import start_lighthouse

    server, address = start_lighthouse(TorchFT(min_replicas=2, join_timeout_ms=200, heartbeat_timeout_ms=1000))
    try:
        args = [*TINY_GPT, *FAST, f"fault_tolerance.lighthouse={address}", "trainer.max_steps=5"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        groups = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"fault_tolerance.replica_id={i}",
                                    f"hydra.run.dir={tmp_path / str(i)}", *extra], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for i, extra in enumerate([[], ["model.n_embd=48"]])]
        outputs = [group.communicate(timeout=300) for group in groups]
    finally:
        server.shutdown()
    held = []
    for i, (group, (_, err)) in enumerate(zip(groups, outputs)):
        assert group.returncode == ExitCode.USER_ERROR, err[-2000:]
        said = re.search(rf"replica group {i} holds strategy=\w+ at 1 process a group, its rank 0 holding ([\d,]+) "
                         r"values in \d+ tensors, and another group in this step's quorum holds something else", err)
        assert said, err[-2000:]
        held.append(int(said.group(1).replace(",", "")))
        assert not (tmp_path / str(i) / "checkpoints").exists()  # stopped before a step was taken
    assert held[1] > held[0], held  # the wider model holds more


@pytest.mark.slow
def test_a_lighthouse_that_cannot_be_reached_stops_the_group_naming_it(tmp_path):
    result = run_train([*TINY_GPT, *FAST, "fault_tolerance.replica_id=0", "fault_tolerance.lighthouse=127.0.0.1:9",
                        "fault_tolerance.connect_timeout_s=2", "trainer.max_steps=2"], tmp_path, timeout=120)
    assert result.returncode == ExitCode.USER_ERROR, result.stderr[-2000:]
    assert "could not reach the lighthouse at http://127.0.0.1:9 within fault_tolerance.connect_timeout_s=2" in result.stderr


@pytest.mark.slow
def test_two_groups_started_with_one_replica_id_both_stop_naming_it(tmp_path):
    """Groups started on their own (a cluster's jobs) joining one lighthouse, by mistake with the
    same fault_tolerance.replica_id: both stop (exit 2) before training on the same data share."""
    from framework.launch.replica_groups import start_lighthouse

    server, address = start_lighthouse(TorchFT(min_replicas=1, join_timeout_ms=200, heartbeat_timeout_ms=1000))
    try:
        args = [*TINY_GPT, *FAST, "fault_tolerance.replica_id=0", f"fault_tolerance.lighthouse={address}",
                "trainer.max_steps=5"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        groups = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={tmp_path / str(i)}"],
                                   cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for i in range(2)]
        outputs = [group.communicate(timeout=300) for group in groups]
    finally:
        server.shutdown()
    for group, (_, err) in zip(groups, outputs):
        assert group.returncode == ExitCode.USER_ERROR, err[-2000:]
        assert "fault_tolerance.replica_id=0: another group joined the lighthouse with the same id" in err

