"""The test stage: `trainer.test_at_end` tests the best checkpoint when fit ends, `framework test`
tests a run's best checkpoint (or a given one) with any strategy at any world size; numbers are
checked against a plain torch computation on the same weights."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch.nn import functional as F

from framework.cli import main as framework_main
from framework.data.digits import Digits
from framework.models.mlp import MLP
from tests.conftest import DIGITS, TINY_GPT, checkpoints, load_model_state, run_inprocess
from tests.helpers.in_process import run_command
from tests.tasks.test_manual_optimization import GAN

# Checkpoints every 10 steps; "best" is the *highest* val/loss, so the tested checkpoint is an
# early one, not the final weights the model holds when fit ends (the loop must load it).
EARLY_BEST = ["trainer.max_steps=30", "trainer.val_every=10", "trainer.val_at_start=false",
              "callbacks.checkpoint.every_n_steps=10", "callbacks.checkpoint.monitor=val/loss",
              "callbacks.checkpoint.mode=max", "callbacks.checkpoint.keep_last_k=1", "trainer.test_at_end=true"]


def plain_test_scores(checkpoint) -> dict[str, float]:
    """Loss and accuracy of the checkpoint's MLP on the digits test split, in plain torch."""
    model = MLP(in_features=64, hidden=128, depth=2, num_classes=10, dropout=0.0)
    model.load_state_dict(load_model_state(checkpoint))
    x, y = Digits().test_dataset().tensors
    with torch.no_grad():
        logits = model.eval()(x).double()
    return {"test/loss": F.cross_entropy(logits, y).item(), "test/accuracy": (logits.argmax(-1) == y).double().mean().item()}


