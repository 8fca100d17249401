"""The figures: a run's (or several runs') curves, and a sweep's objective against each swept value.

Drawn with matplotlib's Agg backend (no display needed) and written as PNG. Which panels a figure
has follows from the metrics the runs logged: loss (train and val) against step, and against
training tokens (or samples) when that count was logged; learning rate; gradient norm;
throughput; then a panel for every other metric (accuracy, F1, a GAN's losses, memory...), its
train, val and test values together. `metrics` (fnmatch patterns of a metric's name, with or
without its train/, val/ or test/ prefix) chooses panels. Runs are told apart by colour; the
legend names what differs between them.
"""
from __future__ import annotations

import math
import re
import textwrap
from fnmatch import fnmatch
from pathlib import Path

import numpy as np

from framework.errors import UserError
from framework.plotting.run_data import Run, Sweep, differing_overrides

# (panel title, y label, metric keys drawn in it and their line styles, log-scale y)
PANELS = [
    ("loss", "loss", [("train/loss", "-"), ("val/loss", "--"), ("test/loss", "*")], False),
    ("learning rate", "learning rate", [("lr/pg0", "-")], False),
    ("gradient norm", "grad norm (before clipping)", [("train/grad_norm", "-")], False),
    ("throughput", "{unit} / s", [("train/tokens_per_s", "-"), ("train/samples_per_s", "-")], False),
]
ITEM_COUNTS = ("train/tokens", "train/samples")  # cumulative counts, for loss against tokens
NOT_DRAWN = (*ITEM_COUNTS, "train/skipped_step", "train/loss_scale")
PREFIX_STYLES = {"train": "-", "val": "--", "test": "*"}  # a test is one point, at the step it scored


def _base_name(key: str) -> str:
    prefix, _, rest = key.partition("/")
    return rest if prefix in PREFIX_STYLES and rest else key


def _group(key: str) -> str:
    """The panel a metric goes to: its name without its train/val/test prefix and per-class suffix (recall/3)."""
    return re.sub(r"/\d+$", "", _base_name(key))


def metric_panels(runs: list[Run]) -> list[tuple]:
    """A panel for every logged metric the fixed panels do not draw: train/x, val/x and test/x in one."""
    drawn = {key for _, _, keys, _ in PANELS for key, _ in keys} | set(NOT_DRAWN)
    groups: dict[str, list[str]] = {}
    prefixes = list(PREFIX_STYLES)
    for key in sorted({k for run in runs for k in run.series} - drawn,  # train, val, test; classes in order
                      key=lambda k: (_group(k), prefixes.index(k.split("/")[0]) if k.split("/")[0] in prefixes else -1,
                                     int(k.rsplit("/", 1)[1]) if k.rsplit("/", 1)[-1].isdigit() else 0, k)):
        groups.setdefault(_group(key), []).append(key)
    return [(name, name, [(key, PREFIX_STYLES.get(key.split("/")[0], "-")) for key in keys], False)
            for name, keys in groups.items()]


def chosen(panels: list[tuple], patterns: list[str] | None) -> list[tuple]:
    """The panels one of whose metrics (by full name or without its train/val/test prefix) matches a pattern."""
    if not patterns:
        return panels
    return [p for p in panels if any(fnmatch(name, pattern) for key, _ in p[2] for name in (key, _base_name(key))
                                     for pattern in patterns)]


