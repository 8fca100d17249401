"""`strategy=single_device`: one process on one device; nothing is wrapped."""
from __future__ import annotations

from framework.strategy.base import Strategy


class SingleDeviceStrategy(Strategy):
    """One process, one device. The reference every multi-process strategy is tested against."""

    name = "single_device"
    multi_process = False
