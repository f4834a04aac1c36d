"""Which :mod:`torch.distributed` backend carries which device's tensors, and the
in-memory store a world of one process meets in.

A backend string is a plain name (``"nccl"``) or a map by device type
(``"cpu:gloo,cuda:nccl"``), as :func:`torch.distributed.init_process_group` takes it.
What a plain name carries is torch's own table
(:attr:`torch.distributed.Backend.backend_capability`); a name torch does not know
(a plugin's ``"hccl"``) is trusted to carry its accelerator's device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

if TYPE_CHECKING:
    from accel.accelerator import Accelerator

__all__ = ["backend_for_device", "device_backends", "group_backend", "memory_store"]


def device_backends(backend: str, device_type: str) -> dict[str, str]:
    """``{device type: backend name}`` for ``backend``, as torch would read it.

    :param device_type: the accelerator's device type, assumed carried by a plain
        backend name torch has no capability entry for.
    """

    if ":" in backend:
        pairs = (part.split(":", 1) for part in backend.split(",") if part.strip())
        return {device.strip().lower(): name.strip().lower() for device, name in pairs}
    name = backend.strip().lower()
    devices = dist.Backend.backend_capability.get(name, [device_type])
    return dict.fromkeys(devices, name)


def backend_for_device(backend: str, device_type: str) -> str | None:
    """The backend in ``backend`` that runs collectives on ``device_type`` tensors,
    or ``None`` when none does (gloo has no MPS tensors)."""
    return device_backends(backend, device_type).get(device_type)


def group_backend(acc: Accelerator) -> str:
    """The backend string to start ``acc``'s process group with.

    A device backend torch itself maps to the device (``nccl`` for ``cuda``, ``xccl``
    for ``xpu``) gets gloo for CPU tensors beside it, ``"cpu:gloo,cuda:nccl"``: the
    group torch starts when asked for no backend, so that CPU collectives (a metric,
    an object broadcast) work on a GPU job too. Anything else is used as declared.
    """

    declared = acc.distributed_backend
    device_type = acc.device.type
    if ":" in declared or declared in ("gloo", "xla") or device_type == "cpu":
        return declared
    if dist.Backend.default_device_backend_map.get(device_type) != declared:
        return declared
    return f"cpu:gloo,{device_type}:{declared}"


def memory_store() -> Any:
    """An in-memory rendezvous store, for a world of one process: no port to collide."""

    # torch re-exports HashStore from its C extension without declaring it in __all__.
    return dist.HashStore()  # type: ignore[attr-defined]
