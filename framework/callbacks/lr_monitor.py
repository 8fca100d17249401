"""`callbacks=[lr_monitor]`: log each parameter group's learning rate."""
from __future__ import annotations

from framework.callbacks.base import Callback


class LearningRateMonitor(Callback):
    """Logs `lr/pg<i>` for every optimizer parameter group every trainer.log_every steps."""

    def on_train_step_end(self, loop) -> None:
        if loop.state.step % loop.trainer.log_every == 0 or loop.state.step == 1:
            loop.log_metrics({f"lr/pg{i}": g["lr"] for i, g in enumerate(loop.optimizer.param_groups)})
