"""Accelerators without a plugin: a device type torch drives and no plugin claims.

A PrivateUse1 backend after its rename (torch-nntile's ``nntile``, torch-opencl's
``opencl``, TorchTPU's ``tpu``, Ascend's ``npu``) and the device types torch drives
itself (``xpu``, ``hpu``, ``mtia``) become accelerators named by their device type,
built from torch's generic calls only: ``torch.get_device_module`` for availability,
count and generators, ``torch.accelerator`` for the rest (accel's fallbacks),
``torch.distributed.get_default_backend_for_device`` for the collective backend.
Whatever a backend refuses is an unknown (``None``) or a reason, never a crash, and
ties are kept by torch's own rule, as for every device that unties.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final

import torch
import torch.distributed

from accel.errors import AcceleratorValueError
from accel.markers import hookimpl
from accel.training.precision import autocast_to, backend_amp_dtypes
from accel.types import AcceleratorSpec, Availability

__all__: list[str] = []

#: The provider :func:`accel.list_accelerators` shows for these accelerators.
NO_PLUGIN: Final = "no plugin (torch)"
#: Their ``"auto"`` rank: above the CPU (0), below every built-in GPU (mps 50, cuda 100).
PRIORITY: Final = 20

# torch's own names that are never an accelerator of this kind: accel's built-ins
# (the CPU, CUDA and ROCm, MPS, torch_xla) and the device types that hold no data.
_NOT_DEVICES: Final = frozenset({"cpu", "cuda", "mps", "xla", "meta", "privateuseone"})
# Device types torch drives itself, beside the current accelerator and PrivateUse1.
_IN_TREE: Final = ("xpu", "hpu", "mtia")


def torch_device_types() -> list[str]:
    """The device types torch drives here that are not accel built-ins, in a fixed
    order: the renamed PrivateUse1 backend first, then torch's current accelerator,
    then the in-tree types whose device module is loaded and built.

    Asks nothing that initialises a device: names and compile-time answers only.
    """
    found: list[str] = [privateuse1_name()]
    current = getattr(torch, "accelerator", None)
    if current is not None:
        try:  # check_available=False: a compile-time answer, no runtime probe
            reported = current.current_accelerator(check_available=False)
        except (RuntimeError, TypeError):  # torch 2.6 has no check_available
            reported = None
        if reported is not None:
            found.append(reported.type)
    found += [name for name in _IN_TREE if _module_built(name)]
    return [
        name for i, name in enumerate(found) if name not in _NOT_DEVICES and name not in found[:i]
    ]


def privateuse1_name() -> str:
    """The PrivateUse1 backend's name now: a backend imported late renames it."""
    return str(torch._C._get_privateuse1_backend_name())


def unclaimed_devices(claimed: Callable[[str], bool]) -> list[TorchDevicePlugin]:
    """A stand-in plugin for each device type torch drives that no accelerator claims
    (``claimed(name)``: a registered accelerator answers to that name or alias)."""
    return [TorchDevicePlugin(t) for t in torch_device_types() if not claimed(t)]


def _module_built(device_type: str) -> bool:
    module = getattr(torch, device_type, None)  # torch.hpu exists once habana loads
    if module is None:
        return False
    compiled = getattr(module, "_is_compiled", None)
    return bool(compiled()) if callable(compiled) else True


def _device_module(device_type: str) -> Any:
    try:
        return torch.get_device_module(device_type)
    except (RuntimeError, AttributeError):  # no module registered for the type
        return None


def _ask(module: Any, name: str) -> Any:
    """``module.name()``, or ``None`` where the backend has no such call or refuses it."""
    call = getattr(module, name, None)
    if not callable(call):
        return None
    try:
        return call()
    except Exception:  # a backend's refusal (internal asserts included) is an unknown
        return None


