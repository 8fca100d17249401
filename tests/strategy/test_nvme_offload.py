"""strategy=deepspeed_stage_3_offload_nvme run for real: ZeRO-3 swapping parameters and optimizer
state through libaio into a local folder gives deepspeed_stage_3's losses (the shared two-rank run
of tests/helpers/two_ranks.py). libaio is installed
where the machine allows it (tests/helpers/libaio.py); DeepSpeed compiles its async_io op the first
time (minutes; cached under ~/.cache/torch_extensions)."""
from __future__ import annotations

import csv
import json
import os
import sys

import pytest

from framework.planning.memory import estimate, model_stats
from framework.preflight import prepare
from framework.strategy.deepspeed_stage_3_offload_nvme import DeepSpeedStage3OffloadNvmeStrategy
from tests.conftest import ROOT, TINY_GPT, compose_cfg, run_train
from tests.helpers.libaio import ensure_libaio
from tests.helpers.memory_group import memory_group, run_in_group
from tests.helpers.two_ranks import STEPS, shared, world


def _train_losses(run) -> list[float]:
    return [float(r["train/loss"]) for r in csv.DictReader(open(run / "metrics.csv")) if r.get("train/loss")]


@pytest.mark.slow
@pytest.mark.matrix(strategy="deepspeed_stage_3_offload_nvme")
def test_nvme_offload_trains_like_zero3_in_memory(tmp_path):
    reason = ensure_libaio()
    if reason:
        pytest.skip(reason)
    swap = tmp_path / "nvme"
    nvme = run_train([*world("deepspeed_stage_3_offload_nvme", extra=[f"strategy.nvme_path={swap}"]), "name=nvme"],
                     tmp_path, timeout=900)  # the op's first build: minutes
    assert nvme.returncode == 0, nvme.stderr[-3000:]
    # each rank swapped its parameters and optimizer state there (DeepSpeed deletes the files at the end)
    assert {str(p.relative_to(swap)) for p in swap.glob("zero_stage_3/*/rank*")} == {
        f"zero_stage_3/{kind}/rank{r}" for kind in ("optimizer", "float32params") for r in (0, 1)}
    a, b = _train_losses(tmp_path / "outputs" / "nvme"), _train_losses(shared("deepspeed_stage_3"))
    assert len(a) == STEPS and a == pytest.approx(b, abs=1e-6)


def test_an_unwritable_nvme_path_is_refused_before_launch(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    problems = DeepSpeedStage3OffloadNvmeStrategy(nvme_path=str(blocker / "swap")).problems(None)
    assert problems == [f"strategy.nvme_path={blocker / 'swap'}: cannot be created ({blocker} is not writable); set "
                        "strategy.nvme_path to a folder on a fast local disk (e.g. strategy.nvme_path=/tmp/nvme)."]
    assert DeepSpeedStage3OffloadNvmeStrategy(nvme_path=str(tmp_path / "new" / "swap")).problems(None) == []


@pytest.mark.slow
def test_a_model_whose_states_exceed_the_memory_cap_trains_a_step_under_it(tmp_path):
    """A 114M GPT under ZeRO-3 with NVMe offload, one process capped at 1.25 GiB (a cgroup v1 group,
    as root): its float32 states with Adam (16 bytes a parameter, 1.8 GB) are larger than the cap,
    and it trains; what RAM holds matches what `framework plan` says within 25%. (With DeepSpeed's
    own buffer sizes the same job is killed at the cap: a property of DeepSpeed's defaults,
    measured by benchmarks/nvme_offload.py.)"""
    reason = ensure_libaio()
    if reason:
        pytest.skip(reason)
    cap = 1280 * 2**20
    args = [*TINY_GPT, "model.n_layer=16", "model.n_embd=768", "model.n_head=12", "model.block_size=64",
            "data.batch_size=1", "data.val_batch_size=1", "strategy=deepspeed_stage_3_offload_nvme",
            f"strategy.nvme_path={tmp_path / 'nvme'}", "trainer.max_steps=1", "trainer.val_at_start=false",
            "trainer.val_batches=1", "trainer.log_every=1", "callbacks=[lr_monitor,memory_monitor]", "name=capped"]
    prepared = prepare(compose_cfg(args))
    stats, _ = model_stats(prepared.resolved, prepared.plugins, prepared.model)
    planned = estimate(prepared.plugins.strategy, stats, 1)
    assert 16 * stats.params > 1.3 * cap and planned.disk > cap  # the states do not fit; the plan sends them to disk
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    with memory_group(cap) as group:
        result = run_in_group(group, f"{sys.executable} {ROOT}/train.py " + " ".join(args), cwd=tmp_path, timeout=600,
                              env=env)
    assert result.returncode == 0, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    assert 0 < _train_losses(tmp_path / "outputs" / "capped")[0] < 7  # a real loss (ln 256 = 5.5 at the start)
    rank = json.loads((tmp_path / "outputs" / "capped" / "memory.json").read_text())["ranks"][0]
    grown = rank["group_train_peak_bytes"] - rank["group_baseline_bytes"]  # what set-up and training added
    ram = planned.device + planned.host + prepared.activation_bytes
    assert 0.75 * ram < grown < 1.25 * ram, (grown, ram)
