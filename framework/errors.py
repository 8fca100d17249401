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


def did_you_mean(word: str, choices, cutoff: float = 0.5) -> str:
    """' Did you mean X?' for the closest of `choices`, or '' (for every unknown-name message)."""
    from difflib import get_close_matches

    close = get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f" Did you mean {close[0]}?" if close else ""


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


def guard_hydra_main(main, config_dir=None, config_name: str = "train") -> None:
    """Run a `@hydra.main` function. Hydra reports composition errors (unknown option, bad
    override, schema mismatch) itself and exits 1 before `framework.run` is entered; those are
    the user's mistakes, so they leave with exit code 2 like every other user error (most are
    caught first by `precheck`, with a clearer message)."""
    from framework.config.overrides import normalize_overrides, pin_sweep_name, recipe_is_a_sweep
    from framework.config.precheck import precheck, split_config_flags
    from framework.config.trust import allow_from_command_line

    args = normalize_overrides(allow_from_command_line(sys.argv[1:]))
    recipe_dir, recipe_name, _ = split_config_flags(args, config_dir, config_name)
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
