"""data.val_percent=0 (and no val_files): no validation split. The run trains without validating
(no val/ metric logged, checkpoints still saved), a monitor the user named on a val/ metric is
refused before launch, the shipped default is a warning, and `framework predict --split val` says
there is no such split."""
from __future__ import annotations

import csv

from tests.conftest import checkpoints
from tests.helpers.in_process import run_command
from tests.helpers.text_data import stdlib_documents, write_jsonl

TINY = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32", "data.batch_size=4",
        "trainer.progress_bar=false", "trainer.plot=false", "trainer.log_every=2", "trainer.val_every=2"]


def test_a_run_without_a_validation_split_trains_and_never_validates(tmp_path):
    files = write_jsonl(tmp_path / "docs.jsonl", stdlib_documents(20, max_chars=2000))
    data = ["data=text_files", f"data.files={files}", "data.val_percent=0", f"data.cache_dir={tmp_path / 'cache'}"]
    run = tmp_path / "run"
    result = run_command(["train", *TINY, *data, "trainer.max_steps=4", f"hydra.run.dir={run}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the data has no validation split (data.val_percent=0)" in result.stderr + result.stdout
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert not [c for c in rows[0] if c.startswith("val/")] and [r["train/loss"] for r in rows if r["train/loss"]]
    assert [c.name for c in checkpoints(run)][-1] == "step_000004"

    refused = run_command(["train", *TINY, *data, "callbacks.checkpoint.monitor=val/perplexity",
                           f"hydra.run.dir={tmp_path / 'refused'}"], tmp_path)
    assert refused.returncode == 2 and "callbacks.checkpoint.monitor='val/perplexity' is never logged: the data has " \
        "no validation split (data.val_percent=0)" in refused.stderr and not (tmp_path / "refused").exists()

    predicted = run_command(["predict", str(run), "-o", str(tmp_path / "p.jsonl"), "--split", "val"], tmp_path)
    assert predicted.returncode == 2 and "framework predict --split val: the data has no validation split" \
        in predicted.stderr, predicted.stderr[-2000:]
    assert run_command(["train", *TINY, *data[:-2], "data.val_percent=-1"], tmp_path).returncode == 2


def test_the_default_data_without_a_validation_split_trains_too(tmp_path):
    run = tmp_path / "run"
    result = run_command(["train", *TINY, "data.max_bytes=300000", "data.val_percent=0", "trainer.max_steps=2",
                          f"hydra.run.dir={run}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(run / "metrics.csv") as f:
        assert not [c for c in next(csv.reader(f)) if c.startswith("val/")]
