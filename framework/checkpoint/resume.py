"""The resume policy of a run directory, in one place: whether a run may start there, and which
checkpoint it continues from.

A fresh run (no `resume`, no `ckpt_path`) never starts over an earlier run's checkpoints; a given
`ckpt_path` is checked completely before anything is written; `resume=auto` takes the newest
complete checkpoint; a worker group the elastic agent restarted, or a job its scheduler requeued,
continues from the newest checkpoint of its own run.
"""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from framework.checkpoint.format import check_files, list_checkpoints, read_meta
from framework.checkpoint.weights import is_weights_file, read_weights
from framework.errors import ConfigError


def elastic_restart() -> bool:
    """Whether this process belongs to a worker group the elastic agent restarted."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def check_run_dir(cfg: DictConfig, output_dir: Path, restarted: bool = False) -> None:
    """Refuse to start a fresh run over an earlier run's checkpoints (nothing is ever lost), and
    check a given ckpt_path completely (every file present, no file truncated) before anything
    is written. A job the scheduler restarted (`restarted`) continues from its checkpoints."""
    if cfg.ckpt_path:
        path = Path(cfg.ckpt_path).expanduser()
        if is_weights_file(path):  # plain weights (safetensors, a state_dict file): read through once
            read_weights(path)
        else:
            meta = read_meta(path)
            check_files(path, meta, list(meta["files"]))
    if cfg.resume or cfg.ckpt_path or restarted:
        return
    complete, _ = list_checkpoints(output_dir / "checkpoints")
    if complete:
        raise ConfigError(
            f"{output_dir} already holds checkpoints of an earlier run (newest: {complete[-1].path.name}). "
            "Continue it with resume=auto, or start a separate run with another name=..."
        )


def resume_path(cfg, output_dir: Path, say, restarted: bool = False) -> Path | None:
    """The checkpoint to resume from: ckpt_path, or with resume=auto the newest complete one. A
    worker group restarted by the elastic agent (trainer.max_restarts), or a job its scheduler
    restarted (`restarted`: a requeued SLURM job), resumes from the newest checkpoint of this
    run, or from ckpt_path again if there is none yet."""
    restarted = restarted or elastic_restart()
    if cfg.ckpt_path and not restarted:
        return Path(cfg.ckpt_path).expanduser()
    if cfg.resume != "auto" and not restarted:  # after a restart: always the newest checkpoint
        return None
    complete, partial = list_checkpoints(output_dir / "checkpoints")
    for p in partial:
        say(f"resume=auto: ignoring incomplete checkpoint {p} (its write did not finish)")
    if not complete:
        if restarted and cfg.ckpt_path:
            return Path(cfg.ckpt_path).expanduser()
        say(f"resume=auto: no checkpoint in {output_dir / 'checkpoints'}; starting from step 0")
        return None
    return complete[-1].path
