"""A real PrivateUse1 backend written in Python, for a process of its own.

Unlike tests/helpers/untying_device.py (wrapper tensors that intercept every call
before dispatch), these are plain tensors of the PrivateUse1 dispatch key: torch
dispatches to them as it does to nntile or opencl, so dynamo, AOTAutograd and
inductor see a device type torch has kernels for and inductor has no backend for.
Every operation runs on a CPU tensor held for the device tensor (one boxed fallback
kernel for the whole dispatch key).

:func:`install` renames the PrivateUse1 backend and registers its device module, both
once per process and for good (and ``torch.accelerator`` reports it from then on), so
only a child process calls it (``helpers.processes.run_python``). It needs torch's
Python backend support (``_setup_privateuseone_for_python_backend``; torch 2.9 has none):
:func:`supported` says whether this torch has it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

_aten = torch.ops.aten
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_COPIES = (_aten._copy_from.default, _aten._copy_from_and_resize.default)

# Each device tensor's storage (holding no bytes) -> (that storage, the CPU tensor with
# its values). Keyed by the storage so that every alias torch makes without a kernel
# (a Parameter of it, .data) finds the same values; the storage is kept so the key is
# never reused. A test process is short-lived: nothing is ever freed.
_values: dict[int, tuple[torch.UntypedStorage, torch.Tensor]] = {}
_name = "privateuseone"
_libraries: list[torch.library.Library] = []  # a dropped Library deregisters its kernels


def supported() -> bool:
    """Whether this torch can register a PrivateUse1 backend from Python."""
    import torch.utils.backend_registration as registration

    return hasattr(registration, "_setup_privateuseone_for_python_backend")


def install(name: str) -> None:
    """Make ``name`` a device type of this process, its kernels torch's CPU kernels."""
    global _name
    from torch.utils.backend_registration import (  # type: ignore[attr-defined]
        _setup_privateuseone_for_python_backend,
    )

    _setup_privateuseone_for_python_backend(name)
    _name = name
    library = torch.library.Library("_", "IMPL")
    library.fallback(_kernel, "PrivateUse1")
    _libraries.append(library)


def _wrap(values: torch.Tensor) -> torch.Tensor:
    empty = torch._C._acc.create_empty_tensor(values.shape, values.dtype)
    # The device tensor reports the layout of its values (a transposed view is
    # transposed here too): AOTAutograd restrides outputs by what it traced.
    tensor: torch.Tensor = _aten.as_strided.default.redispatch(
        _META, empty, values.shape, values.stride(), values.storage_offset()
    )
    storage = tensor.untyped_storage()
    _values[storage._cdata] = (storage, values)
    return tensor


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == _name


def _unwrap(value: Any) -> Any:
    return _values[value.untyped_storage()._cdata][1] if _on_device(value) else value


def _host(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == _name:
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == _name:
        return "cpu"
    return _unwrap(value)


def _kernel(op: Any, *args: Any, **kwargs: Any) -> Any:
    if op in _COPIES:  # copy_ into or out of the device: (source, destination)
        source, destination = args[0], args[1]
        target = _unwrap(destination)
        if op is _aten._copy_from_and_resize.default:
            target.resize_(source.shape)
        target.copy_(_unwrap(source))
        return destination
    result = op(*tree_map(_host, args), **tree_map(_host, kwargs))
    leaving = kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu"
    if op is _aten._to_copy.default and leaving:
        return result
    inputs = [a for a in args if _on_device(a)]

    def back(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        # An in-place op returns its input: the same device tensor, not a new one.
        same = next((a for a in inputs if _unwrap(a) is value), None)
        return same if same is not None else _wrap(value)

    return tree_map(back, result)
