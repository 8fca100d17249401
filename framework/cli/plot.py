"""`framework plot`: PNG figures of runs and sweeps.

    framework plot RUN_DIR                 its curves, written to RUN_DIR/metrics.png
    framework plot RUN_DIR RUN_DIR ...     the runs overlaid, named by what differs (-o FILE)
    framework plot SWEEP_DIR               SWEEP_DIR/sweep.png (objective against each swept
                                           value, best job marked) and SWEEP_DIR/curves.png
    framework plot RUN_DIR --metrics loss 'f1*'   only the panels of metrics matching the patterns

Every logged metric has a panel (accuracy, F1, a GAN's losses, memory ...: train, val and test
values together), after loss, learning rate, gradient norm and throughput.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from framework.errors import ExitCode, UserError, report
from framework.plotting.figures import runs_figure, write_sweep_figures
from framework.plotting.run_data import is_sweep, read_run, read_sweep


def parser() -> argparse.ArgumentParser:
    plot = argparse.ArgumentParser(prog="framework plot", description="PNG figures of runs and sweeps (matplotlib)")
    plot.add_argument("dirs", nargs="+", metavar="DIR", help="run directories, or one sweep directory")
    plot.add_argument("-o", "--out", default=None,
                      help="the PNG to write (default: in the run or sweep directory; for several runs, runs.png "
                           "in the current directory)")
    plot.add_argument("--metrics", nargs="+", default=None, metavar="PATTERN",
                      help="draw only the metrics matching these fnmatch patterns (a name with or without its "
                           "train/, val/, test/ prefix: accuracy, 'val/*', 'f1*')")
    return plot


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    paths = [Path(d) for d in args.dirs]
    out = Path(args.out) if args.out else None
    try:
        missing = [str(p) for p in paths if not p.is_dir()]
        if missing:
            raise UserError(f"no such directory: {', '.join(missing)}")
        if len(paths) == 1 and is_sweep(paths[0]):
            written = write_sweep_figures(read_sweep(paths[0]), out)
        else:
            runs = [read_run(p) for p in paths]
            default = paths[0] / "metrics.png" if len(paths) == 1 else Path("runs.png")
            written = [runs_figure(runs, out or default, metrics=args.metrics)]
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    for path in written:
        print(f"wrote {path}")
    return ExitCode.OK
