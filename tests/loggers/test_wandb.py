"""logger=wandb: offline by default, in the run directory; the run read back from W&B's own
records holds the config, every metric at its step (as the CSV has them) and the test metrics
in its summary."""
from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import DIGITS, run_inprocess

pytest.importorskip("wandb")


def test_an_offline_run_holds_config_metrics_and_test_summary(tmp_path):
    from tests.helpers.wandb_records import offline_run

    out = tmp_path / "run"
    run_inprocess(DIGITS + ["trainer.max_steps=20", "trainer.val_every=10", "trainer.test_at_end=true",
                            "logger=[csv,wandb]", "logger.wandb.tags=[smoke]"], out)
    assert (out / "wandb_run_id").is_file()
    run = offline_run(out)
    assert run["name"] == "run" and run["config"]["model"]["hidden"] == 128
    history = {}
    for row in run["history"]:
        history.setdefault(int(row["_step"]), {}).update(row)
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    for row in rows:
        for key, value in row.items():
            if key != "step" and value:
                assert history[int(row["step"])][key] == pytest.approx(float(value), rel=1e-6), key
    assert history[10]["val/accuracy"] > 0 and "val/loss" in history[20]
    tested = json.loads((out / "test_metrics.json").read_text())["metrics"]
    assert run["summary"]["test/accuracy"] == pytest.approx(tested["test/accuracy"])
    assert run["summary"]["test/loss"] == pytest.approx(tested["test/loss"])
