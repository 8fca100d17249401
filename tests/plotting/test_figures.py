"""Figures of runs and sweeps, checked as images: read back, sized, one line per series, legends
naming what differs; the figures every run and sweep writes at its end; TensorBoard's HParams
data for a sweep; `framework plot` as a user types it."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from framework.plotting.figures import draw_runs, draw_sweep, runs_figure
from framework.plotting.run_data import is_sweep, read_run, read_sweep
from tests.conftest import TINY_GPT
from tests.helpers.in_process import run_command

matplotlib = pytest.importorskip("matplotlib")


def fake_run(path: Path, lr: float, steps: int = 20, overrides=None) -> Path:
    """A run directory as a run with logger=csv leaves it (metrics.csv, summary.json)."""
    path.mkdir(parents=True)
    columns = ["step", "val/loss", "lr/pg0", "train/loss", "train/tokens_per_s", "train/tokens", "train/grad_norm"]
    with open(path / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for step in range(0, steps + 1, 5):
            row = {"step": step, "lr/pg0": lr}
            if step:
                row.update({"train/loss": 5 - lr * step * 10, "train/tokens_per_s": 1000.0,
                            "train/tokens": step * 256, "train/grad_norm": 1.0})
            if step % 10 == 0:
                row["val/loss"] = 5.1 - lr * step * 10
            writer.writerow(row)
    summary = {"name": path.name, "objective": "val/loss", "objective_value": 5.1 - lr * steps * 10,
               "overrides": overrides or [f"optimizer.lr={lr}", "trainer.max_steps=20"], "status": "completed"}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def assert_png(path: Path, min_size=(400, 400)) -> None:
    """Read back: a real image of at least this size, not blank."""
    from matplotlib import image as images

    image = images.imread(path)
    height, width = image.shape[:2]
    assert width >= min_size[0] and height >= min_size[1], image.shape
    assert image[..., :3].std() > 0.05  # something is drawn on the white


def test_one_run_has_a_panel_per_metric_and_a_line_per_series(tmp_path):
    run = read_run(fake_run(tmp_path / "a", lr=0.01))
    fig = draw_runs([run])
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["loss", "loss against tokens", "learning rate", "gradient norm", "throughput"]
    loss = fig.axes[0]
    assert [line.get_linestyle() for line in loss.get_lines()] == ["-", "--"]  # train, val
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["train", "val"]
    train = loss.get_lines()[0]
    assert list(train.get_xdata()) == [5, 10, 15, 20] and train.get_ydata()[-1] == pytest.approx(3.0)
    tokens = fig.axes[1].get_lines()[1]  # val against tokens: interpolated at steps 0, 10, 20
    assert list(tokens.get_xdata()) == [0, 2560, 5120]
    assert fig.axes[4].get_ylabel() == "tokens / s"
    assert "optimizer.lr=0.01 trainer.max_steps=20" in fig._suptitle.get_text()
    out = runs_figure([run], tmp_path / "a" / "metrics.png")
    assert_png(out)


def test_several_runs_overlaid_and_named_by_what_differs(tmp_path):
    runs = [read_run(fake_run(tmp_path / str(i), lr=lr)) for i, lr in enumerate((0.01, 0.02, 0.03))]
    fig = draw_runs(runs)
    assert len(fig.axes[0].get_lines()) == 6  # train and val for each run
    colours = {line.get_color() for line in fig.axes[0].get_lines()}
    assert len(colours) == 3
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["optimizer.lr=0.01", "optimizer.lr=0.02", "optimizer.lr=0.03", "train", "val"]


def test_a_sweep_figure_marks_the_best_job_per_swept_value(tmp_path):
    sweep_dir = tmp_path / "sweep"
    for job, (lr, width) in enumerate([(0.01, 16), (0.01, 32), (0.02, 16), (0.02, 32)]):
        fake_run(sweep_dir / str(job), lr=lr * (2 if width == 32 else 1),
                 overrides=[f"optimizer.lr={lr}", f"model.n_embd={width}", "trainer.max_steps=20"])
    assert is_sweep(sweep_dir)
    sweep = read_sweep(sweep_dir)
    assert sweep.swept_values() == {"model.n_embd": ["16", "32", "16", "32"], "optimizer.lr": ["0.01", "0.01",
                                                                                              "0.02", "0.02"]}
    assert sweep.best().path.name == "3"
    fig = draw_sweep(sweep)
    assert [ax.get_xlabel() for ax in fig.axes] == ["model.n_embd", "optimizer.lr"]
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["job", "best (job 3)"]
        best = ax.collections[-1].get_offsets()[0]
        assert best[1] == pytest.approx(sweep.best().summary["objective_value"])
        assert [t.get_text() for t in ax.texts] == ["0", "1", "2", "3"]  # every point named by its job


def test_framework_plot_command_and_its_errors(tmp_path):
    for i, lr in enumerate((0.01, 0.02)):
        fake_run(tmp_path / f"run{i}", lr=lr)

    def plot(*args):  # `framework plot ARGS` as typed, through the command's own entry in this process
        return run_command(["plot", *args], tmp_path)

    both = plot("run0", "run1", "-o", "both.png")
    assert both.returncode == 0 and "wrote both.png" in both.stdout, both.stderr
    assert_png(tmp_path / "both.png")
    assert plot("run0").returncode == 0 and (tmp_path / "run0" / "metrics.png").is_file()
    missing = plot("nope")
    assert missing.returncode == 2 and "no such directory: nope" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = plot("empty", "run0")
    assert empty.returncode == 2 and "has no metrics.csv" in empty.stderr and "Traceback" not in empty.stderr


@pytest.mark.slow
def test_a_run_draws_its_figure_at_the_end_unless_told_not_to(tmp_path):
    base = [*TINY_GPT, "trainer.max_steps=6", "trainer.val_every=3", "callbacks=[lr_monitor]"]
    # through the command's own entry in this process, as the sweep below
    drawn = run_command(["train", "name=drawn", *base, "trainer.plot=true"], tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert "curves: " in drawn.stdout
    assert_png(tmp_path / "outputs" / "drawn" / "metrics.png")
    plain = run_command(["train", "name=plain", *base], tmp_path)  # TINY_GPT has trainer.plot=false
    assert plain.returncode == 0 and not (tmp_path / "outputs" / "plain" / "metrics.png").exists()


@pytest.mark.slow
def test_a_sweep_of_4_jobs_gives_a_comparison_figure_and_hparams_for_4_runs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    args = ["-m", "name=sw", *TINY_GPT, "trainer.plot=true", "trainer.max_steps=4", "trainer.val_every=2",
            "logger=[csv,tensorboard]", "callbacks=[lr_monitor]", "optimizer.lr=1e-3,3e-3", "model.n_embd=16,32"]
    result = run_command(["train", *args], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep_dir = tmp_path / "multirun" / "sw"
    assert_png(sweep_dir / "sweep.png", min_size=(800, 300))
    assert_png(sweep_dir / "curves.png")
    from omegaconf import OmegaConf

    jobs = {int(p.name): dict(o.split("=") for o in OmegaConf.load(p / ".hydra" / "overrides.yaml")
                              if o.startswith(("optimizer.lr", "model.n_embd")))
            for p in sweep_dir.iterdir() if p.name.isdigit()}
    assert sorted((j["model.n_embd"], j["optimizer.lr"]) for j in jobs.values()) == [
        ("16", "0.001"), ("16", "0.003"), ("32", "0.001"), ("32", "0.003")]
    runs = sorted(p.name for p in (sweep_dir / "tensorboard").iterdir())
    assert runs == [f"{n} model.n_embd={jobs[n]['model.n_embd']},optimizer.lr={jobs[n]['optimizer.lr']}"
                    for n in sorted(jobs)]
    summaries = {n: json.loads((sweep_dir / str(n) / "summary.json").read_text()) for n in jobs}
    for name in runs:
        events = EventAccumulator(str(sweep_dir / "tensorboard" / name), size_guidance={"tensors": 0})
        events.Reload()
        content = events.PluginTagToContent(metadata.PLUGIN_NAME)
        values = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG]).hparams
        experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
        job = int(name.split()[0])
        assert values["model.n_embd"].number_value == int(jobs[job]["model.n_embd"])
        assert values["optimizer.lr"].number_value == pytest.approx(float(jobs[job]["optimizer.lr"]))
        assert [m.name.tag for m in experiment.metric_infos] == ["val/loss"]
        last = events.Scalars("val/loss")[-1].value  # the value the dashboard shows for the metric
        assert last == pytest.approx(summaries[job]["objective_value"], rel=1e-6)


def test_every_logged_metric_gets_a_panel_and_patterns_choose_them(tmp_path):
    from framework.errors import UserError
    from framework.plotting.run_data import Run

    series = {"train/loss": [(1, 2.0), (2, 1.5)], "val/loss": [(0, 2.2), (2, 1.6)], "test/loss": [(2, 1.7)],
              "val/accuracy": [(0, 0.1), (2, 0.8)], "test/accuracy": [(2, 0.78)], "val/f1_score": [(0, 0.1), (2, 0.7)],
              **{f"val/recall/{c}": [(0, 0.1), (2, 0.5 + c / 10)] for c in range(4)}, "train/d_loss": [(1, 0.5)]}
    run = Run(tmp_path, series)

    def panels(figure) -> dict[str, list[str]]:
        return {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in figure.axes if ax.get_title()}

    drawn = panels(draw_runs([run]))
    assert set(drawn) == {"loss", "accuracy", "f1_score", "recall", "d_loss"}
    assert drawn["loss"] == ["train", "val", "test"] and drawn["accuracy"] == ["val", "test"]
    assert drawn["recall"] == [f"val/recall/{c}" for c in range(4)]  # classes in one panel, a line each
    assert set(panels(draw_runs([run], metrics=["f1*", "val/acc*"]))) == {"accuracy", "f1_score"}
    with pytest.raises(UserError, match="nothing to draw matching nope: .* logged test/accuracy, test/loss"):
        draw_runs([run], metrics=["nope"])
