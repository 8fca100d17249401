"""Which checkpoint to evaluate, and its weights alone into a live model.

`framework test` and `trainer.test_at_end` score the weights of one checkpoint: the best by the
checkpoint callback's monitor, else the newest. Weights load from any checkpoint this framework
reads (full or sharded, any strategy, any world size) or from a plain weights file; nothing else
of the run (optimizer, loop, RNG) is touched.
"""
from __future__ import annotations

import math
from pathlib import Path

from omegaconf import OmegaConf

from framework.checkpoint.format import (
    META,
    CheckpointInfo,
    check_files,
    is_sharded,
    list_checkpoints,
    read_meta,
    sharded_files,
)
from framework.checkpoint.weights import fit_saved_state, is_weights_file, load_error_summary, read_weights
from framework.checkpoint_io.dcp_reader import STATE_DIR
from framework.errors import CheckpointError, ConfigError


def monitored(meta: dict, monitor: str | None) -> float | None:
    """The monitored metric's value recorded in a checkpoint's meta.json (None: not recorded, or NaN)."""
    value = (meta.get("metrics") or {}).get(monitor) if monitor else None
    return None if value is None or math.isnan(value) else float(value)


def best_checkpoint(root: Path, monitor: str | None, mode: str = "min") -> CheckpointInfo | None:
    """The complete checkpoint under `root` with the best recorded `monitor`, or None when none
    recorded it."""
    complete, _ = list_checkpoints(root)
    scored = [c for c in complete if monitored(c.meta, monitor) is not None]
    if not scored:
        return None
    return (min if mode == "min" else max)(scored, key=lambda c: monitored(c.meta, monitor))


def checkpoint_to_evaluate(root: Path, monitor: str | None, mode: str = "min") -> tuple[CheckpointInfo | None, str]:
    """(the checkpoint, why it was chosen): the best by `monitor`, else the newest complete one;
    (None, why not) when `root` holds no complete checkpoint."""
    best = best_checkpoint(root, monitor, mode)
    if best is not None:
        return best, f"best {monitor}={monitored(best.meta, monitor):.6g}"
    complete, _ = list_checkpoints(root)
    if not complete:
        return None, f"no complete checkpoint in {root}"
    why = f"newest; none recorded {monitor}" if monitor else "newest"
    return complete[-1], why


CHECKPOINT_CALLBACK = "ModelCheckpoint"  # the class whose monitor ranks a run's checkpoints


def checkpoint_monitor(config: dict) -> tuple[str | None, str]:
    """The (monitor, mode) of a run config's checkpoint callback ((None, "min") without one)."""
    for node in (config.get("callbacks") or {}).values():
        if isinstance(node, dict) and str(node.get("_target_", "")).endswith(CHECKPOINT_CALLBACK):
            return node.get("monitor"), node.get("mode", "min")
    return None, "min"


def find_checkpoint(target: Path, command: str) -> tuple[Path, Path | None, str]:
    """What a command after training (`command`: "framework test", ...) was given: a checkpoint
    directory, or a run directory (then its best checkpoint by the run's monitor, else its
    newest). Returns (the checkpoint, the run directory holding it or None, why it was chosen)."""
    if (target / META).is_file():
        run_dir = target.parent.parent if target.parent.name == "checkpoints" else None
        return target, run_dir if run_dir is not None and (run_dir / "config.yaml").is_file() else None, "given"
    if not target.is_dir():
        raise ConfigError(f"{command} {target}: no such directory; give a run directory (outputs/<name>) or a "
                          "checkpoint directory (outputs/<name>/checkpoints/step_...).")
    config_file = target / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{command} {target}: not a run directory (it has no config.yaml) nor a checkpoint "
                          f"directory (no {META}); give outputs/<name> or outputs/<name>/checkpoints/step_....")
    monitor, mode = checkpoint_monitor(OmegaConf.to_container(OmegaConf.load(config_file)))
    info, why = checkpoint_to_evaluate(target / "checkpoints", monitor, mode)
    if info is None:
        raise CheckpointError(f"{command} {target}: {why}: the run saved none (callbacks.checkpoint was off, or the "
                              "run stopped before its first save). Train with callbacks=[checkpoint] first, or give "
                              "a checkpoint directory.")
    return info.path, target, why


def load_model_weights(strategy, model, path: Path) -> dict | None:
    """Collective: `path`'s model weights into the set-up `model` (each rank its own part);
    returns the checkpoint's meta.json (None for a plain weights file). A checkpoint of another
    model is refused as a CheckpointError naming what did not fit."""
    path = Path(path)
    meta = None
    try:
        if is_weights_file(path):
            strategy.load_model_state_dict(model, fit_saved_state(strategy.unwrap(model), read_weights(path)))
            return None
        meta = read_meta(path)
        if is_sharded(meta):  # a DCP directory, resharded on read to this strategy and world size
            check_files(path, meta, sharded_files(meta))
            strategy.load_sharded_state_dict(model, None, path / STATE_DIR)
        else:
            check_files(path, meta, ["model.pt"])
            state = strategy.checkpoint_io.load(path / "model.pt")
            strategy.load_model_state_dict(model, fit_saved_state(strategy.unwrap(model), state))
    except (RuntimeError, KeyError, ValueError) as err:
        saved = ((meta or {}).get("config") or {}).get("model", {}).get("_target_", "another model")
        raise CheckpointError(f"{path} does not fit this model ({load_error_summary(err)}); it holds the weights of "
                              f"{saved} (its meta.json has the config it was saved from).") from err
    return meta
