"""The peak dense FLOP/s of the accelerators the framework knows, by the kind of arithmetic a run's
matrix products use: what `train/mfu` (model-FLOPs utilisation) divides by. Vendors' data-sheet
figures without sparsity; a device not in the table logs no `train/mfu` unless trainer.peak_tflops
names its peak."""
from __future__ import annotations

import torch

# (a part of the device's name as torch reports it, checked in this order; TFLOP/s in 16-bit
# tensor arithmetic (bf16/fp16), TF32, plain float32). More specific names come first.
PEAK_TFLOPS: tuple[tuple[str, float, float | None, float | None], ...] = (
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100 NVL", 835.0, 418.0, 60.0),
    ("H100", 989.0, 494.0, 67.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989.0, 494.0, 67.0),
    ("GH200", 989.0, 494.0, 67.0),
    ("H800", 989.0, 494.0, 67.0),
    ("B200", 2250.0, 1100.0, None),
    ("A100", 312.0, 156.0, 19.5),
    ("A800", 312.0, 156.0, 19.5),
    ("L40S", 362.0, 183.0, 91.6),
    ("L40", 181.0, 90.5, 90.5),
    ("L4", 121.0, 60.0, 30.3),
    ("V100", 125.0, None, 15.7),  # no bf16 tensor cores: its 16-bit figure is fp16's
)


def arithmetic(compute_dtype: torch.dtype) -> str:
    """'16-bit', 'tf32' or 'fp32': what a matrix product in `compute_dtype` runs as (float32 as TF32
    where torch is allowed to)."""
    if compute_dtype in (torch.bfloat16, torch.float16):
        return "16-bit"
    if compute_dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def device_name(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type


def peak_for(name: str, kind: str) -> float | None:
    """The table's peak dense FLOP/s for a device called `name` in `kind` arithmetic, or None."""
    for part, sixteen, tf32, fp32 in PEAK_TFLOPS:
        if part in name:
            tflops = {"16-bit": sixteen, "tf32": tf32, "fp32": fp32}[kind]
            return None if tflops is None else tflops * 1e12
    return None


def peak_flops(device: torch.device, compute_dtype: torch.dtype) -> float | None:
    """The device's peak dense FLOP/s for `compute_dtype`'s matrix products, or None: not known (a
    CPU's depends on its cores, clocks and vector units: no table's)."""
    if device.type != "cuda":
        return None
    return peak_for(device_name(device), arithmetic(compute_dtype))
