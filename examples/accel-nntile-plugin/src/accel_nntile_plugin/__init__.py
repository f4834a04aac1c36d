"""accel plugin: the nntile device through torch-nntile, a PrivateUse1 backend.

``import torch_nntile`` renames PrivateUse1 to ``nntile`` and adds ``torch.nntile``;
``torch_nntile.init_context()`` starts StarPU's workers. Operations on the device are
recorded into a task graph that runs when it is submitted (``execute``) or when a
result is read on the host, so the step boundary and ``synchronize`` are the graph's.
A module moved there gets new Parameters (torch swaps tensors in place only for its
built-in device types), hence ``unties_weights``.
"""

from __future__ import annotations

import importlib.util
from contextlib import AbstractContextManager
from typing import Any

import torch

import accel

__all__ = [
    "autocast",
    "clip_grad_norm_",
    "device_count",
    "distributed_backend",
    "get_device",
    "is_available",
    "mark_step",
    "optimizer_step",
    "register_accelerators",
    "rng_state",
    "set_rng_state",
    "synchronize",
]

#: The torch release torch-nntile 0.1.0 is built against.
SUPPORTED_TORCH = "2.9."

_configured = False


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [
        accel.AcceleratorSpec(
            "nntile",
            priority=10,  # above the CPU's 0, below every built-in GPU
            description="nntile task graphs on StarPU workers via torch-nntile (PrivateUse1)",
            unties_weights=True,  # a move gives every parameter slot a Parameter of its own
        )
    ]


@accel.hookimpl
def is_available() -> accel.Availability:
    # Importing torch_nntile renames PrivateUse1 for the whole process: probe without it.
    if importlib.util.find_spec("torch_nntile") is None:
        return accel.Availability(
            False,
            reason="torch-nntile is not installed",
            remedy="pip install torch==2.9.1 torch-nntile==0.1.0 (on CPython 3.12)",
        )
    if not torch.__version__.startswith(SUPPORTED_TORCH):
        return accel.Availability(
            False,
            reason=f"torch-nntile 0.1.0 needs torch 2.9, this is torch {torch.__version__}",
            remedy="pip install torch==2.9.1",
        )
    return accel.Availability(True)


@accel.hookimpl
def device_count() -> int:
    return 1  # StarPU's workers, all of them, are one nntile device


@accel.hookimpl
def get_device(index: int | None) -> torch.device:
    _runtime()  # the device type exists only once torch_nntile is imported
    return torch.device("nntile", 0 if index is None else index)


@accel.hookimpl
def distributed_backend() -> str:
    return "gloo"  # no collective library of its own


# -- the training step ---------------------------------------------------------------


@accel.hookimpl(wrapper=True)
def optimizer_step() -> Any:
    result = yield  # the fallback's optimizer.step()
    # Submit the step's graph now, as XLA's step mark does, so it never grows past one step.
    _runtime().execute()
    return result


@accel.hookimpl
def mark_step() -> None:
    _runtime().execute()  # submit the recorded graph; does not wait


@accel.hookimpl
def synchronize() -> None:
    runtime = _runtime()
    runtime.execute()  # what is still only recorded must run before there is anything to wait for
    runtime.wait()


@accel.hookimpl
def autocast(accelerator: str, dtype: torch.dtype | None) -> AbstractContextManager[Any]:
    # Full precision never reaches this hook (accel answers it); anything else cannot run.
    # accel's own error type, so that callers (grad_scaler's) know "this device cannot".
    raise accel.errors.AcceleratorValueError(
        f"accelerator {accelerator!r} cannot autocast to {dtype or 'a lower precision'}: "
        f"nntile tensors are float32 or int64; train in float32 (leave autocast out, or "
        f"acc.autocast(enabled=False))"
    )


@accel.hookimpl
def clip_grad_norm_(
    parameters: list[torch.Tensor], max_norm: float, norm_type: float, device: torch.device
) -> torch.Tensor:
    # The device has the 2-norm but not the division torch's clip_grad_norm_ takes (no
    # reciprocal): the gradients' norms come to the host, the scale goes back.
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    norms = torch.stack([_host_norm(grad, norm_type) for grad in grads])
    total = torch.linalg.vector_norm(norms, norm_type)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(scale.item())
    return total.to(device)


@accel.hookimpl
def rng_state() -> dict[str, Any]:
    # No random op runs on the device (host draws are accel's): nothing of its own to store.
    return {"type": "nntile", "states": []}


@accel.hookimpl
def set_rng_state(state: Any) -> None:
    if not (isinstance(state, dict) and state.get("type") == "nntile"):
        raise ValueError(f"not an nntile generator state: {state!r}")


def _host_norm(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    if norm_type == 2.0:  # the one norm the device computes
        return torch.linalg.vector_norm(grad, 2.0).cpu()
    return torch.linalg.vector_norm(grad.cpu(), norm_type)


def _runtime() -> Any:
    """torch_nntile, imported and with StarPU's workers configured (once per process)."""
    import torch_nntile

    global _configured
    if not _configured:
        # The context reports itself initialised only after its first operation, and
        # refuses a second configuration: configure once, unless someone already did.
        try:
            torch_nntile.init_context()
        except RuntimeError as exc:
            if "already locked" not in str(exc):
                raise
        _configured = True
    return torch_nntile
