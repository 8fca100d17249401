import csv
import json
import sys

import pytest

from tests.conftest import DIGITS, ROOT, TINY_GPT, compose_cfg, run_inprocess
from tests.helpers.memory_group import memory_group, run_in_group


def test_early_stopping_stops_and_still_saves(tmp_path, capsys):
    """Maximising the loss never improves: with patience 2 the run stops at the 3rd validation."""
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "trainer.max_steps=100", "trainer.val_every=5", "trainer.val_at_start=false",
                   "callbacks=[checkpoint,early_stopping]", "callbacks.early_stopping.mode=max",
                   "callbacks.early_stopping.patience=2"], out)
    assert "early stopping at step 15" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["metrics"]  # summary written
    assert (out / "checkpoints" / "step_000015").is_dir()


def test_lr_monitor_logs_every_group(tmp_path):
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "trainer.max_steps=10", "scheduler=constant", "optimizer.lr=0.02"], out)
    lrs = {float(r["lr/pg0"]) for r in csv.DictReader(open(out / "metrics.csv")) if r.get("lr/pg0")}
    assert lrs == {0.02}


def test_memory_monitor_writes_per_rank_peaks(tmp_path):
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "trainer.max_steps=6", "callbacks=[memory_monitor]"], out)
    memory = json.loads((out / "memory.json").read_text())
    (rank,) = memory["ranks"]
    assert rank["rank"] == 0 and rank["train_peak_rss_bytes"] > 50 * 2**20
    assert rank["setup_peak_rss_bytes"] >= rank["baseline_rss_bytes"] > 0
    logged = [float(r["memory/train_peak_rss_mb"]) for r in csv.DictReader(open(out / "metrics.csv"))
              if r.get("memory/train_peak_rss_mb")]
    assert logged and all(v > 50 for v in logged)


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_memory_monitor_reads_the_memory_group_a_rank_has_to_itself(tmp_path):
    # a rank alone in a memory cgroup (a per-process cap) also gets its group's charge: its own memory
    width, layers = 512, 2
    params = layers * 12 * width * width + (256 + 32) * width  # Blocks' matrices and embeddings (most of them)
    args = [*TINY_GPT, f"model.n_layer={layers}", f"model.n_embd={width}", "model.n_head=8", "trainer.max_steps=3",
            "trainer.val_at_start=false", "logger=null", "callbacks=[memory_monitor]", f"hydra.run.dir={tmp_path}/run"]
    with memory_group() as group:
        result = run_in_group(group, f"{sys.executable} {ROOT}/train.py " + " ".join(args), cwd=tmp_path, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        group_peak_since_setup = int((group / "memory.max_usage_in_bytes").read_text())
    (rank,) = json.loads((tmp_path / "run" / "memory.json").read_text())["ranks"]
    baseline, setup, train = (rank[f"group_{k}_bytes"] for k in ("baseline", "setup_peak", "train_peak"))
    assert 0 < baseline < setup < train <= group_peak_since_setup  # reset once set-up was done
    assert setup - baseline >= 0.9 * 4 * params  # the float32 weights were built after the baseline
    assert train - baseline >= 0.9 * 16 * params  # weights, gradients and AdamW's two moments
    assert train - baseline < 16 * params + 200 * 2**20  # and little else: activations of batch 8 x 32 tokens


def test_a_monitor_the_validation_never_logs_is_refused_or_warned_before_launch():
    """A name the user chose is refused; the shipped default (val/loss) under a task without a loss
    is a warning, so a task of one's own still runs with the shipped config."""
    from framework.preflight import prepare
    from framework.preflight.monitors import monitor_problems

    cfg = compose_cfg(["model=mlp", "data=digits", "task=classification", "callbacks=[checkpoint,early_stopping]",
                       "callbacks.early_stopping.monitor=val/acc"])
    assert prepare(cfg, strict=False).logged == {"val/loss", "val/accuracy"}
    refused, warned = monitor_problems(cfg, {"val/loss", "val/accuracy"})
    assert refused == ["callbacks.early_stopping.monitor='val/acc' is never logged: a validation logs val/accuracy, "
                       "val/loss. Did you mean val/accuracy? Set callbacks.early_stopping.monitor to one of them."]
    assert warned == []
    refused, warned = monitor_problems(cfg, {"val/mse"})
    assert [r.split("=")[0] for r in refused] == ["callbacks.early_stopping.monitor"]
    assert [w.split("=")[0] for w in warned] == ["callbacks.checkpoint.monitor", "trainer.objective"]
    assert "(the shipped default) is never logged by this task, so it selects nothing" in warned[0]


def test_the_last_checkpoint_holds_the_final_validation(tmp_path):
    """A checkpoint saved at the run's last step (every_n_steps divides max_steps, val_every does
    not) is written after that step's validation, so it records val/loss and `framework test` or
    `convert` of the run can rank it; the last step is validated once."""
    from framework.checkpoint.format import read_meta
    from framework.checkpoint.load import checkpoint_to_evaluate
    from tests.conftest import checkpoints

    out = tmp_path / "run"
    run_inprocess(DIGITS + ["trainer.max_steps=6", "trainer.val_every=4", "callbacks.checkpoint.every_n_steps=3",
                            "callbacks.checkpoint.keep_last_k=5"], out)
    saved = checkpoints(out)
    assert [p.name for p in saved] == ["step_000003", "step_000006"]
    assert "val/loss" in read_meta(saved[-1])["metrics"] and "val/loss" not in read_meta(saved[0])["metrics"]
    info, why = checkpoint_to_evaluate(out / "checkpoints", "val/loss", "min")
    assert info.path == saved[-1] and why.startswith("best val/loss")
    with open(out / "metrics.csv") as f:
        validated = [int(row["step"]) for row in csv.DictReader(f) if row.get("val/loss")]
    assert validated == [0, 4, 6]
