"""accel plugin: OpenCL devices through torch-opencl, a PrivateUse1 backend.

torch-opencl registers itself through torch's device-backend autoload (its
``torch.backends`` entry point): importing torch renames PrivateUse1 to ``opencl`` and
adds ``torch.opencl``. It needs an OpenCL platform (pocl's CPU driver does); its
extension loads only against torch 2.11.0.

What the backend can do decides the hooks here: moves work from contiguous host
tensors, and elementwise arithmetic (add, sub, mul, fill, zero) works, which is what
SGD needs; there is no matmul, no reduction and no random number generator, so no
forward pass runs on it. A module moved there gets new Parameters (torch swaps
tensors in place only for its built-in device types), hence ``unties_weights``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

import accel
from accel.training.nested import map_nested

__all__ = [
    "batch_to_device",
    "device_count",
    "distributed_backend",
    "get_device",
    "is_available",
    "register_accelerators",
    "rng_state",
    "set_rng_state",
    "synchronize",
]

#: The one torch release torch-opencl 0.1.0.dev23's extension links against.
SUPPORTED_TORCH = "2.11."


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [
        accel.AcceleratorSpec(
            "opencl",
            aliases=("cl",),
            priority=10,  # above the CPU's 0, below every built-in GPU
            description="OpenCL devices via torch-opencl (PrivateUse1)",
            unties_weights=True,  # a move gives every parameter slot a Parameter of its own
            probing_initialises=True,  # counting devices sets up OpenCL: probe only when asked
        )
    ]


@accel.hookimpl
def is_available() -> accel.Availability:
    if importlib.util.find_spec("torch_opencl") is None:
        return accel.Availability(
            False,
            reason="torch-opencl is not installed",
            remedy="pip install torch==2.11.0 torch-opencl==0.1.0.dev23",
        )
    if not torch.__version__.startswith(SUPPORTED_TORCH):
        return accel.Availability(
            False,
            reason=f"torch-opencl 0.1.0.dev23 needs torch 2.11, this is torch {torch.__version__}",
            remedy="pip install torch==2.11.0",
        )
    opencl = _backend()
    if opencl is None:
        return accel.Availability(
            False,
            reason="torch-opencl did not register the opencl device with torch",
            remedy="unset TORCH_DEVICE_BACKEND_AUTOLOAD (torch-opencl loads through it)",
        )
    # Counting devices sets up the OpenCL platform: the backend has no cheaper probe.
    if int(opencl.device_count()) == 0:
        return accel.Availability(
            False,
            reason="no OpenCL device found (no OpenCL platform driver installed)",
            remedy="install an OpenCL driver, e.g. apt-get install pocl-opencl-icd",
        )
    # Only arithmetic runs on the device: a user asks for it by name, "auto" never picks it.
    return accel.Availability(
        True,
        reason="torch-opencl runs elementwise arithmetic only (no matmul or reductions)",
        auto=False,
    )


@accel.hookimpl
def device_count() -> int:
    opencl = _backend()
    return 0 if opencl is None else int(opencl.device_count())


@accel.hookimpl
def get_device(index: int | None) -> torch.device:
    return torch.device("opencl", 0 if index is None else index)


@accel.hookimpl
def distributed_backend() -> str:
    return "gloo"  # no collective library of its own


@accel.hookimpl
def batch_to_device(batch: Any, device: torch.device) -> Any:
    # The backend copies only contiguous host tensors (a transposed view is refused).
    return map_nested(batch, lambda tensor: tensor.contiguous().to(device))


@accel.hookimpl
def synchronize(device: torch.device) -> None:
    # torch-opencl has no synchronize; a read back to the host waits for the queue.
    torch.zeros(1, device=device).cpu()


@accel.hookimpl
def rng_state() -> dict[str, Any]:
    # The backend has no generator of its own (no random op runs on it): nothing to store.
    return {"type": "opencl", "states": []}


@accel.hookimpl
def set_rng_state(state: Any) -> None:
    if not (isinstance(state, dict) and state.get("type") == "opencl"):
        raise ValueError(f"not an opencl generator state: {state!r}")


def _backend() -> Any:
    # torch.opencl exists once torch-opencl's autoload ran; import it in case it did not.
    if not hasattr(torch, "opencl"):
        try:
            import torch_opencl  # noqa: F401
        except ImportError:
            return None
    return getattr(torch, "opencl", None)
