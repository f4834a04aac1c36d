"""The built-in fallback hook implementations, asked after every plugin.

Registered in every registry (even one without the built-in accelerators), so a
third-party accelerator plugin only implements what it does differently.

For a device type torch itself drives (``torch.accelerator``: XPU, HPU, MTIA, a
``privateuse1`` backend such as Ascend's NPU), the device count, synchronisation,
memory figures and seeding come from ``torch.accelerator`` when the accelerator's
device type is the one it reports; never for the CPU, and never for CUDA, whose
plugin has its own hooks (and whose probing must not initialise it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from accel.errors import AcceleratorValueError, PluginError
from accel.markers import hookimpl
from accel.training.batch import move_batch_or_copies
from accel.training.checkpoint._main_process import save_on_main_process
from accel.training.checkpoint._read import load_checkpoint
from accel.training.checkpoint._restoring import copies_host_tensors_in_place
from accel.training.checkpoint._rng import device_generators_of
from accel.training.checkpoint._state import cpu_state_dict
from accel.training.device_loader import MovingLoader
from accel.training.memory import unknown
from accel.training.precision import autocast_to, backend_amp_dtypes
from accel.training.step import clip_grad_norm, gradient_sync_paused, step_optimizer
from accel.types import Availability, MemoryStats


@hookimpl(trylast=True)
def is_available(accelerator: str) -> Availability:
    # A plugin missing a hook it needs is malformed, like the get_device and autocast
    # fallbacks below say: a PluginError, which the probe reports as the reason.
    raise PluginError(
        f"no plugin answered is_available for {accelerator!r}: the accelerator's plugin "
        f"must implement the is_available hook"
    )


@hookimpl(trylast=True)
def device_count(accelerator: str) -> int:
    # Probing: the accelerator's name is all there is (its device comes after the count).
    runtime = torch_accelerator(accelerator)
    return 1 if runtime is None else int(runtime.device_count())


@hookimpl(trylast=True)
def get_device(accelerator: str, index: int | None) -> torch.device:
    # Out-of-tree backends register their device type under their own name.
    try:
        return torch.device(accelerator, 0 if index is None else index)
    except RuntimeError:
        raise PluginError(
            f"torch has no device type {accelerator!r}, so the plugin providing the "
            f"accelerator {accelerator!r} must implement the get_device hook"
        ) from None


@hookimpl(trylast=True)
def distributed_backend() -> str:
    return "gloo"


@hookimpl(trylast=True)
def model_to_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    return model.to(device)


@hookimpl(trylast=True)
def batch_to_device(batch: Any, device: torch.device) -> Any:
    return move_batch_or_copies(batch, device)


# -- the training step: what an accelerator that says nothing else gets -----------


@hookimpl(trylast=True)
def optimizer_step(
    optimizer: torch.optim.Optimizer,
    closure: Callable[[], Any] | None,
    scaler: torch.amp.GradScaler | None,
) -> Any:
    return step_optimizer(optimizer, closure, scaler)


@hookimpl(trylast=True)
def clip_grad_norm_(
    parameters: list[torch.Tensor], max_norm: float, norm_type: float
) -> torch.Tensor:
    return clip_grad_norm(parameters, max_norm, norm_type)


@hookimpl(trylast=True)
def no_sync(model: torch.nn.Module, enabled: bool) -> AbstractContextManager[Any]:
    return gradient_sync_paused(model, enabled)


@hookimpl(trylast=True)
def grad_scaler(device: torch.device, options: dict[str, Any]) -> torch.amp.GradScaler:
    return torch.amp.GradScaler(device.type, **options)


@hookimpl(trylast=True)
def compile_backend() -> str:
    return "inductor"


@hookimpl(trylast=True)
def mark_step() -> None:
    return None  # an eager device has no pending graph


@hookimpl(trylast=True)
def synchronize(device: torch.device) -> None:
    """Wait through ``torch.accelerator`` where torch drives the device type; where
    there is nothing known to wait for, or the backend cannot synchronise (torch-opencl:
    "Backend doesn't support synchronizing events"), return without waiting: such a
    backend runs each operation to its end before returning, so there is nothing queued."""
    runtime = torch_accelerator(device.type)
    if runtime is not None:
        # A backend that cannot synchronise: documented in the hookspec.
        with contextlib.suppress(RuntimeError, NotImplementedError):
            runtime.synchronize(device)


@hookimpl(trylast=True)
def manual_seed(seed: int, device: torch.device) -> None:
    # The handle has called torch.manual_seed: the host, and the device types torch
    # seeds itself (CUDA, MPS, XPU, a registered privateuse1 backend).
    if torch_accelerator(device.type) is not None:
        # torch.accelerator has no seeding call; the device module's manual_seed_all
        # is torch's convention (torch.xpu, torch.mtia, an out-of-tree torch.npu).
        seed_all = getattr(getattr(torch, device.type, None), "manual_seed_all", None)
        if callable(seed_all):
            seed_all(seed)


@hookimpl(trylast=True)
def autocast(
    accelerator: str, device: torch.device, dtype: torch.dtype | None
) -> AbstractContextManager[Any]:
    try:
        default = torch.get_autocast_dtype(device.type)
    except RuntimeError:
        raise PluginError(
            f"torch cannot autocast on device type {device.type!r} (accelerator "
            f"{accelerator!r}); its plugin must implement the autocast hook"
        ) from None
    # torch checks the rest when the block starts; the common types are known to be fine.
    supported: tuple[torch.dtype, ...] = (default,) if dtype is None else (dtype,)
    if device.type == torch._C._get_privateuse1_backend_name():
        supported = backend_amp_dtypes(accelerator, device.type)  # torch asks the module
    return autocast_to(accelerator, device, dtype, default=default, supported=supported)


@hookimpl(trylast=True)
def memory_stats(device: torch.device) -> MemoryStats:
    runtime = torch_accelerator(device.type)
    if runtime is None:
        return unknown()

    def ask(name: str, pick: Callable[[Any], Any] = lambda answer: answer) -> int | None:
        # Not every torch has every call (get_memory_info: torch 2.10+), and a backend
        # may not count (torch raises NotImplementedError): that figure is unknown.
        call = getattr(runtime, name, None)
        if call is None:
            return None
        try:
            return int(pick(call(device)))
        except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError):
            return None

    return MemoryStats(
        allocated_bytes=ask("memory_allocated"),
        peak_allocated_bytes=ask("max_memory_allocated"),
        total_bytes=ask("get_memory_info", lambda free_total: free_total[1]),
    )


@hookimpl(trylast=True)
def device_loader(loader: Iterable[Any], move: Callable[[Any], Any]) -> Iterable[Any]:
    return MovingLoader(loader, move)


@hookimpl(trylast=True)
def state_dict(model: torch.nn.Module) -> dict[str, Any]:
    return cpu_state_dict(model)


@hookimpl(trylast=True)
def save(obj: Any, path: str | os.PathLike[str]) -> None:
    save_on_main_process(obj, path)


@hookimpl(trylast=True)
def load(path: str | os.PathLike[str]) -> Any:
    return load_checkpoint(path)


@hookimpl(trylast=True)
def restore_to_device(tensors: list[torch.Tensor], device: torch.device) -> Any:
    # Only for a device that refuses to copy a host tensor into one of its own in place
    # (nntile): load_state_dict's copy_ then copies between two device tensors.
    if copies_host_tensors_in_place(device):
        return None  # load_state_dict copies each host tensor into place
    return [tensor.to(device) for tensor in tensors]


@hookimpl(trylast=True)
def rng_state(device: torch.device) -> Any:
    module = None if device.type == "cpu" else device_generators_of(device.type)
    states: list[Any] = []  # none of the host's: accel stores its generator apart
    if module is not None:
        read_all = getattr(module, "get_rng_state_all", None)
        states = list(read_all()) if read_all else [module.get_rng_state()]
    return {"type": device.type, "states": states}


@hookimpl(trylast=True)
def set_rng_state(accelerator: str, state: Any, device: torch.device) -> None:
    if not isinstance(state, dict) or state.get("type") != device.type:
        found = state.get("type") if isinstance(state, dict) else type(state).__name__
        raise AcceleratorValueError(
            f"set_rng_state: the device generator state is from {found!r}, but accelerator "
            f"{accelerator!r} runs on {device.type!r}; resume on the accelerator that "
            f"saved it, or leave the 'device' entry out (the device draws then differ)"
        )
    module = device_generators_of(device.type)
    states = state.get("states") or []
    if module is not None and states:
        if hasattr(module, "set_rng_state_all"):
            module.set_rng_state_all(states)
        else:
            module.set_rng_state(states[0])


def torch_accelerator(device_type: str) -> Any:
    """``torch.accelerator`` when ``device_type`` is the accelerator it reports, else
    ``None``. Never for ``cpu`` or ``cuda``: asking CUDA's count may initialise it."""
    if device_type in ("cpu", "cuda", "meta"):
        return None
    # Compile-time answer: no runtime probe, no fork poisoning (torch's own note).
    reported = torch.accelerator.current_accelerator()
    if reported is None or reported.type != device_type:
        return None
    return torch.accelerator
