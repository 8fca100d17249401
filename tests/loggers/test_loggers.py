import csv

from framework.loggers.csv import CSVLogger
from framework.loggers.tensorboard import TensorBoardLogger


def test_csv_widens_and_truncates(tmp_path):
    log = CSVLogger(str(tmp_path))
    log.log_hyperparams({"lr": 0.1})
    log.log_metrics({"train/loss": 2.0}, 1)
    log.log_metrics({"train/loss": 1.5, "val/loss": 1.7}, 2)
    log.log_metrics({"train/loss": 1.0}, 3)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["step"] for r in rows] == ["1", "2", "3"] and rows[1]["val/loss"] == "1.7"
    assert (tmp_path / "hparams.yaml").read_text().strip() == "lr: 0.1"
    again = CSVLogger(str(tmp_path))  # a resumed run forgets what came after its checkpoint
    again.truncate(2)
    again.log_metrics({"train/loss": 0.9}, 3)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [(r["step"], r["train/loss"]) for r in rows] == [("1", "2.0"), ("2", "1.5"), ("3", "0.9")]


def test_csv_has_one_row_per_step_whatever_order_metrics_come_in(tmp_path):
    log = CSVLogger(str(tmp_path))
    log.log_metrics({"val/loss": 3.0}, 0)
    log.log_metrics({"train/loss": 2.5, "train/grad_norm": 1.0}, 1)
    log.log_metrics({"lr/pg0": 0.1}, 1)  # the same step: its row grows, no new row
    log.log_metrics({"train/loss": 2.0}, 2)
    log.log_metrics({"val/loss": 2.2}, 2)
    log.log_metrics({"checkpoint/blocked_s": 0.5}, 2)  # a new column at a step already written
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["step"] for r in rows] == ["0", "1", "2"]
    assert list(rows[0]) == ["step", "val/loss", "train/loss", "train/grad_norm", "lr/pg0", "checkpoint/blocked_s"]
    assert (rows[1]["train/loss"], rows[1]["lr/pg0"], rows[1]["val/loss"]) == ("2.5", "0.1", "")
    assert (rows[2]["train/loss"], rows[2]["val/loss"], rows[2]["checkpoint/blocked_s"]) == ("2.0", "2.2", "0.5")
    again = CSVLogger(str(tmp_path))  # resumed in the same directory: the last step's row still grows
    again.log_metrics({"lr/pg0": 0.05}, 2)
    again.log_metrics({"train/loss": 1.9}, 3)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [(r["step"], r["lr/pg0"], r["train/loss"]) for r in rows][2:] == [("2", "0.05", "2.0"), ("3", "", "1.9")]


def test_tensorboard_writes_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = TensorBoardLogger(str(tmp_path))
    log.log_hyperparams({"lr": 0.1})
    for step in range(3):
        log.log_metrics({"train/loss": 1.0 / (step + 1)}, step)
    log.finalize()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [round(e.value, 3) for e in events.Scalars("train/loss")] == [1.0, 0.5, 0.333]
