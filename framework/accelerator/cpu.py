"""The CPU: always available; `devices` is the number of processes on this node."""
from __future__ import annotations

import ctypes
import os

import psutil
import torch

from framework.accelerator.base import Accelerator

PROCESSES_PER_CORE = 4  # more than this per core: memory, not cores, runs out first (each rank holds torch)
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def set_mmap_threshold(size: int) -> bool:
    """Serve allocations of `size` bytes and more with mmap, so that freeing them returns the
    memory to the OS (a fixed threshold also turns glibc's adaptive one off). False where the C
    library is not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, size))
    except (OSError, AttributeError):
        return False


MADV_DONTNEED = 4  # madvise advice (sys/mman.h): drop the pages; the next touch maps zero-filled ones


def discard_pages(tensor: torch.Tensor) -> None:
    """Zero a contiguous CPU tensor and give its memory back to the OS until it is written again:
    the whole pages inside it are dropped with madvise(MADV_DONTNEED) (private anonymous memory,
    as malloc's is, reads as zeros afterwards and is mapped back a page at a time as it is
    written), the partial pages at its ends are zeroed. Where madvise is not there (not Linux, not
    glibc) or fails, the tensor is zeroed in place and stays resident."""
    start, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    first, last = -(-start // page) * page, (start + nbytes) // page * page
    flat = tensor.view(-1)
    if last - first < page or not _madvise_dontneed(first, last - first):
        flat.zero_()
        return
    flat[:(first - start) // tensor.element_size()].zero_()
    flat[(last - start) // tensor.element_size():].zero_()


def _madvise_dontneed(address: int, length: int) -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise(address, length, MADV_DONTNEED) == 0


class CPUAccelerator(Accelerator):
    """Train on the CPU. Several CPU "devices" are several processes sharing the cores."""

    name = "cpu"

    def __init__(self, max_processes: int | None = None, return_freed_memory: bool | None = None):
        """max_processes: the most processes one node may start (default: 4 per core; more
        processes than cores share them, with a warning);
        return_freed_memory: give freed buffers of 1 MiB and more back to the OS at once (glibc's
        mmap threshold fixed at 1 MiB). Sharding frees and reallocates buffers of many sizes, which
        glibc's adaptive threshold otherwise keeps in the heap: measured on a 85M GPT, fsdp's peak
        per rank 0.94 GiB instead of 2.1 GiB and growing, for about 15% slower steps; a LoRA run of a
        ~100M GPT-2 peaked at 708 MiB instead of 1805 (benchmarks/adapters.py). null: on for
        strategies that shard (fsdp, DeepSpeed, ddp_sharded), quantized precisions (bnb_*) and
        adapter runs, off otherwise."""
        self._max = max_processes
        self.return_freed_memory = return_freed_memory

    @staticmethod
    def is_available() -> bool:
        return True

    def max_devices(self) -> int:
        return self._max or os.cpu_count() or 1

    def max_processes(self) -> int:
        """Up to PROCESSES_PER_CORE processes per core share the cores (one thread each), unless
        max_processes sets the limit."""
        return self._max or PROCESSES_PER_CORE * self.max_devices()

    def auto_devices(self) -> int:
        return 1

    def setup_host_memory(self, low_memory: bool) -> None:
        wanted = low_memory if self.return_freed_memory is None else self.return_freed_memory
        if wanted:
            set_mmap_threshold(MMAP_THRESHOLD_BYTES)

    def device_for(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    @property
    def distributed_backend(self) -> str:
        return "gloo"

    def supports_bf16(self) -> bool:
        return True

    def memory_bytes(self) -> int | None:
        """The machine's RAM, shared by every process on it."""
        return psutil.virtual_memory().total

    def fast_fp16(self) -> bool:
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except (AttributeError, RuntimeError):
            return False

    def fast_bf16(self) -> bool:
        """AVX512-BF16 or AMX: without them a bf16 matmul is emulated (measured 80x slower than
        float32 on a 1024x768 by 768x3072 product, on an AVX2-only CPU)."""
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
