"""What DeepSpeed's config needs beside its generation (DeepSpeedStrategy.deepspeed_config): raw
`strategy.config` keys merged over it, the merged config checked by DeepSpeed's own config models
before launch (deepspeed imported only then), and NVMe offload's folder checked."""
from __future__ import annotations

import os
from pathlib import Path

from framework.strategy.deepspeed.imports import deepspeed_package

# DeepSpeed's config models, by the section of its config each one reads (for error messages)
CONFIG_SECTIONS = {"DeepSpeedZeroConfig": "zero_optimization", "DeepSpeedBF16Config": "bf16",
                   "DeepSpeedFP16Config": "fp16", "DeepSpeedActivationCheckpointingConfig": "activation_checkpointing"}


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def refused_config(config: dict) -> list[str]:
    """What DeepSpeed's config models refuse in `config`, one message per value, naming its key
    under strategy.config."""
    deepspeed_package()
    from deepspeed.runtime.config import DeepSpeedConfig
    from pydantic import ValidationError

    try:
        DeepSpeedConfig(config)
    except ValidationError as err:
        section = CONFIG_SECTIONS.get(err.title, err.title)
        return [f"strategy.config.{section}.{'.'.join(map(str, e['loc']))}={e.get('input')!r}: DeepSpeed refuses "
                f"it: {e['msg']}. Fix or remove the key under strategy.config." for e in err.errors()]
    except (ValueError, AssertionError, KeyError, TypeError) as err:
        return [f"strategy.config: DeepSpeed refuses the merged config: {err}. Fix or remove the keys under "
                "strategy.config."]
    return []


def nvme_path_problems(nvme_path: str, offloads: tuple[str, ...]) -> list[str]:
    """NVMe offload swaps into `nvme_path` (DeepSpeed creates the folder): it must be a writable
    folder, or creatable under a writable one."""
    if "nvme" not in offloads:
        return []
    path = Path(nvme_path).expanduser()
    existing = next(p for p in [path, *path.parents] if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a writable folder" if existing == path else f"cannot be created ({existing} is not writable)"
        return [f"strategy.nvme_path={nvme_path}: {what}; set strategy.nvme_path to a folder on a fast local disk "
                "(e.g. strategy.nvme_path=/tmp/nvme)."]
    return []
