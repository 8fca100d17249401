"""Manual optimization: a task stepping two optimizers (a GAN) under the strategies that allow it,
with exact resume, and a clear refusal before launch where a strategy cannot."""
from __future__ import annotations

import csv

import pytest
import torch

from framework.errors import ConfigError
from framework.preflight import prepare
from framework.tasks.manual import OptimizerSet, optimizer_set_factory
from tests.conftest import assert_resume_is_exact, compose_cfg, run_inprocess

GAN = ["model=gan", "data=gaussian_ring", "task=gan", "scheduler=constant", "trainer.clip_grad_norm=null",
       "optimizer.lr=2e-3", "optimizer.betas=[0.5,0.99]", "optimizer.weight_decay=0.0", "data.batch_size=64",
       "trainer.progress_bar=false", "trainer.log_every=10", "trainer.objective=val/mode_distance",
       "callbacks.checkpoint.monitor=val/mode_distance"]


def two_optimizers():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    return a, b, OptimizerSet({"a": torch.optim.AdamW(a.parameters(), lr=0.1),
                               "b": torch.optim.SGD(b.parameters(), lr=0.5, momentum=0.9)})


def test_an_optimizer_set_is_one_optimizer_to_checkpoints_and_schedulers():
    a, b, opts = two_optimizers()
    for _ in range(2):
        (a(torch.ones(4, 3)).sum() + b(torch.ones(4, 2)).sum()).backward()
        opts.step()
        opts.zero_grad()
    state = opts.state_dict()
    assert [g["params"] for g in state["param_groups"]] == [[0, 1], [2, 3]]
    assert set(state["state"]) == {0, 1, 2, 3} and "exp_avg" in state["state"][0] and "momentum_buffer" in state["state"][2]
    _, _, fresh = two_optimizers()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.optimizers["a"].state_dict()["state"][0]["exp_avg"], opts.optimizers["a"].state_dict()["state"][0]["exp_avg"])
    assert torch.equal(fresh.optimizers["b"].state_dict()["state"][1]["momentum_buffer"],
                       opts.optimizers["b"].state_dict()["state"][1]["momentum_buffer"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(opts, lambda step: 0.5)
    assert opts.optimizers["a"].param_groups[0]["lr"] == pytest.approx(0.05)
    assert opts.optimizers["b"].param_groups[0]["lr"] == pytest.approx(0.25)
    scheduler.step()


def test_optimizer_groups_must_cover_every_parameter_once():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))

    class Partial:
        def optimizer_groups(self, m):
            return {"first": m[0].parameters()}

    with pytest.raises(ConfigError, match="parameters in no optimizer group: 1.weight, 1.bias"):
        optimizer_set_factory(Partial(), model, lambda p: torch.optim.SGD(p, lr=0.1))(model.parameters())

    class Twice:
        def optimizer_groups(self, m):
            return {"x": m.parameters(), "y": m[0].parameters()}

    with pytest.raises(ConfigError, match="in both optimizer groups 'x' and 'y'"):
        optimizer_set_factory(Twice(), model, lambda p: torch.optim.SGD(p, lr=0.1))(model.parameters())


@pytest.mark.parametrize("overrides,fragment", [
    (["strategy=deepspeed_stage_2", "devices=2"], "drives one optimizer through its own engine"),
    (["strategy=ddp_sharded", "devices=2"], "drives one optimizer through its own engine"),
    (["strategy=ddp", "devices=2", "strategy.find_unused_parameters=false"], "set strategy.find_unused_parameters=true"),
    (["trainer.accumulate=2"], "set trainer.accumulate=1"),
])
def test_strategies_that_cannot_are_refused_before_launch(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        prepare(compose_cfg([*GAN, *overrides]))


def val_distances(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [float(r["val/mode_distance"]) for r in csv.DictReader(f) if r.get("val/mode_distance")]


def test_the_gan_learns_the_ring(tmp_path):
    objective = run_inprocess([*GAN, "trainer.max_steps=300", "trainer.val_every=150"], tmp_path)
    first, *_, last = val_distances(tmp_path)
    assert objective == last and last < 0.6 * first  # generated points moved onto the ring's modes
    with open(tmp_path / "metrics.csv") as f:
        logged = [r for r in csv.DictReader(f) if r.get("train/d_loss")]
    assert logged and all(float(r["train/g_loss"]) > 0 for r in logged)


@pytest.mark.slow
def test_manual_optimization_resumes_exactly(tmp_path):
    """Weights and optimizers bit-exact, and the logged means too: the resume at step 10 falls
    inside a logging interval (every 4 steps), whose sums the checkpoint carries."""
    assert_resume_is_exact([*GAN, "trainer.val_every=10", "callbacks.checkpoint.every_n_steps=10", "trainer.log_every=4"],
                           tmp_path, steps=20)
    logged = {}
    for run in ("straight", "resumed"):
        with open(tmp_path / run / "metrics.csv") as f:
            logged[run] = [(r["step"], r["train/d_loss"], r["train/g_loss"]) for r in csv.DictReader(f) if r.get("train/d_loss")]
    assert [row[0] for row in logged["straight"]] == ["4", "8", "12", "16", "20"]
    resumed = {row[0]: row for row in logged["resumed"]}  # also step 10: the first part's last, partial interval
    assert [resumed[step] for step, *_ in logged["straight"]] == logged["straight"]


def grad_norms(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [float(r["train/grad_norm"]) for r in csv.DictReader(f) if r.get("train/grad_norm")]


@pytest.mark.slow
def test_ddp_and_fsdp_train_the_same_gan_with_clipping(tmp_path):
    """Manual optimization clips through the strategy (FSDP's norm over DTensor shards), so a
    clipped GAN trains the same under fsdp as under ddp."""
    common = ["trainer.max_steps=40", "trainer.val_every=20", "devices=2", *GAN, "trainer.clip_grad_norm=0.05"]
    run_inprocess([*common, "strategy=ddp"], tmp_path / "outputs" / "ddp")  # find_unused_parameters chosen for the task
    run_inprocess([*common, "strategy=fsdp"], tmp_path / "outputs" / "fsdp")
    a, b = val_distances(tmp_path / "outputs" / "ddp"), val_distances(tmp_path / "outputs" / "fsdp")
    assert len(a) == 3 and a == pytest.approx(b, abs=1e-5)
    norms_ddp, norms_fsdp = grad_norms(tmp_path / "outputs" / "ddp"), grad_norms(tmp_path / "outputs" / "fsdp")
    assert len(norms_ddp) == 4 and min(norms_ddp) > 0.05  # the norm before clipping: every step was clipped
    assert norms_fsdp == pytest.approx(norms_ddp, rel=1e-5)
