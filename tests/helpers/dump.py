"""A callback that restores several checkpoints in turn and dumps what the strategy then holds."""
from pathlib import Path

import torch

from framework.callbacks.base import Callback


class DumpRestoredState(Callback):
    def __init__(self, checkpoints: list, out_dir: str):
        self.checkpoints = [Path(p) for p in checkpoints]
        self.out_dir = Path(out_dir)

    def on_fit_start(self, loop) -> None:
        for i, path in enumerate(self.checkpoints):
            loop.restore(path)
            model = loop.strategy.model_state_dict(loop.model)
            optimizer = loop.strategy.optimizer_state_dict(loop.model, loop.optimizer)
            if loop.strategy.is_global_zero:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                torch.save({"model": model, "optimizer": optimizer, "step": loop.state.step}, self.out_dir / f"{i}.pt")
