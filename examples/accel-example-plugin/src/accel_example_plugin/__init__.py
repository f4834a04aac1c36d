"""accel plugin: Intel GPUs through ``torch.xpu``.

A plugin can be a module: accel loads it through the ``accel`` entry point in
this package's pyproject.toml and collects every function marked
``@accel.hookimpl``. Only the hooks that differ from accel's fallbacks are here;
moving models and batches uses the built-in ``module.to(device)`` and tree walk,
stepping the optimizer ``optimizer.step()``, seeding ``torch.manual_seed`` (which
seeds XPU devices too) and the device loader a move per batch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch

import accel
from accel.training.precision import autocast_to
from accel.types import MemoryStats

__all__ = [
    "autocast",
    "device_count",
    "distributed_backend",
    "get_device",
    "is_available",
    "memory_stats",
    "register_accelerators",
    "synchronize",
]


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [
        accel.AcceleratorSpec(
            "xpu",
            aliases=("intel-gpu",),
            priority=90,  # above the CPU, below CUDA: "auto" prefers an NVIDIA GPU
            description="Intel GPUs via torch.xpu",
        )
    ]


@accel.hookimpl
def is_available() -> accel.Availability:
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return accel.Availability(
            False,
            reason=f"torch {torch.__version__} has no torch.xpu module",
            remedy="install torch 2.5 or newer with XPU support",
        )
    if not xpu.is_available():
        return accel.Availability(
            False,
            reason="no Intel GPU visible to torch.xpu",
            remedy="install an XPU build of torch and Intel's GPU driver",
        )
    return accel.Availability(True)


@accel.hookimpl
def device_count() -> int:
    return int(torch.xpu.device_count())


@accel.hookimpl
def get_device(index: int | None) -> torch.device:
    return torch.device("xpu", 0 if index is None else index)


@accel.hookimpl
def distributed_backend() -> str:
    return "xccl"  # Intel's collective library, in torch.distributed since 2.8


# -- the training step ---------------------------------------------------------------


@accel.hookimpl
def synchronize(device: torch.device) -> None:
    torch.xpu.synchronize(device)  # a plain implementation: accel's fallback does not run


@accel.hookimpl
def autocast(
    accelerator: str, device: torch.device, dtype: torch.dtype | None
) -> AbstractContextManager[Any]:
    # Like CUDA: bfloat16 where the GPU has it (Arc, Data Center GPU Max), else float16.
    bf16 = bool(torch.xpu.is_bf16_supported())
    return autocast_to(
        accelerator,
        device,
        dtype,
        default=torch.bfloat16 if bf16 else torch.float16,
        supported=(torch.bfloat16, torch.float16) if bf16 else (torch.float16,),
        why="" if bf16 else " (this Intel GPU has no bfloat16)",
    )


@accel.hookimpl
def memory_stats(device: torch.device) -> MemoryStats:
    return MemoryStats(
        allocated_bytes=int(torch.xpu.memory_allocated(device)),
        peak_allocated_bytes=int(torch.xpu.max_memory_allocated(device)),
        total_bytes=int(torch.xpu.get_device_properties(device).total_memory),
    )