def matplotlib_or_error():
    """pyplot with the Agg backend, or a UserError saying what to install."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("figures need matplotlib: pip install 'framework[plot]' (or pip install matplotlib).") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _short(label: str, width: int = 70) -> str:
    return label if len(label) <= width else label[: width - 3] + "..."


def runs_figure(runs: list[Run], out: Path, title: str | None = None, metrics: list[str] | None = None) -> Path:
    """`draw_runs` written as a PNG."""
    return _save(draw_runs(runs, title, metrics), out)


def draw_runs(runs: list[Run], title: str | None = None, metrics: list[str] | None = None):
    """One figure of every panel some run has data for (those `metrics` chooses); each run one colour."""
    plt = matplotlib_or_error()
    panels = [p for p in PANELS if any(key in run.series for run in runs for key, _ in p[2])]
    counts = next((c for c in ITEM_COUNTS if any(c in run.series for run in runs)), None)
    if counts and any("train/loss" in run.series for run in runs):
        panels.insert(1, (f"loss against {counts.split('/')[1]}", "loss", [("train/loss", "-"), ("val/loss", "--")],
                          False))
    logged = sorted({k for run in runs for k in run.series})
    panels = chosen(panels + metric_panels(runs), metrics)
    if not panels:
        wanted = f" matching {', '.join(metrics)}" if metrics else ""
        raise UserError(f"nothing to draw{wanted}: {', '.join(str(r.path) for r in runs)} logged "
                        f"{', '.join(logged) or 'no metric'}.")
    columns = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 3.6 * rows + 0.9), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = differing_overrides(runs)
    for index, (panel_title, ylabel, keys, log_y) in enumerate(panels):
        ax = axes[index // columns][index % columns]
        against_items = panel_title.startswith("loss against")
        # one line per class or per layer (recall/3, moe_load_max/1), or many lines: a colour and a name each
        per_item = len(keys) > 3 or any(k.rsplit("/", 1)[-1].isdigit() for k, _ in keys)
        for run_index, run in enumerate(runs):
            colour = colours[run_index % len(colours)]
            for key_index, (key, style) in enumerate(keys):
                if len(runs) == 1 and per_item:
                    colour = colours[key_index % len(colours)]
                points = run.series.get(key)
                if not points:
                    continue
                xs, ys = zip(*points)
                if against_items:
                    xs = _items_at(run, counts, xs)
                    if xs is None:
                        continue
                marker = "*" if style == "*" else "o" if len(points) < 4 else None
                ax.plot(xs, ys, style.replace("*", ""), color=colour, marker=marker, markersize=7 if style == "*" else 3,
                        label=(key if per_item else key.split("/")[0]) if len(runs) == 1 else None)
        ax.set_title(panel_title)
        ax.set_xlabel(counts.split("/")[1] if against_items else "step")
        unit = next((k.split("/")[1].removesuffix("_per_s") for k, _ in keys if any(k in r.series for r in runs)), "")
        ax.set_ylabel(ylabel.format(unit=unit))
        if log_y:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if len(runs) == 1 and len([k for k, _ in keys if k in runs[0].series]) > 1:
            ax.legend(fontsize=8 if len(keys) <= 6 else 6, ncol=1 if len(keys) <= 6 else 2)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].axis("off")
    if len(runs) > 1:  # one legend for the figure: a colour per run, named by what differs
        handles = [plt.Line2D([], [], color=colours[i % len(colours)], label=_short(label))
                   for i, label in enumerate(labels)]
        handles += [plt.Line2D([], [], color="grey", linestyle="-", label="train"),
                    plt.Line2D([], [], color="grey", linestyle="--", label="val")]
        fig.legend(handles=handles, loc="lower center", ncol=min(3, len(handles)), fontsize=8, frameon=False)
    if title is None and len(runs) == 1:  # the run's name, and what it was started with
        title = runs[0].name
        overrides = " ".join(runs[0].overrides)
        if overrides:
            title += "\n" + textwrap.fill(overrides, 150)
    fig.suptitle(title or f"{len(runs)} runs", fontsize=10 if title and "\n" in title else 12)
    top = 0.97 - 0.02 * (title or "").count("\n")
    bottom = (0.012 * math.ceil((len(runs) + 2) / 3) + 0.01) * (12 / (3.6 * rows + 0.9)) if len(runs) > 1 else 0.0
    fig.tight_layout(rect=(0, bottom, 1, top))
    return fig


def _items_at(run: Run, counts: str, steps) -> list[float] | None:
    """The cumulative item count at each of `steps`, interpolated between the logged counts
    (validation is logged at steps where the count may not be)."""
    logged = run.series.get(counts)
    if not logged:
        return None
    known_steps, known_items = zip(*sorted(logged))
    return list(np.interp(steps, (0, *known_steps), (0.0, *known_items)))


def sweep_figure(sweep: Sweep, out: Path) -> Path:
    """`draw_sweep` written as a PNG."""
    return _save(draw_sweep(sweep), out)


def draw_sweep(sweep: Sweep):
    """The objective against each swept value (one panel per swept key), the best job marked."""
    plt = matplotlib_or_error()
    swept = sweep.swept_values()
    if not swept:
        raise UserError(f"{sweep.path}: its jobs do not differ in any override, so there is nothing to compare.")
    values = [job.summary.get("objective_value") for job in sweep.jobs]
    best = sweep.best()
    columns = min(3, len(swept))
    rows = math.ceil(len(swept) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.8 * rows + 0.6), squeeze=False)
    for index, (key, raw) in enumerate(swept.items()):
        ax = axes[index // columns][index % columns]
        numeric = all(_is_number(v) for v in raw)
        if numeric:
            xs = [float(v) for v in raw]
        else:
            categories = sorted(set(raw), key=raw.index)
            xs = [categories.index(v) for v in raw]
            ax.set_xticks(range(len(categories)), [_short(c, 18) for c in categories], rotation=20)
        done = [(x, y) for x, y in zip(xs, values) if isinstance(y, (int, float)) and math.isfinite(y)]
        failed = [x for x, y in zip(xs, values) if not (isinstance(y, (int, float)) and math.isfinite(y))]
        if done:
            ax.scatter(*zip(*done), color="tab:blue", label="job", zorder=2)
        if failed:
            low = min((y for _, y in done), default=0.0)
            ax.scatter(failed, [low] * len(failed), marker="x", color="tab:grey", label="failed", zorder=2)
        if best is not None:
            x = xs[sweep.jobs.index(best)]
            ax.scatter([x], [best.summary["objective_value"]], marker="*", s=260, color="tab:red",
                       label=f"best (job {best.path.name})", zorder=3)
        if numeric:  # ticks at the swept values only (a few, often on a log grid)
            if len(set(xs)) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 100:
                ax.set_xscale("log")
                ax.minorticks_off()
            ticks = sorted(set(xs))
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks], rotation=20 if len(ticks) > 4 else 0)
            span = (max(ticks) - min(ticks)) or abs(ticks[0]) or 1.0
            if ax.get_xscale() == "linear":
                ax.set_xlim(min(ticks) - 0.12 * span, max(ticks) + 0.12 * span)
        for job, x, y in zip(sweep.jobs, xs, values):  # which job each point is
            if isinstance(y, (int, float)) and math.isfinite(y):
                ax.annotate(job.path.name, (x, y), textcoords="offset points", xytext=(6, 3), fontsize=7,
                            color="dimgrey")
        ax.set_xlabel(key)
        ax.set_ylabel(f"{sweep.objective} ({sweep.mode})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for index in range(len(swept), rows * columns):
        axes[index // columns][index % columns].axis("off")
    fig.suptitle(f"{sweep.path.name}: {len(sweep.jobs)} jobs, {sweep.objective} against each swept value")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def write_sweep_figures(sweep: Sweep, sweep_png: Path | None = None) -> list[Path]:
    """A sweep's figures in its directory: sweep.png (when its jobs differ in some override)
    and curves.png (every job's curves)."""
    written = [runs_figure(sweep.jobs, sweep.path / "curves.png", title=f"{sweep.path.name}: {len(sweep.jobs)} jobs")]
    if sweep.swept_values():
        written.insert(0, sweep_figure(sweep, sweep_png or sweep.path / "sweep.png"))
    return written


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _save(fig, out: Path) -> Path:
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
