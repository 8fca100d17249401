"""The entry guard: what `framework.guard(main)` does around a `@hydra.main` function.

Before Hydra parses the command line: numeric group choices are quoted, a sweep's name is fixed,
`trust.allow=...` is taken out, and the config is composed once with our messages (a did-you-mean
instead of Hydra's raw report) and every `_target_` of Hydra's own settings checked against the
trust list. A sweep is prepared once per swept value, through the runner's one `prepare`
pipeline, so no job starts for a sweep that would fail. Hydra's own composition errors, which
exit with 1 before the run starts, leave with the user-error code like every other user error.
"""
from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

from hydra._internal.hydra import Hydra
from omegaconf import open_dict

from framework import runner
from framework.config.compose import composer, sweep_variants
from framework.config.overrides import (
    NO_PRECHECK_FLAGS,
    normalize_overrides,
    pin_sweep_name,
    recipe_is_a_sweep,
    split_config_flags,
)
from framework.config.trust import allow_from_command_line, check_hydra_settings, check_trusted
from framework.errors import ConfigError, ExitCode, RunExit, report, wants_traceback
from framework.paths import check_creatable_dir, conf_dir, make_importable


UNKNOWN = object()  # precheck did not compose (Hydra's own flags such as --cfg)


def precheck(args: list[str], config_dir, config_name: str):
    """Compose before Hydra does; exit with the user-error code on the first problem found.
    Returns the `hydra.mode` the config sets (None: the command line's -m decides), or UNKNOWN."""
    if NO_PRECHECK_FLAGS & {a.split("=")[0] for a in args}:
        return UNKNOWN
    config_dir, config_name, overrides = split_config_flags(args, config_dir, config_name)
    overrides = allow_from_command_line(overrides)
    try:
        try:
            variants = sweep_variants(overrides)
        except Exception:  # a syntax error: composing reports it with the key
            variants = [overrides]
        with composer(Path(config_dir) if config_dir else conf_dir()) as compose_one:
            configs = []
            for variant in variants:
                cfg = compose_one(config_name, variant, with_hydra=True)
                check_hydra_settings(cfg.hydra)
                check_trusted(cfg)
                configs.append(cfg)
            sweep = bool({"-m", "--multirun"} & set(args)) or "MULTIRUN" in str(configs[0].hydra.mode)
            run_dir = configs[0].hydra.sweep.dir if sweep else configs[0].hydra.run.dir
            check_creatable_dir(Path(run_dir), "hydra.sweep.dir" if sweep else "hydra.run.dir")
        mode = configs[0].hydra.mode
        if len(configs) > 1:  # a sweep: every value is checked as a run would be, before any job starts
            for cfg in configs:
                with open_dict(cfg):
                    cfg.pop("hydra")
                runner.prepare(cfg)
        return mode
    except ConfigError as err:
        if wants_traceback(any(a in ("debug=true", "debug=True") for a in overrides)):
            raise
        report(err)
        raise RunExit(ExitCode.USER_ERROR) from None


@contextmanager
def mode_known_to_hydra(mode):
    """Hydra composes the whole config once only to read `hydra.mode` before it composes it again to
    run (`Hydra.get_mode`); the guard has just composed the same config with the same overrides,
    so Hydra is told the answer (a tenth of a second of every start-up)."""
    if mode is UNKNOWN:
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: mode
    try:
        yield
    finally:
        Hydra.get_mode = original


def guard(main, config_dir=None, config_name: str = "train") -> None:
    """Run a `@hydra.main` function. `config_dir`/`config_name`: its primary config (default: the
    shipped conf/train)."""
    args = normalize_overrides(allow_from_command_line(sys.argv[1:]))
    recipe_dir, recipe_name, _ = split_config_flags(args, config_dir, config_name)
    if recipe_dir:
        make_importable(Path(recipe_dir))
    sys.argv[1:] = pin_sweep_name(args, recipe_name, recipe_sweeps=recipe_is_a_sweep(recipe_dir, recipe_name))
    # conf/hydra/launcher/submitit_*.yaml define the plugin's launchers in full, and Hydra checks
    # them against the plugin's schemas of the same name (wanted), warning that it does so.
    warnings.filterwarnings("ignore", message=r"\n'hydra/launcher/submitit_\w+' is validated against ConfigStore schema")
    mode = precheck(sys.argv[1:], config_dir, config_name)
    try:
        with mode_known_to_hydra(mode):
            main()
    except SystemExit as exit_:
        # Hydra exits with 1 for its own composition errors, before the run starts: the user's mistake.
        if exit_.code == 1 and not isinstance(exit_, RunExit) and not runner.started():
            raise RunExit(ExitCode.USER_ERROR) from None
        raise