class TorchDevicePlugin:
    """The accelerator of one device type torch drives, from torch's generic calls."""

    def __init__(self, device_type: str) -> None:
        #: The device type, which is also the accelerator's name.
        self.device_type = device_type

    def __repr__(self) -> str:
        return f"TorchDevicePlugin({self.device_type!r})"

    @hookimpl
    def register_accelerators(self) -> list[AcceleratorSpec]:
        return [
            AcceleratorSpec(
                self.device_type,
                priority=PRIORITY,
                description=f"{self.device_type} devices torch drives (no accel plugin)",
            )
        ]

    @hookimpl
    def is_available(self) -> Availability:
        module = _device_module(self.device_type)
        if module is None:
            return Availability(
                False,
                reason=f"torch names the device type {self.device_type!r} but registered "
                f"no torch.{self.device_type} module for it",
                remedy=f"import the backend that provides {self.device_type!r} (its "
                f"package registers torch.{self.device_type})",
            )
        available = _ask(module, "is_available")
        count = _ask(module, "device_count")
        if available is False or count == 0:
            return Availability(
                False,
                reason=f"torch.{self.device_type} reports no usable device",
                remedy=f"check the {self.device_type} driver and its visibility settings",
            )
        return Availability(True)

    @hookimpl
    def device_count(self) -> int:
        count = _ask(_device_module(self.device_type), "device_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else 1

    @hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device(self.device_type, 0 if index is None else index)

    @hookimpl
    def distributed_backend(self) -> str:
        ask = getattr(torch.distributed, "get_default_backend_for_device", None)
        try:
            return "gloo" if ask is None else str(ask(self.device_type))
        except (ValueError, RuntimeError):  # no backend registered for the device type
            return "gloo"

    @hookimpl
    def compile_backend(self) -> str | None:
        # A backend registering a torch.compile backend named after its device type
        # (TorchTPU's "tpu") knows best; it registered it through torch._dynamo, so
        # without torch._dynamo loaded there is none. Else accel's fallback decides.
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None and self.device_type in dynamo.list_backends(exclude_tags=()):
            return self.device_type
        return None

    @hookimpl
    def autocast(
        self, accelerator: str, device: torch.device, dtype: torch.dtype | None
    ) -> AbstractContextManager[Any] | None:
        """The dtypes the backend's module names for autocast, less those the device
        cannot hold: torch-nntile names float16 and bfloat16 but makes only float32 and
        int64 tensors, and a float16 GradScaler would fail at its first step."""
        if device.type != privateuse1_name():
            return None  # a type torch drives itself: accel's fallback asks torch
        named = backend_amp_dtypes(accelerator, device.type)  # or a clear refusal
        held = tuple(candidate for candidate in named if _holds(device, candidate))
        if not held:
            listed = ", ".join(str(candidate) for candidate in named) or "none"
            raise AcceleratorValueError(
                f"accelerator {accelerator!r} cannot autocast to "
                f"{dtype or 'a lower precision'}: torch.{device.type} names {listed} for "
                f"autocast, but the device cannot make a tensor of any of them. Train in "
                f"float32 (leave autocast out, or acc.autocast(enabled=False))"
            )
        default = torch.get_autocast_dtype(device.type)
        return autocast_to(
            accelerator,
            device,
            dtype,
            default=default if default in held else held[0],
            supported=held,
            why=f" (of the {', '.join(str(candidate) for candidate in named)} torch."
            f"{device.type} names, the device holds only these)",
        )

    @hookimpl
    def clip_grad_norm_(
        self,
        parameters: list[torch.Tensor],
        max_norm: float,
        norm_type: float,
        device: torch.device,
    ) -> torch.Tensor | None:
        """torch's arithmetic on the device; where the backend lacks an operator of it
        (torch-nntile has no reciprocal, and only the 2-norm), that part runs on the host
        from the device's answers, before any gradient is scaled."""
        grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
        if device.type != privateuse1_name() or not grads:
            return None  # accel's fallback: torch's clip_grad_norm_ (sharded norms too)
        try:
            total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False)
        except RuntimeError:  # NotImplementedError is one: an operator the backend lacks
            norms = [torch.linalg.vector_norm(grad.to("cpu"), norm_type) for grad in grads]
            total = torch.linalg.vector_norm(torch.stack(norms), norm_type).to(device)
        scale: torch.Tensor | float
        try:  # torch's clip_grads_with_norm_, kept on the device: no wait for the norm
            scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        except RuntimeError:
            scale = min(max_norm / (float(total.to("cpu")) + 1e-6), 1.0)
        for grad in grads:
            grad.mul_(scale)
        return total


@functools.cache
def _holds(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``device`` can make a tensor of ``dtype`` (asked once per pair)."""
    try:
        torch.zeros((), dtype=dtype, device=device)
    except Exception:  # a backend's refusal, whatever its type
        return False
    return True
