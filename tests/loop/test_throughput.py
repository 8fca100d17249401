"""train/<unit>_per_s measures what a wall clock around the same steps measures: the window's
clock is read once the window's values reached the host (on CUDA, after the device finished the
steps, not when the host had queued them), and validation and checkpoint saves are not counted
as training."""
from __future__ import annotations

import csv
import time

from framework.loop.fit_loop import FitLoop
from tests.conftest import TINY_GPT, run_inprocess


def test_the_throughput_meter_agrees_with_a_wall_clock(tmp_path, monkeypatch):
    marks, pauses = [], []
    log_train, validate = FitLoop._log_train, FitLoop.validate

    def timed_log(self, *args):
        entered = time.perf_counter()
        log_train(self, *args)
        marks.append((entered, time.perf_counter()))

    def timed_validate(self):
        started = time.perf_counter()
        result = validate(self)
        pauses.append((started, time.perf_counter()))
        return result

    monkeypatch.setattr(FitLoop, "_log_train", timed_log)
    monkeypatch.setattr(FitLoop, "validate", timed_validate)
    # a validation every 4 steps, 20 batches long: counted as training, it would halve the rate
    run_inprocess([*TINY_GPT, "trainer.max_steps=16", "trainer.log_every=4", "trainer.val_every=4",
                   "trainer.val_at_start=false", "trainer.val_batches=20", "callbacks=[]"], tmp_path)
    rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("train/tokens_per_s")]
    assert len(rows) == 4 == len(marks)
    ratios, wall, metered = [], 0.0, 0.0
    for i in range(1, 4):  # each window: from the end of the previous log to this one, less validation
        start, end = marks[i - 1][1], marks[i][0]
        validating = sum(b - a for a, b in pauses if start <= a and b <= end)
        tokens = float(rows[i]["train/tokens"]) - float(rows[i - 1]["train/tokens"])
        wall_rate = tokens / (end - start - validating)
        ratios.append(float(rows[i]["train/tokens_per_s"]) / wall_rate)
        wall, metered = wall + tokens / wall_rate, metered + tokens / float(rows[i]["train/tokens_per_s"])
    # the three windows together within 15% (a busy machine's hiccup in one window of a few hundred ms
    # moved it 17% once), each within 30%: validation counted as training would be off by half
    assert abs(wall / metered - 1) < 0.15 and all(abs(r - 1) < 0.3 for r in ratios), ratios
