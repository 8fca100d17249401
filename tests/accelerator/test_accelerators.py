"""Device types: availability, device counts, placement; cuda/mps logic without the hardware."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from framework.accelerator.auto import auto_accelerator
from framework.accelerator.cpu import CPUAccelerator
from framework.accelerator.cuda import CUDAAccelerator
from framework.accelerator.mps import MPSAccelerator


def test_cpu():
    acc = CPUAccelerator()
    assert acc.is_available() and acc.distributed_backend == "gloo"
    assert acc.max_devices() == os.cpu_count()
    assert acc.resolve_devices("auto") == 1 and acc.resolve_devices(3) == 3
    assert acc.device_for(5) == torch.device("cpu")
    assert CPUAccelerator(max_processes=4).max_devices() == 4
    assert acc.fast_fp16() == bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def test_cuda_logic_with_a_pretend_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    acc = CUDAAccelerator()
    assert acc.is_available() and acc.max_devices() == 4 and acc.resolve_devices("auto") == 4
    assert acc.device_for(2) == torch.device("cuda", 2)
    assert acc.distributed_backend == "nccl"
    assert isinstance(auto_accelerator(), CUDAAccelerator)


def test_cuda_refuses_cleanly_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    acc = CUDAAccelerator()
    assert not acc.is_available()
    reason = acc.unavailable_reason()
    assert ("CPU-only build" in reason) == (torch.version.cuda is None)


def test_mps_logic(monkeypatch):
    acc = MPSAccelerator()
    assert acc.max_devices() == 1 and acc.device_for(0) == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert acc.is_available() and isinstance(auto_accelerator(), MPSAccelerator)


def test_auto_falls_back_to_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert isinstance(auto_accelerator(), CPUAccelerator)


def test_cpu_returns_freed_memory_for_sharding_strategies(monkeypatch):
    """Sharding strategies on the CPU fix glibc's mmap threshold (freed buffers go back to the OS);
    other strategies keep glibc's default unless the user asks (accelerator.return_freed_memory)."""
    import framework.accelerator.cpu as cpu

    calls = []
    monkeypatch.setattr(cpu, "set_mmap_threshold", calls.append)
    CPUAccelerator().setup_host_memory(low_memory=False)
    CPUAccelerator(return_freed_memory=False).setup_host_memory(low_memory=True)
    assert calls == []
    CPUAccelerator().setup_host_memory(low_memory=True)
    CPUAccelerator(return_freed_memory=True).setup_host_memory(low_memory=False)
    assert calls == [cpu.MMAP_THRESHOLD_BYTES] * 2
    from framework.strategy.ddp import DDPStrategy
    from framework.strategy.fsdp import FSDPStrategy
    assert FSDPStrategy.shards_states and not DDPStrategy.shards_states


def test_discard_pages_zeroes_a_tensor_and_gives_its_memory_back():
    """ZeRO-3's gradient buffer between steps (framework/strategy/deepspeed/grad_buffer.py): the
    tensor and its views stay valid and read zeros; its pages leave the resident set until written."""
    import sys

    from framework.accelerator.cpu import discard_pages

    def resident_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    if not sys.platform.startswith("linux"):
        pytest.skip("madvise(MADV_DONTNEED) is Linux's")
    buffer = torch.randn(16 * 2**20)  # 64 MiB, resident
    view = buffer[12345:12345 + 1000]
    before = resident_mib()
    discard_pages(buffer)
    assert before - resident_mib() > 60
    assert buffer.abs().sum().item() == 0 and view.abs().sum().item() == 0
    view.fill_(2.0)  # written again: only what is written comes back
    assert buffer.sum().item() == 2000.0 and resident_mib() < before - 60
    small = torch.randn(100)  # smaller than a page: zeroed in place
    discard_pages(small)
    assert small.abs().sum().item() == 0


def test_zeros_on_demand_are_zeros_that_cost_memory_only_once_written():
    """While ZeRO-3 sets up on the CPU (framework/strategy/deepspeed/grad_buffer.py)."""
    import sys

    from framework.strategy.deepspeed.grad_buffer import zeros_on_demand

    if not sys.platform.startswith("linux"):
        pytest.skip("madvise(MADV_DONTNEED) is Linux's")
    statm = Path("/proc/self/statm")
    before = int(statm.read_text().split()[1])
    with zeros_on_demand():
        big = torch.zeros(16 * 2**20)  # 64 MiB
        small = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    grown_mib = (int(statm.read_text().split()[1]) - before) * os.sysconf("SC_PAGE_SIZE") / 2**20
    assert grown_mib < 8 and torch.zeros is not None
    assert big.abs().sum().item() == 0 and big.shape == (16 * 2**20,)
    assert small.dtype == torch.float64 and small.requires_grad and small.sum().item() == 0
    assert torch.zeros(2).tolist() == [0.0, 0.0]  # torch's own again
