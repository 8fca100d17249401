"""User-facing errors: one clear paragraph, exit code 2, no traceback unless asked for."""
from __future__ import annotations

import os
import sys

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A mistake in what the user gave us (config, file, combination). Never a framework bug."""


class ConfigError(UserError):
    """A bad key, value, type or combination in the configuration."""


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or unsafe to load."""


def wants_traceback(debug: bool = False) -> bool:
    return bool(debug) or os.environ.get("HYDRA_FULL_ERROR") == "1"


def report(err: BaseException, stream=None) -> None:
    """Print `err` as one wrapped paragraph, prefixed with its kind."""
    stream = stream or sys.stderr
    kind = {ConfigError: "configuration error", CheckpointError: "checkpoint error"}.get(type(err), "error")
    body = str(err)
    if "\n" in body:  # several problems: one per line, indented under the heading
        body = "\n" + "\n".join(f"  - {line}" for line in body.splitlines())
    runner_state.last_error = f"{kind}: {str(err)}"
    print(f"{kind}: {body}\n(set debug=true or HYDRA_FULL_ERROR=1 for a traceback)", file=stream)


class _RunnerState:
    entered = False
    last_error: str | None = None  # the last error reported (a failed sweep job records it)


runner_state = _RunnerState()


# Hydra flags after which the command does not train: no pre-check.
_NO_PRECHECK_FLAGS = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve",
                      "--package", "-p", "--shell-completion", "-sc", "--experimental-rerun"}
_CONFIG_FLAGS = {"--config-dir": "dir", "-cd": "dir", "--config-path": "dir", "-cp": "dir",
                 "--config-name": "name", "-cn": "name"}


def _split_config_flags(args: list[str], config_dir, config_name: str):
    """(config dir, config name, overrides) from Hydra's command line."""
    overrides, i = [], 0
    while i < len(args):
        flag, _, value = args[i].partition("=")
        if flag in _CONFIG_FLAGS:
            if not value:
                i += 1
                value = args[i] if i < len(args) else ""
            if _CONFIG_FLAGS[flag] == "dir":
                config_dir = value
            else:
                config_name = value
        elif not args[i].startswith("-"):
            overrides.append(args[i])
        i += 1
    return config_dir, config_name, overrides


def precheck(args: list[str], config_dir, config_name: str) -> None:
    """Compose once before Hydra does: a mistake gets our message (with a did-you-mean) and exit
    code 2 instead of Hydra's raw report, and untrusted targets in the `hydra:` settings (which
    Hydra instantiates before the framework runs) are refused. A sweep is checked with each swept
    key at its first value."""
    if _NO_PRECHECK_FLAGS & {a.split("=")[0] for a in args}:
        return
    from pathlib import Path

    from framework.config.compose import composer, sweep_variants
    from framework.config.trust import check_hydra_settings, check_trusted
    from framework.paths import conf_dir

    from framework.config.trust import allow_from_command_line

    config_dir, config_name, overrides = _split_config_flags(args, config_dir, config_name)
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
        if len(configs) > 1:  # a sweep: every value is checked as a run would be, before any job starts
            import contextlib
            import io

            from omegaconf import open_dict

            from framework.runner import prepare

            for cfg in configs:
                with open_dict(cfg):
                    cfg.pop("hydra")
                with contextlib.redirect_stderr(io.StringIO()):
                    prepare(cfg)
    except ConfigError as err:
        if wants_traceback(any(a in ("debug=true", "debug=True") for a in overrides)):
            raise
        report(err)
        raise SystemExit(USER_ERROR_EXIT_CODE) from None


def guard_hydra_main(main, config_dir=None, config_name: str = "train") -> None:
    """Run a `@hydra.main` function. Hydra reports composition errors (unknown option, bad
    override, schema mismatch) itself and exits 1 before `framework.run` is entered; those are
    the user's mistakes, so they leave with exit code 2 like every other user error (most are
    caught first by `precheck`, with a clearer message)."""
    from framework.config.overrides import normalize_overrides, pin_sweep_name, recipe_is_a_sweep

    from framework.config.trust import allow_from_command_line

    args = normalize_overrides(allow_from_command_line(sys.argv[1:]))
    recipe_dir, recipe_name, _ = _split_config_flags(args, config_dir, config_name)
    sys.argv[1:] = pin_sweep_name(args, recipe_name, recipe_sweeps=recipe_is_a_sweep(recipe_dir, recipe_name))
    # conf/hydra/launcher/submitit_*.yaml define the plugin's launchers in full, and Hydra checks
    # them against the plugin's schemas of the same name (wanted), warning that it does so.
    import warnings

    warnings.filterwarnings("ignore", message=r"\n'hydra/launcher/submitit_\w+' is validated against ConfigStore schema")
    precheck(sys.argv[1:], config_dir, config_name)
    try:
        main()
    except SystemExit as exit_:
        if exit_.code == 1 and not runner_state.entered:
            raise SystemExit(USER_ERROR_EXIT_CODE) from None
        raise
