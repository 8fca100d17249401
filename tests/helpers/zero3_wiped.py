"""`python train.py` with ZeRO-3's build taken down the GPU path on the CPU, in every process a
torchrun starts: each rank's partitions are wiped after zero.Init's build, then the framework's
replay from the CPU generator (framework/strategy/deepspeed/cpu_init.py) must write them back.
Each rank writes what the replay said to replayed-rank<R>.txt in the working directory."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from framework.strategy.deepspeed import base, cpu_init


def wiped_then_replayed(model, factory, rng_state):
    for param in model.parameters():
        param.ds_tensor.zero_()
    said = cpu_init.initialise_from_cpu(model, factory, rng_state)
    Path(f"replayed-rank{os.environ.get('RANK', '0')}.txt").write_text(said or "ok")
    return said


if __name__ == "__main__":
    base.DeepSpeedStrategy._device_draws_the_init = lambda self: True
    base.initialise_from_cpu = wiped_then_replayed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import runpy

    sys.argv = [str(Path(__file__).resolve().parents[2] / "train.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
