"""A callback standing in for another process that deletes checkpoints under a running job."""
import shutil

from framework.callbacks.base import Callback
from framework.checkpoint.format import list_checkpoints


class DeleteCheckpoints(Callback):
    """At step `at_step`: delete the newest complete checkpoint (`what: newest`) or the whole
    checkpoints directory (`what: all`)."""

    def __init__(self, at_step: int = 3, what: str = "newest"):
        self.at_step, self.what = at_step, what

    def on_train_step_end(self, loop) -> None:
        if loop.state.step != self.at_step or not loop.strategy.is_global_zero:
            return
        if self.what == "all":
            shutil.rmtree(loop.checkpoint_dir)
        else:
            complete, _ = list_checkpoints(loop.checkpoint_dir)
            shutil.rmtree(complete[-1].path)
