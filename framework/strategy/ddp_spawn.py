"""`strategy=ddp_spawn`: DDP whose workers are fresh interpreters (multiprocessing "spawn").

What differs from `ddp` (forkserver): each worker starts a new Python and imports what it needs
by name, so everything a worker touches must be importable by its module path (every
`_target_`, a user's custom classes in an installed or importable module, not in `__main__` of a
notebook), and the script that calls `framework.run` must guard its entry with
`if __name__ == "__main__":`. Use it where fork is unsafe (macOS, some CUDA set-ups) or to be
sure no state leaks from the launching process."""
from __future__ import annotations

from framework.strategy.ddp import DDPStrategy


class DDPSpawnStrategy(DDPStrategy):
    name = "ddp_spawn"
    start_method = "spawn"
