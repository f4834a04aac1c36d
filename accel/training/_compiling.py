"""The ``torch.compile`` backend that runs on the device: inductor where it generates
code for the device type, else a backend that traces and runs the device's own kernels.

Inductor generates code only for the device types it has a backend registered for
(``torch._inductor.codegen.common.register_backend_for_device``); on any other device
(a PrivateUse1 backend such as nntile or opencl) compiling fails at the first call
with ``KeyError: '<device type>'``. Such a device still runs a model's forward and
backward passes eagerly, so a loop written once with ``acc.compile`` runs there with
``aot_eager``: dynamo and AOTAutograd trace forward and backward into graphs, and the
graphs run on the device's own kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from accel._util.warn import warn_at_caller
from accel.errors import AcceleratorTypeError, PluginWarning

if TYPE_CHECKING:
    import torch

__all__ = ["FALLBACK_BACKEND", "inductor_generates_code_for", "runnable_backend"]

#: The backend compiled models run with where inductor has no backend for the device.
FALLBACK_BACKEND = "aot_eager"

# Device types inductor generates code for in every torch accel supports (2.9 on:
# torch._inductor.codegen.common.init_backend_registration). Asking inductor imports
# it (seconds), so these never ask. Inductor keeps meta tensors out of its kernels.
_BUILT_IN = frozenset({"cpu", "cuda", "xpu", "mps", "mtia", "meta"})

_warned: set[str] = set()
_warned_lock = threading.Lock()


def inductor_generates_code_for(device_type: str) -> bool:
    """Whether inductor has a backend for ``device_type`` (torch's own device types,
    and any a vendor registered, also through its PrivateUse1 device module)."""
    if device_type in _BUILT_IN:
        return True
    try:
        from torch._inductor.codegen import common
    except ImportError:  # a torch built without inductor: nothing to ask, nothing to lose
        return True
    # What inductor runs first when it compiles: it registers torch's device types and
    # a PrivateUse1 backend's own (torch.<name>.Scheduling, ...), once per process.
    common.init_backend_registration()
    return common.get_scheduling_for_device(device_type) is not None


def runnable_backend(
    backend: str | Callable[..., Any], device: torch.device
) -> str | Callable[..., Any]:
    """``backend``, unless it is inductor and inductor has no backend for ``device``'s
    type: then :data:`FALLBACK_BACKEND`, said once per device type in a
    :class:`~accel.errors.PluginWarning` with what a vendor registers to get inductor."""
    if backend != "inductor" or inductor_generates_code_for(device.type):
        return backend
    with _warned_lock:
        first = device.type not in _warned
        _warned.add(device.type)
    if first:
        warn_at_caller(
            f"torch.compile's inductor has no backend for the device type "
            f"{device.type!r}, so accel compiles with {FALLBACK_BACKEND!r} there: it "
            f"traces forward and backward and runs them on the device's own kernels, "
            f"without generated code. To compile with inductor on {device.type!r}, the "
            f"device's vendor registers a backend for it with "
            f"torch._inductor.codegen.common.register_backend_for_device (or, for a "
            f"PrivateUse1 backend, a Scheduling, PythonWrapperCodegen and "
            f"CppWrapperCodegen on its device module); or its accel plugin names "
            f"another backend in its compile_backend hook. Pass backend= to "
            f"acc.compile to choose one yourself.",
            PluginWarning,
        )
    return FALLBACK_BACKEND


def checked_compile_target(model: object) -> None:
    """The handle's check of what it compiles.

    :raises TypeError: ``model`` is neither a module nor a callable.
    """
    if not callable(model):
        raise AcceleratorTypeError(
            f"compile expects a torch.nn.Module or a function, got {type(model).__name__}"
        )
