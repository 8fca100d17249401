"""Ways for a real run to die abruptly, at a chosen moment, for the fault-tolerance tests."""
import os
import signal
from pathlib import Path

from framework.callbacks.base import Callback
from framework.checkpoint_io.torch import TorchCheckpointIO


class KillRankOnce(Callback):
    """SIGKILLs the process of `rank` after optimizer step `step`, in the first attempt only."""

    def __init__(self, rank: int = 1, step: int = 5):
        self.rank, self.step = rank, step

    def on_train_step_end(self, loop) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and loop.strategy.global_rank == self.rank and loop.state.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class DyingCheckpointIO(TorchCheckpointIO):
    """Writes normally until the `die_at_save`-th file, of which it writes half a temp file (as
    torch.save would when killed) and then SIGKILLs its own process."""

    def __init__(self, die_at_save: int = 5, **kwargs):
        super().__init__(**kwargs)
        self.die_at_save = die_at_save
        self.saves = 0

    def save(self, obj, path) -> None:
        self.saves += 1
        if self.saves == self.die_at_save:
            path = Path(path)
            with open(path.with_name(f".{path.name}.tmp-{os.getpid()}"), "wb") as f:
                f.write(b"PK\x03\x04 half of a zip")
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        super().save(obj, path)
