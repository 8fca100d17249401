"""`strategy=single_device`: one process on one device; nothing is wrapped."""
from __future__ import annotations

from framework.construction.named_state import load_optimizer_state_by_name, optimizer_state_by_name, strict_load
from framework.strategy.base import Strategy


class SingleDeviceStrategy(Strategy):
    """One process, one device. The reference every multi-process strategy is tested against."""

    name = "single_device"
    multi_process = False

    # A plain module: its own state_dict already is the portable format (see named_state.py).
    def model_state_dict(self, model) -> dict:
        return model.state_dict()

    def load_model_state_dict(self, model, state: dict) -> None:
        model.load_state_dict(state, strict=strict_load(model, state))

    def optimizer_state_dict(self, model, optimizer) -> dict:
        return optimizer_state_by_name(model, optimizer)

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        load_optimizer_state_by_name(model, optimizer, state)
