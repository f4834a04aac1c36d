"""A fake out-of-tree device, behaving as PrivateUse1 backends do, on a CPU-only torch.

Its tensors are wrapper subclasses that claim a device type torch drives no kernels
for (``privateuseone``, or another such type) and hold a CPU tensor inside. torch's
``Module.to`` cannot swap their data in place, so it gives every slot a Parameter of
its own, in both directions, as it does for ``nntile`` and ``opencl``. Like
``nntile``, the device refuses an in-place copy of a host tensor into one of its own.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

import accel

_aten = torch.ops.aten
# In-place ops: the result is the first argument itself.
_IN_PLACE = {
    name
    for name in dir(_aten)
    if name.endswith("_") and not name.startswith("_") and name != "copy_"
}


class DeviceTensor(torch.Tensor):
    """A tensor on a fake device: ``inner`` holds its values, on the CPU."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device) -> DeviceTensor:
        made: DeviceTensor = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            inner.shape,
            strides=inner.stride(),
            dtype=inner.dtype,
            device=device,
            requires_grad=inner.requires_grad,
        )
        return made

    def __init__(self, inner: torch.Tensor, device: torch.device) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # type: ignore[override]
        return f"DeviceTensor({self.inner!r}, device={self.device})"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # copy_ asks for a device guard of the device type, which no backend registered:
        # done here, before dispatch, as the backend's own copy would.
        if func is torch.Tensor.copy_ and isinstance(args[0], DeviceTensor):
            if not isinstance(args[1], DeviceTensor):
                raise RuntimeError(
                    f"fake device {args[0].device}: copying a host tensor into a device "
                    f"tensor is not supported"
                )
            with torch.no_grad():
                args[0].inner.copy_(args[1].inner)
            return args[0]
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        device = next(a.device for a in args if isinstance(a, DeviceTensor))
        target = kwargs.pop("device", None) if func is _aten._to_copy.default else None
        if func is _aten._to_copy.default and not args[0].inner.is_contiguous():
            raise RuntimeError(f"fake device {device}: only contiguous tensors move")
        result = func(*tree_map(_inner, args), **tree_map(_inner, kwargs))
        if target is not None and target.type == "cpu":
            return result
        if target is not None:
            device = target
        if func.overloadpacket.__name__ in _IN_PLACE:
            return args[0]
        return tree_map(lambda x: _wrap(x, device), result)


def _inner(value: Any) -> Any:
    return value.inner if isinstance(value, DeviceTensor) else value


def _wrap(value: Any, device: torch.device) -> Any:
    return DeviceTensor(value, device) if isinstance(value, torch.Tensor) else value


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on the fake ``device`` (from the CPU or another fake device)."""
    if tensor.device.type != "cpu" and not isinstance(tensor, DeviceTensor):
        raise ValueError(f"cannot move a tensor on {tensor.device} to {device}")
    inner = _inner(tensor).detach().clone()
    if not inner.is_contiguous():
        raise RuntimeError(f"fake device {device}: only contiguous tensors move")
    return DeviceTensor(inner, device)


def values(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values on the CPU, wherever it is."""
    return _inner(tensor.detach())


class HostMoves(TorchFunctionMode):
    """Within it, ``host_tensor.to(device)`` reaches the fake device (torch itself has
    no kernels for its type), as ``.to("nntile")`` reaches nntile."""

    def __init__(self, device_type: str = "privateuseone") -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.to and not isinstance(args[0], DeviceTensor):
            rest = [*args[1:], kwargs.get("device"), kwargs.get("dtype")]
            target = next((a for a in rest if isinstance(a, (torch.device, str))), None)
            if target is not None and torch.device(target).type == self.device_type:
                dtype = next((a for a in rest if isinstance(a, torch.dtype)), None)
                tensor = args[0] if dtype is None else args[0].to(dtype)
                return to_device(tensor, torch.device(target))
        return func(*args, **kwargs)


class UntyingDevicePlugin:
    """An accelerator on a fake device type, declaring ``unties_weights`` as every
    PrivateUse1 backend's plugin must. Its move gives every slot a Parameter of its
    own, as torch's ``Module.to`` does to and from such a device."""

    moves: ClassVar[int] = 0

    def __init__(self, name: str = "untying", device_type: str = "privateuseone") -> None:
        self.spec = accel.AcceleratorSpec(name, unties_weights=True)
        self.device_type = device_type

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [self.spec]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True, auto=False)

    @accel.hookimpl
    def device_count(self) -> int:
        return 1

    @accel.hookimpl
    def get_device(self, index: int | None) -> torch.device:
        return torch.device(self.device_type, 0 if index is None else index)

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        for module in model.modules():
            for name, parameter in list(module._parameters.items()):
                if parameter is not None:
                    moved = to_device(parameter, device)
                    module._parameters[name] = nn.Parameter(
                        moved, requires_grad=parameter.requires_grad
                    )
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    module._buffers[name] = to_device(buffer, device)
        return model
