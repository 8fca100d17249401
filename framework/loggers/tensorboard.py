"""`logger=tensorboard`: TensorBoard event files under <run dir>/tensorboard (lazy import)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.loggers.base import Logger


class TensorBoardLogger(Logger):
    """Scalars per step, and the resolved config as text under 'hparams'."""

    requires_packages = {"tensorboard": "'framework[tensorboard]'"}

    def __init__(self, save_dir: str, subdir: str = "tensorboard", flush_secs: int = 30):
        """subdir: folder inside the run directory; flush_secs: how often events reach disk."""
        super().__init__(save_dir)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError("logger=tensorboard needs the tensorboard package: "
                              "pip install 'framework[tensorboard]' (or drop it from logger=[...]).") from err
        self.writer = SummaryWriter(log_dir=str(Path(save_dir) / subdir), flush_secs=flush_secs)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        text = OmegaConf.to_yaml(OmegaConf.create(params))
        self.writer.add_text("hparams", "```\n" + text + "\n```", 0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def finalize(self) -> None:
        self.writer.flush()
        self.writer.close()
