"""`python train.py` as a user runs it: the default job, the digits example, resume by name, a truncated
checkpoint (the user's other mistakes: tests/test_error_table.py)."""
from __future__ import annotations

import csv
import json

import pytest

from framework.accelerator.cpu import CPUAccelerator
from tests.conftest import ROOT, TINY_GPT, run_train
from tests.helpers.in_process import run_command

pytestmark = pytest.mark.slow


def test_default_job_trains_and_writes_its_run_directory(tmp_path):
    result = run_train(["name=e2e", "trainer.max_steps=30", "trainer.val_every=15", *TINY_GPT], tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "outputs" / "e2e"
    assert {"config.yaml", "metrics.csv", "hparams.yaml", "summary.json", "checkpoints", ".hydra"} <= {
        p.name for p in run.iterdir()}
    val = [float(r["val/loss"]) for r in csv.DictReader(open(run / "metrics.csv")) if r.get("val/loss")]
    assert len(val) == 3 and val[-1] < val[0] - 0.5  # ln(256) = 5.55 at the start
    summary = json.loads((run / "summary.json").read_text())
    assert summary["objective_value"] == pytest.approx(val[-1])
    assert {"trainer.max_steps=30", "trainer.val_every=15", *TINY_GPT} <= set(summary["overrides"])
    steps = [int(r["step"]) for r in csv.DictReader(open(run / "metrics.csv"))]
    assert steps == sorted(set(steps))  # one row per step
    assert "step 30 | val/loss" in result.stdout
    assert "Traceback" not in result.stderr


def test_digits_recipe_from_another_directory(tmp_path):
    result = run_train(["--config-dir", str(ROOT / "recipes"), "--config-name", "digits_classifier",
                        "name=digits", "trainer.max_steps=150"], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "outputs" / "digits" / "summary.json").read_text())
    assert summary["metrics"]["val/accuracy"] > 0.9


def _train(args: list[str], cwd):
    """`python train.py ARGS` through its own entry in this process (the default job above is the
    fresh interpreter's)."""
    return run_command(["train", *args], cwd)


def test_resume_auto_by_name(tmp_path):
    args = ["name=again", "trainer.max_steps=4", "trainer.val_every=2", *TINY_GPT]
    assert _train(args, tmp_path).returncode == 0
    refused = _train(args, tmp_path)
    assert refused.returncode == 2 and "resume=auto" in refused.stderr
    resumed = _train([*args, "trainer.max_steps=6", "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "step_000004" in resumed.stdout


def _truncated_checkpoint(tmp_path):
    assert _train(["name=src", "trainer.max_steps=2", *TINY_GPT], tmp_path).returncode == 0
    ckpt = tmp_path / "outputs" / "src" / "checkpoints" / "step_000002"
    data = (ckpt / "optimizer.pt").read_bytes()
    (ckpt / "optimizer.pt").write_bytes(data[:100])
    return ckpt


# The user's mistakes (exit code 2, one paragraph, nothing written): tests/test_error_table.py.


def test_truncated_checkpoint_says_truncated(tmp_path):
    ckpt = _truncated_checkpoint(tmp_path)
    result = _train([f"ckpt_path={ckpt}", "name=load", *TINY_GPT], tmp_path)
    assert result.returncode == 2
    assert "optimizer.pt is truncated or corrupt" in result.stderr and "Traceback" not in result.stderr


def test_bf16_warns_loudly_only_on_a_cpu_without_bf16_hardware(tmp_path):
    result = run_train(["precision=bf16", "name=bf16", "trainer.max_steps=2", *TINY_GPT], tmp_path)
    assert result.returncode == 0, result.stderr
    warned = "WARNING: precision=bf16 on accelerator=cpu: this device has no bf16 hardware" in result.stderr
    assert warned != CPUAccelerator().fast_bf16()  # the predicate the compatibility table uses


def test_fp16_warns_loudly_only_on_a_cpu_without_fp16_hardware(tmp_path):
    result = run_train(["precision=16", "name=fp16", "trainer.max_steps=2", *TINY_GPT], tmp_path)
    assert result.returncode == 0, result.stderr
    warned = "WARNING: precision=16 on accelerator=cpu" in result.stderr
    assert warned != CPUAccelerator().fast_fp16()  # the predicate the compatibility table uses
