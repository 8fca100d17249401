"""ZeRO-3 without its gradient buffer between steps, on the CPU.

DeepSpeed's stage-3 optimizer keeps one flat buffer of every gradient partition for the whole run
(4 bytes per parameter / N on each rank), where FSDP frees its gradients after each step. So
through every forward the buffer sits beside the growing activations. Nothing reads it between
the optimizer step and the next backward (whose first gradient write overwrites each partition,
a later micro-batch's adds to it), so after each step its pages go back to the OS: it stays
allocated, reads as zeros, and its pages return one by one as the next backward writes
gradients, while that backward frees activations.

On a GPU the buffer is device memory that madvise cannot release, and it is kept as DeepSpeed
keeps it.
"""
from __future__ import annotations

from framework.accelerator.cpu import discard_pages


def release_gradient_buffer(optimizer) -> bool:
    """After a ZeRO-3 step: give the gradient buffer's memory back until the next backward.
    Returns whether it did (a CPU buffer of DeepSpeed's stage-3 optimizer without offload)."""
    buffer = getattr(optimizer, "grad_partitions_flat_buffer", None)
    if buffer is None or buffer.device.type != "cpu" or getattr(optimizer, "offload_optimizer", False):
        return False
    discard_pages(buffer)
    return True
