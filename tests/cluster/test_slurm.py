"""A real SLURM on this machine (tests/helpers/slurm_cluster.py installs and starts it where the
machine allows; elsewhere these tests skip and say why): srun tasks train with their ranks from
SLURM exactly like the framework's own 2-process ddp, a mismatch between srun and `devices` is
refused, and a job sent the requeue signal checkpoints, requeues itself and finishes by resuming,
with the same final weights as an undisturbed run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import ROOT, TINY_GPT, checkpoints, load_model_state
from tests.helpers.in_process import run_command
from tests.helpers.slurm_cluster import ensure_slurm

pytestmark = pytest.mark.slow

ARGS = [*TINY_GPT, "strategy=ddp", "trainer.val_every=3", "logger=[csv]"]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # one thread per task, as the local launcher gives


@pytest.fixture(scope="module")
def slurm():
    reason = ensure_slurm()
    if reason:
        pytest.skip(reason)


def run(cmd: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *ARGS, *args]


def losses(run_dir) -> list[tuple[str, str]]:
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    keep = [header.index("train/loss"), header.index("val/loss")]
    return [tuple(row.split(",")[i] for i in keep) for row in rows[1:]]


def assert_same_weights(a_ckpt, b_ckpt) -> None:
    a, b = load_model_state(a_ckpt), load_model_state(b_ckpt)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_srun_tasks_train_like_the_local_launcher(slurm, tmp_path):
    result = run(["srun", "--ntasks=2", *train_cmd("devices=2", "trainer.max_steps=6")], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    [via_srun] = (tmp_path / "outputs").glob("slurm-*")  # named after the job: every task agrees
    reference = run_command(["train", *ARGS, "devices=2", "trainer.max_steps=6", "name=local"], tmp_path, env=ENV)
    assert reference.returncode == 0, reference.stderr
    local = tmp_path / "outputs" / "local"
    assert losses(via_srun) == losses(local)
    assert_same_weights(checkpoints(via_srun)[-1], checkpoints(local)[-1])


def test_srun_tasks_that_disagree_with_devices_are_refused(slurm, tmp_path):
    result = run(["srun", "--ntasks=2", *train_cmd("devices=1", "trainer.max_steps=2")], tmp_path)
    assert result.returncode != 0
    assert "devices=1, but SLURM starts 2 task(s) per node (SLURM_TASKS_PER_NODE): set devices=2" in result.stderr


def _wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _state(job: str) -> str:
    return run(["squeue", "-h", "-j", job, "-o", "%T"], ".").stdout.strip()


def test_requeue_signal_checkpoints_requeues_and_the_job_finishes_by_resuming(slurm, tmp_path):
    steps = ["devices=2", "trainer.max_steps=400", "trainer.val_every=100", "callbacks.checkpoint.every_n_steps=200"]
    log = tmp_path / "job.out"
    script = tmp_path / "job.sh"
    script.write_text("\n".join([
        "#!/bin/bash",
        f"#SBATCH --ntasks=2 --requeue --open-mode=append --output={log}",
        'echo "attempt ${SLURM_RESTART_COUNT:-0}"',
        " ".join(["srun", *train_cmd(*steps)]),
        'echo "srun exited $?"',
    ]) + "\n")
    job = run(["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)], tmp_path).stdout.strip().split(";")[0]
    assert job.isdigit(), job
    _wait(lambda: log.exists() and "step 20/" in log.read_text(), 180, "the job to train")
    run(["scancel", "--signal=USR1", job], tmp_path)  # what SLURM sends ahead of preemption (--signal=USR1@T)
    # SLURM holds a requeued job back until its old credential expires (the test cluster sets
    # cred_expire=10 s; forcing an earlier start gets the job killed: "Job credential revoked").
    _wait(lambda: "attempt 1" in log.read_text(), 240, "the requeued job to start")

    def finished() -> bool:  # the second attempt's srun returned and the job left the queue
        return "srun exited" in log.read_text().split("attempt 1")[-1] and _state(job) == ""

    _wait(finished, 300, "the requeued job to finish")
    text = log.read_text()
    assert "SIGUSR1 received: saving a checkpoint at step" in text
    # said before the requeue: SLURM cancels the step at once, and a line said after may never be written
    assert f"slurm: requeueing SLURM job {job}: SLURM stops this step now" in text
    assert "attempt 1" in text and "resumed from" in text.split("attempt 1")[1]
    assert text.rstrip().endswith("srun exited 0")
    run_dir = tmp_path / "outputs" / f"slurm-{job}"
    assert checkpoints(run_dir)[-1].name == "step_000400"
    reference = run_command(["train", *ARGS, *steps, "name=undisturbed"], tmp_path, env=ENV)
    assert reference.returncode == 0, reference.stderr
    assert_same_weights(checkpoints(run_dir)[-1], checkpoints(tmp_path / "outputs" / "undisturbed")[-1])


def test_a_sweep_of_two_process_jobs_goes_to_slurm_through_submitit(slurm, tmp_path):
    python, script, *args = train_cmd("hydra/launcher=submitit_slurm", "devices=2", "trainer.max_steps=4", "seed=1,2",
                                      "name=swept")
    result = run([python, script, "-m", *args], tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "is validated against ConfigStore schema" not in result.stderr
    sweep = tmp_path / "multirun" / "swept"
    summaries = [json.loads((sweep / str(i) / "summary.json").read_text()) for i in (0, 1)]
    assert [s["world_size"] for s in summaries] == [2, 2]  # tasks_per_node came from devices=2
    assert summaries[0]["objective_value"] != summaries[1]["objective_value"]  # seeds 1 and 2
    submission = next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --ntasks-per-node=2" in submission and "#SBATCH --nodes=1" in submission
    reference = run_command(["train", *ARGS, "devices=2", "trainer.max_steps=4", "seed=1", "name=local"], tmp_path,
                            env=ENV)
    assert reference.returncode == 0, reference.stderr
    local = json.loads((tmp_path / "outputs" / "local" / "summary.json").read_text())
    assert summaries[0]["objective_value"] == local["objective_value"]
