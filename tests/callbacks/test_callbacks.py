import csv
import json

from tests.conftest import DIGITS, run_inprocess


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
