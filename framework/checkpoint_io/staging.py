"""The copy an asynchronous DCP save makes of the live state, into buffers kept between saves."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor


class KeptBufferStager(AsyncStager):
    """Copies every tensor of a state dict into a CPU buffer kept for the next save, so training
    can change the live tensors while the copy is written. A run saves the same structure each
    time, so after the first save the copy allocates nothing: on the CPU, mapping and
    page-faulting fresh memory cost about three times the copy itself. DTensors (FSDP's shards)
    are copied as their local part and rewrapped with the same mesh and placements: DCP's own
    stager deep-copies each one, which costs more than copying its bytes for a mid-size model.
    The buffers hold as much memory as this rank's part of the state, between saves too."""

    # the copy is complete when stage() returns: nothing to synchronize later
    _synchronize_after_execute = False

    def __init__(self):
        self._buffers: dict[tuple, torch.Tensor] = {}

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        used: set[tuple] = set()
        on_accelerator = [False]
        with torch.no_grad():
            staged = self._copy(state_dict, (), used, on_accelerator)
        if on_accelerator[0]:
            torch.accelerator.synchronize()  # the non-blocking copies into pinned memory
        for key in self._buffers.keys() - used:  # tensors gone from the state: free their buffers
            del self._buffers[key]
        return staged

    def _copy(self, obj: Any, path: tuple, used: set, on_accelerator: list) -> Any:
        if isinstance(obj, DTensor):
            local = self._copy_tensor(obj.to_local(), path, used, on_accelerator)
            return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False,
                                      shape=obj.shape, stride=obj.stride())
        if type(obj) in (torch.Tensor, torch.nn.Parameter):
            return self._copy_tensor(obj, path, used, on_accelerator)
        if isinstance(obj, torch.Tensor):  # another tensor subclass: copied whole, as DCP would
            return copy.deepcopy(obj.detach()).cpu()
        if isinstance(obj, dict):
            return {key: self._copy(value, path + (key,), used, on_accelerator) for key, value in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(value, path + (i,), used, on_accelerator) for i, value in enumerate(obj))
        return copy.deepcopy(obj)

    def _copy_tensor(self, tensor: torch.Tensor, path: tuple, used: set, on_accelerator: list) -> torch.Tensor:
        used.add(path)
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.device.type != "cpu" and torch.accelerator.is_available()
            buffer = self._buffers[path] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
        non_blocking = tensor.device.type != "cpu"
        on_accelerator[0] |= non_blocking
        buffer.copy_(tensor.detach(), non_blocking=non_blocking)
        return buffer

    def close(self) -> None:
        self._buffers.clear()
