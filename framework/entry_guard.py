"""The entry guard: what `framework.guard(main)` does around a `@hydra.main` function.

Before Hydra parses the command line: numeric group choices are quoted, a sweep's name is fixed,
`trust.allow=...` is taken out. A single run is composed once, by Hydra itself: the guard wraps
Hydra's composition so that a mistake gets our message (a did-you-mean instead of Hydra's raw
report) and the composed config is checked (every `_target_` against the trust list, Hydra's own
settings included; the run directory creatable) before Hydra instantiates anything from it. A
sweep is composed first by the guard, once per swept value, and prepared through the runner's
one `prepare` pipeline, so no job starts for a sweep that would fail. Hydra's own composition
errors, which exit with 1 before the run starts, leave with the user-error code like every other
user error.
"""
from __future__ import annotations

import atexit
import gc
import sys
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path

from hydra._internal.hydra import Hydra
from omegaconf import open_dict

from framework import runner
from framework.config.compose import composer, friendly_message, keys_lookup, search_dirs_of, sweep_variants
from framework.config.overrides import (
    NO_PRECHECK_FLAGS,
    normalize_overrides,
    pin_sweep_name,
    recipe_is_a_sweep,
    split_config_flags,
)
from framework.config.trust import allow_from_command_line, check_hydra_settings, check_trusted
from framework.errors import ConfigError, ExitCode, RunExit, report, wants_traceback
from framework.launch.replica_groups import GROUPS_IN_A_SWEEP, launches_groups
from framework.paths import check_creatable_dir, conf_dir, make_importable
from framework.preflight import prepare

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
        if sweep and any(launches_groups(cfg) for cfg in configs):
            raise ConfigError(GROUPS_IN_A_SWEEP)
        if len(configs) > 1:  # a sweep: every value is checked as a run would be, before any job starts
            for cfg in configs:
                with open_dict(cfg):
                    cfg.pop("hydra")
                prepare(cfg)
        return mode
    except ConfigError as err:
        if wants_traceback(any(a in ("debug=true", "debug=True") for a in overrides)):
            raise
        report(err)
        raise RunExit(ExitCode.USER_ERROR) from None


def is_single_run(args: list[str], recipe_dir, recipe_name: str) -> bool:
    """A run Hydra composes once and runs (no sweep, no flag that only prints): the guard checks
    Hydra's own composition instead of composing before it."""
    if ({"-m", "--multirun"} & set(args)) or NO_PRECHECK_FLAGS & {a.split("=")[0] for a in args}:
        return False
    if any(a.lstrip("+~").startswith(("hydra.mode", "hparams_search")) for a in args):
        return False  # a sweep chosen by a setting
    return not recipe_is_a_sweep(recipe_dir, recipe_name)


@contextmanager
def checked_composition(config_dir, debug: bool):
    """While Hydra runs: its composition of the run's config goes through the guard's messages and
    checks (composition errors as one paragraph, trust, the run directory), exiting with the
    user-error code before Hydra sets up anything from a config that fails them."""
    original = Hydra.compose_config
    search_dirs = search_dirs_of(config_dir)

    def compose_config(self, config_name, overrides, run_mode, **kwargs):
        try:
            try:
                cfg = original(self, config_name, overrides, run_mode, **kwargs)
            except Exception as err:  # Hydra has no common base class for composition errors
                keys_at = keys_lookup(lambda choices: original(self, config_name, choices, run_mode,
                                                               validate_sweep_overrides=False), overrides)
                raise ConfigError(friendly_message(err, search_dirs, keys_at)) from err
            check_hydra_settings(cfg.hydra)
            check_trusted(cfg)
            check_creatable_dir(Path(cfg.hydra.run.dir), "hydra.run.dir")
            return cfg
        except ConfigError as err:
            if wants_traceback(debug):
                raise
            report(err)
            raise RunExit(ExitCode.USER_ERROR) from None

    Hydra.compose_config = compose_config
    try:
        yield
    finally:
        Hydra.compose_config = original


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


def shorter_shutdown() -> None:
    """At interpreter exit, after every other exit handler (registered first, it runs last): move
    the objects left to the permanent generation, so the shutdown's garbage collections do not walk
    torch's and its compiler stack's hundreds of thousands of objects (~0.3 s of every run's exit
    on this machine). Modules are still torn down and every handler has run."""
    global _shutdown_registered
    if not _shutdown_registered:
        atexit.register(gc.freeze)
        _shutdown_registered = True


_shutdown_registered = False


def guard(main, config_dir=None, config_name: str = "train") -> None:
    """Run a `@hydra.main` function. `config_dir`/`config_name`: its primary config (default: the
    shipped conf/train)."""
    shorter_shutdown()
    args = normalize_overrides(allow_from_command_line(sys.argv[1:]))
    recipe_dir, recipe_name, _ = split_config_flags(args, config_dir, config_name)
    if recipe_dir:
        make_importable(Path(recipe_dir))
    sys.argv[1:] = pin_sweep_name(args, recipe_name, recipe_sweeps=recipe_is_a_sweep(recipe_dir, recipe_name))
    # conf/hydra/launcher/submitit_*.yaml define the plugin's launchers in full, and Hydra checks
    # them against the plugin's schemas of the same name (wanted), warning that it does so.
    warnings.filterwarnings("ignore", message=r"\n'hydra/launcher/submitit_\w+' is validated against ConfigStore schema")
    args = sys.argv[1:]
    single = is_single_run(args, recipe_dir, recipe_name)
    mode = None if single else precheck(args, config_dir, config_name)
    debug = any(a in ("debug=true", "debug=True") for a in args)
    try:
        with mode_known_to_hydra(mode), checked_composition(recipe_dir, debug) if single else nullcontext():
            main()
    except SystemExit as exit_:
        # Hydra exits with 1 for its own composition errors, before the run starts: the user's mistake.
        if exit_.code == 1 and not isinstance(exit_, RunExit) and not runner.started():
            raise RunExit(ExitCode.USER_ERROR) from None
        raise
