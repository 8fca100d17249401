"""A resumed DeepSpeed run puts the saved step count where the live optimizer keeps its own
(framework/strategy/deepspeed/state.py `_as_live_step`): fused AdamW on CUDA refused a CPU step
after a ZeRO-3 resume ("state_steps is on cpu, different from other tensors on cuda:0", found on
an H100). A CPU has one device, so the rule is checked by dtype, the other half of the form."""
from __future__ import annotations

import torch

from framework.strategy.deepspeed.state import _as_live_step


def test_the_saved_step_takes_the_live_steps_device_and_dtype():
    live = torch.tensor(0.0, dtype=torch.float64)
    restored = _as_live_step(torch.tensor(7.0), live)
    assert restored.dtype == torch.float64 and restored.device == live.device and float(restored) == 7.0
    saved = torch.tensor(3.0)
    assert _as_live_step(saved, torch.tensor(0.0)) is not saved  # a copy: the checkpoint's tensor is not shared
    assert _as_live_step(torch.tensor(5.0), 0) == 5.0 and isinstance(_as_live_step(torch.tensor(5.0), 0), float)
