"""ZeRO-3's gradient buffers resident only while they hold gradients, on the CPU.

DeepSpeed's stage-3 optimizer keeps one flat buffer of every gradient partition for the whole run
(4 bytes per parameter / N on each rank), where FSDP frees its gradients after each step. It
fills it with zeros when it is made (and, to set up its optimizer, a zero gradient as large as the
biggest sub group's parameters), so the set-up peak held it besides the weights, and through
every forward it sat beside the growing activations. Here:

- `zeros_on_demand()`, while deepspeed.initialize runs: large CPU tensors made with torch.zeros
  are allocated without being written (the kernel's zero-filled pages), so they cost memory only
  where something is written;
- `release_gradient_buffer(optimizer)`, after each optimizer step: nothing reads the buffer
  before the next backward (whose first gradient write overwrites each partition, a later
  micro-batch's adds to it), so its pages go back to the OS; it stays allocated, reads as zeros,
  and its pages return one by one as the next backward writes gradients, while that backward
  frees activations.

On a GPU the buffer is device memory, allocated and kept as DeepSpeed does.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from framework.accelerator.cpu import discard_pages

LAZY_ZEROS_BYTES = 1 << 20  # smaller ones come from the heap: zeroing them costs nothing worth saving


@contextmanager
def zeros_on_demand():
    """While it is open, `torch.zeros` of 1 MiB or more on the CPU returns a tensor of zeros whose
    pages are not resident until written (torch.empty, then discard_pages)."""
    original = torch.zeros

    def zeros(*size, **kwargs):
        if "out" in kwargs or kwargs.get("device") not in (None, "cpu", torch.device("cpu")):
            return original(*size, **kwargs)
        tensor = torch.empty(*size, **kwargs)
        if tensor.device.type != "cpu" or tensor.numel() * tensor.element_size() < LAZY_ZEROS_BYTES:
            return original(*size, **kwargs)
        discard_pages(tensor.detach())
        return tensor

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = original


def release_gradient_buffer(optimizer) -> bool:
    """After a ZeRO-3 step: give the gradient buffer's memory back until the next backward.
    Returns whether it did (a CPU buffer of DeepSpeed's stage-3 optimizer without offload)."""
    buffer = getattr(optimizer, "grad_partitions_flat_buffer", None)
    if buffer is None or buffer.device.type != "cpu" or getattr(optimizer, "offload_optimizer", False):
        return False
    discard_pages(buffer)
    return True
