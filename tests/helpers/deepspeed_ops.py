"""`make test`'s set-up for the DeepSpeed tests: libaio where the machine allows it
(tests/helpers/libaio.py), then DeepSpeed's CPU ops compiled into the environment's own
TORCH_EXTENSIONS_DIR (framework/strategy/deepspeed/prebuild.py), so no test waits minutes on a
first build and the suite's time is its tests'. Run as `python -m tests.helpers.deepspeed_ops`."""
from __future__ import annotations

import sys

from framework.strategy.deepspeed.prebuild import main as prebuild
from tests.helpers.libaio import ensure_libaio

if __name__ == "__main__":
    reason = ensure_libaio()
    print(f"libaio: {reason or 'installed'}", flush=True)
    if prebuild([]):  # the DeepSpeed tests then build (and fail) on their own, showing the error
        print("some DeepSpeed ops did not build; the tests that need them will say why", flush=True)
    sys.exit(0)
