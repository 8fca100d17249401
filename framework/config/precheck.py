"""Check a command line before Hydra runs it (framework.guard): composition with our messages,
trust of every `_target_` including Hydra's own settings, and every value of a sweep."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

from framework.errors import USER_ERROR_EXIT_CODE, ConfigError, report, wants_traceback

# Hydra flags after which the command does not train: no pre-check.
_NO_PRECHECK_FLAGS = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve",
                      "--package", "-p", "--shell-completion", "-sc", "--experimental-rerun"}
_CONFIG_FLAGS = {"--config-dir": "dir", "-cd": "dir", "--config-path": "dir", "-cp": "dir",
                 "--config-name": "name", "-cn": "name"}


def split_config_flags(args: list[str], config_dir, config_name: str):
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
    Hydra instantiates before the framework runs) are refused. A sweep is composed once per swept
    value, and each variant goes through `prepare`, so no job starts for a sweep that would fail."""
    if _NO_PRECHECK_FLAGS & {a.split("=")[0] for a in args}:
        return
    from framework.config.compose import composer, sweep_variants
    from framework.config.trust import allow_from_command_line, check_hydra_settings, check_trusted
    from framework.paths import conf_dir

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
        if len(configs) > 1:  # a sweep: every value is checked as a run would be, before any job starts
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