def test_test_at_end_scores_the_best_checkpoint_and_framework_test_agrees(tmp_path, capsys):
    out = tmp_path / "run"
    objective = run_inprocess(DIGITS + EARLY_BEST + ["trainer.objective=test/accuracy"], out)
    record = json.loads((out / "test_metrics.json").read_text())
    metas = {int(c.name.split("_")[-1]): json.loads((c / "meta.json").read_text()) for c in checkpoints(out)}
    worst = max(metas, key=lambda step: metas[step]["metrics"]["val/loss"])
    assert record["step"] == worst < 30 and record["chosen"].startswith("best val/loss=")
    expected = plain_test_scores(out / "checkpoints" / f"step_{worst:06d}")
    for name, value in expected.items():
        assert record["metrics"][name] == pytest.approx(value, abs=1e-6)
    assert objective == record["metrics"]["test/accuracy"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objective_value"] == objective and summary["test"]["step"] == worst
    assert summary["metrics"]["test/loss"] == record["metrics"]["test/loss"]
    rows = (out / "metrics.csv").read_text()
    assert "test/accuracy" in rows  # the loggers get the test metrics too
    capsys.readouterr()

    # framework test on the run directory: the same checkpoint, the same numbers (config from the
    # run's saved config: this run was started in-process, without Hydra's .hydra/ records)
    (out / "test_metrics.json").unlink()
    assert framework_main(["test", str(out)]) == 0
    again = json.loads((out / "test_metrics.json").read_text())
    assert again["step"] == worst and again["metrics"] == pytest.approx(record["metrics"], abs=1e-9)
    assert "test/accuracy" in capsys.readouterr().out
    # a checkpoint given directly; a smaller share of the test split
    last = out / "checkpoints" / "step_000030"
    assert framework_main(["test", str(last), "trainer.test_batches=1"]) == 0
    one_batch = json.loads((out / "test_metrics.json").read_text())
    assert one_batch["step"] == 30 and one_batch["chosen"] == "given"
    model = MLP(in_features=64, hidden=128, depth=2, num_classes=10, dropout=0.0)
    model.load_state_dict(load_model_state(last))
    x, y = Digits().test_dataset().tensors
    with torch.no_grad():
        first = model.eval()(x[:256]).argmax(-1)  # one batch of data.val_batch_size=256
    assert one_batch["metrics"]["test/accuracy"] == pytest.approx((first == y[:256]).double().mean().item(), abs=1e-9)


@pytest.mark.parametrize("task", ["language_model", "gan"])
def test_every_built_in_task_tests_at_the_end(task, tmp_path):
    out = tmp_path / task
    if task == "language_model":
        overrides = TINY_GPT + ["trainer.max_steps=4", "trainer.test_at_end=true", "trainer.test_batches=2"]
    else:
        overrides = GAN + ["trainer.max_steps=6", "trainer.val_every=3", "trainer.test_at_end=true", "trainer.plot=false",
                           "data.train_size=512", "data.val_size=128", "data.test_size=256"]
    run_inprocess(overrides, out)
    metrics = json.loads((out / "test_metrics.json").read_text())["metrics"]
    if task == "language_model":
        assert set(metrics) == {"test/loss", "test/perplexity"}
        assert metrics["test/perplexity"] == pytest.approx(math.exp(metrics["test/loss"]))
        assert 2.0 < metrics["test/loss"] < 6.0  # a barely trained byte model: near ln(256) = 5.5
    else:
        assert set(metrics) == {"test/d_loss", "test/g_loss", "test/mode_distance"}
        assert all(math.isfinite(v) and v > 0 for v in metrics.values())


@pytest.mark.slow
def test_framework_test_under_other_strategies_and_world_sizes_gives_the_same_scores(tmp_path):
    """A run trained with Hydra (its .hydra/ records the command): tested again at 2 processes under
    a strategy of each family (replicated, fully sharded, ZeRO, fairscale's sharded optimizer), the
    scores equal the one-process test within 1e-6."""
    trained = run_command(["run", "digits_classifier", "name=r", "trainer.max_steps=20", "trainer.val_every=10",
                           "trainer.plot=false", "trainer.progress_bar=false", "trainer.test_at_end=true",
                           "task.metrics=[MulticlassF1Score]"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    reference = json.loads((tmp_path / "outputs/r/test_metrics.json").read_text())
    assert set(reference["metrics"]) == {"test/loss", "test/accuracy", "test/f1_score"}
    for strategy in ("ddp", "fsdp", "ddp_sharded", "deepspeed_stage_3"):
        tested = run_command(["test", "outputs/r", f"strategy={strategy}", "devices=2"], tmp_path)  # as typed, in this process
        assert tested.returncode == 0, tested.stderr[-3000:]
        record = json.loads((tmp_path / "outputs/r/test_metrics.json").read_text())
        assert record["strategy"] == strategy and record["world_size"] == 2 and record["step"] == reference["step"]
        for name, value in reference["metrics"].items():
            assert record["metrics"][name] == pytest.approx(value, abs=1e-6), (strategy, name)
    summary = json.loads((tmp_path / "outputs/r/summary.json").read_text())
    assert summary["status"] == "completed" and summary["test"]["strategy"] == "deepspeed_stage_3"


def test_what_cannot_be_tested_is_refused_with_the_fix(tmp_path, capsys):
    out = tmp_path / "run"
    run_inprocess(DIGITS + ["trainer.max_steps=2", "trainer.val_every=2", "callbacks=[]"], out)
    cases = [
        ([str(out)], "the run saved none"),
        ([str(tmp_path)], "not a run directory (it has no config.yaml) nor a checkpoint directory"),
        ([str(tmp_path / "nowhere")], "no such directory"),
    ]
    for args, fragment in cases:
        assert framework_main(["test", *args]) == 2
        assert fragment in capsys.readouterr().err
    saved = tmp_path / "saved"
    run_inprocess(DIGITS + ["trainer.max_steps=2", "trainer.val_every=2"], saved)
    capsys.readouterr()
    assert framework_main(["test", str(saved), "data.test_every_nth=null"]) == 2
    assert "framework test: the data (Digits) has no test split. Test a run on the images it held out: " \
        "data.test_every_nth as the run trained with it" in " ".join(capsys.readouterr().err.split())
    assert framework_main(["test", str(saved), "model.hidden=64"]) == 2  # weights of another model
    err = capsys.readouterr().err
    assert "does not fit this model" in err and "size mismatch" in err and "Traceback" not in err
    assert not (saved / "test_metrics.json").exists()
