import io
from types import SimpleNamespace

from framework.callbacks.progress import RichProgress, TextProgress
from framework.loop.state import LoopState


def fake_loop(max_steps=10):
    return SimpleNamespace(trainer=SimpleNamespace(max_steps=max_steps, log_every=5), state=LoopState())


def test_rich_bar_tracks_steps_and_shows_train_metrics():
    loop, bar = fake_loop(), RichProgress()
    bar.on_fit_start(loop)
    bar.progress.console.file = io.StringIO()
    for step in range(1, 11):
        loop.state.step = step
        loop.state.metrics = {"train/loss": 1.0 / step, "val/loss": 2.0}
        bar.on_train_step_end(loop)
    bar.on_validation_end(loop, {"val/loss": 2.0})
    task = bar.progress.tasks[0]
    assert task.completed == 10 and task.fields["info"] == "train/loss 0.1"
    bar.on_fit_end(loop)
    assert "step 10 | val/loss 2" in bar.progress.console.file.getvalue()


def test_text_progress_prints_train_and_val_lines():
    out, loop = io.StringIO(), fake_loop()
    text = TextProgress(stream=out)
    loop.state.step = 5
    text.on_metrics(loop, {"train/loss": 0.5, "lr/pg0": 0.1})
    text.on_metrics(loop, {"lr/pg0": 0.1})  # no train metric: no line
    text.on_validation_end(loop, {"val/loss": 0.25, "val/accuracy": 0.9})
    assert out.getvalue().splitlines() == ["step 5/10 | train/loss 0.5", "step 5 | val/loss 0.25  val/accuracy 0.9"]
