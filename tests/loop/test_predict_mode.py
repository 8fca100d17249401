"""`framework predict`: one row per sample, in the data's order, with what the task predicts;
the rows agree with the test stage's metrics, for every built-in task."""
from __future__ import annotations

import json
import math

import pytest

from framework.cli import main as framework_main
from framework.tasks.base import Task
from framework.tasks.classification import Classification
from tests.conftest import DIGITS, TINY_GPT, run_inprocess
from tests.tasks.test_manual_optimization import GAN


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predict") / "digits"
    run_inprocess(DIGITS + ["trainer.max_steps=20", "trainer.val_every=10", "trainer.test_at_end=true"], out)
    return out


def test_classifier_rows_are_the_test_split_in_order_and_score_what_the_test_scored(digits_run, tmp_path):
    assert framework_main(["predict", str(digits_run), "-o", str(tmp_path / "p.jsonl")]) == 0
    rows = rows_of(tmp_path / "p.jsonl")
    assert [row["index"] for row in rows] == list(range(360))
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-5 and len(row["probabilities"]) == 10 for row in rows)
    assert all(row["prediction"] == max(range(10), key=row["probabilities"].__getitem__) for row in rows)
    tested = json.loads((digits_run / "test_metrics.json").read_text())["metrics"]
    accuracy = sum(row["prediction"] == row["label"] for row in rows) / len(rows)
    loss = -sum(math.log(row["probabilities"][row["label"]]) for row in rows) / len(rows)
    assert accuracy == pytest.approx(tested["test/accuracy"], abs=1e-9)
    assert loss == pytest.approx(tested["test/loss"], abs=1e-5)
    # another split, parquet, a limit on the batches
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    assert framework_main(["predict", str(digits_run), "--split", "val", "trainer.val_batches=1",
                           "-o", str(tmp_path / "v.parquet")]) == 0
    table = pyarrow_parquet.read_table(tmp_path / "v.parquet").to_pylist()
    assert [row["index"] for row in table] == list(range(256)) and set(table[0]) == {"index", "prediction",
                                                                                   "probabilities", "label"}


@pytest.fixture(scope="module")
def one_process_rows(digits_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "one.jsonl"
    assert framework_main(["predict", str(digits_run), "-o", str(out)]) == 0
    return rows_of(out)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed_stage_3", "pipeline"])
def test_two_processes_write_the_rows_one_process_writes(digits_run, one_process_rows, tmp_path, strategy):
    """Predictions of a one-process run made again at 2 processes under a strategy of each family:
    the same rows, in the data set's order, merged from the ranks' shares (pipeline: 2 stages, whose last
    stage's outputs every rank of the pipeline receives, one of them writing)."""
    assert framework_main(["predict", str(digits_run), f"strategy={strategy}", "devices=2", "-o",
                           str(tmp_path / "two.jsonl")]) == 0
    one, two = one_process_rows, rows_of(tmp_path / "two.jsonl")
    assert [r["index"] for r in two] == [r["index"] for r in one] == list(range(360))
    for a, b in zip(one, two):
        assert a["prediction"] == b["prediction"] and a["label"] == b["label"]
        assert b["probabilities"] == pytest.approx(a["probabilities"], abs=1e-6)
    assert not list(tmp_path.glob(".*parts"))  # the ranks' parts are merged and removed


@pytest.fixture(scope="module")
def language_model_run(tmp_path_factory):
    """A tiny GPT trained 3 steps and tested at its end, with its predictions in one process."""
    out = tmp_path_factory.mktemp("lm") / "run"
    run_inprocess(TINY_GPT + ["trainer.max_steps=3", "trainer.test_at_end=true", "trainer.test_batches=2"], out)
    assert framework_main(["predict", str(out), "-o", str(out.parent / "p.jsonl")]) == 0
    return out, rows_of(out.parent / "p.jsonl")


@pytest.mark.parametrize("task", ["language_model", "gan"])
def test_every_built_in_task_predicts(task, tmp_path, request):
    if task == "language_model":  # test_batches=2 of val_batch_size=32 blocks of 32 tokens
        out, rows = request.getfixturevalue("language_model_run")
        assert len(rows) == 64 and all(row["tokens"] == 32 for row in rows)
        assert all(row["perplexity"] == pytest.approx(math.exp(row["loss"]), rel=1e-5) for row in rows)
        tested = json.loads((out / "test_metrics.json").read_text())["metrics"]
        assert sum(row["loss"] for row in rows) / len(rows) == pytest.approx(tested["test/loss"], abs=1e-5)
        return
    out = tmp_path / "run"
    run_inprocess(GAN + ["trainer.max_steps=4", "trainer.val_every=2", "trainer.plot=false", "data.train_size=512",
                         "data.val_size=128", "data.test_size=64"], out)
    assert framework_main(["predict", str(out), "-o", str(tmp_path / "p.jsonl")]) == 0
    rows = rows_of(tmp_path / "p.jsonl")
    assert len(rows) == 64 and all(0 <= row["real_probability"] <= 1 and len(row["generated"]) == 2 for row in rows)


@pytest.mark.slow
def test_two_tensor_parallel_ranks_write_the_rows_of_one_process(language_model_run, tmp_path):
    """Two tensor-parallel ranks compute each batch together: one of them writes its rows."""
    out, rows = language_model_run
    assert framework_main(["predict", str(out), "strategy=model_parallel", "devices=2",
                           "-o", str(tmp_path / "tp.jsonl")]) == 0
    split = rows_of(tmp_path / "tp.jsonl")
    assert [r["index"] for r in split] == [r["index"] for r in rows]
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in rows], abs=1e-5)


def test_what_cannot_be_predicted_is_refused(digits_run, tmp_path, capsys):
    class Scores(Classification):
        pass

    class NoPredictions(Task):
        def training_step(self, model, batch): ...

        def validation_step(self, model, batch): ...

        def compute_metrics(self, sums): ...

    assert Scores().can_predict and not NoPredictions().can_predict
    cases = [
        (["-o", str(tmp_path / "p.csv")], "-o {}: write predictions to a .jsonl or .parquet file"),
        (["data.test_every_nth=null", "-o", str(tmp_path / "p.jsonl")],
         "framework predict --split test: the data (Digits) has no test split"),
    ]
    for args, fragment in cases:
        assert framework_main(["predict", str(digits_run), *args]) == 2
        assert fragment.format(tmp_path / "p.csv") in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()
