"""accel plugin: Intel GPUs through ``torch.xpu``.

A plugin can be a module: accel loads it through the ``accel`` entry point in
this package's pyproject.toml and collects every function marked
``@accel.hookimpl``. Only the hooks that differ from accel's fallbacks are here;
moving models and batches uses the built-in ``module.to(device)`` and tree walk.
"""

from __future__ import annotations

import torch

import accel

__all__ = [
    "device_count",
    "distributed_backend",
    "get_device",
    "is_available",
    "register_accelerators",
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
