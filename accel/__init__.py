"""accel: a pluggy-based accelerator abstraction layer for PyTorch.

>>> import accel
>>> acc = accel.get_accelerator("cpu")
>>> acc.device
device(type='cpu')

Importing accel is cheap and has no side effects: no plugin is loaded, neither
torch nor torch_xla is imported, and even accel's own modules (and pluggy) load
only when a name that needs them is first used.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from accel._util.lazy import lazy_names

# The errors that mirror a built-in (AcceleratorValueError is a ValueError, ...) are
# public in accel.errors alone: a caller catches the built-in. They stay reachable here
# (noqa), outside __all__, until the code that still spells them accel.AcceleratorValueError
# (the test suite) names accel.errors.
from accel.errors import (
    AcceleratorError,
    AcceleratorFileExistsError,  # noqa: F401
    AcceleratorFileNotFoundError,  # noqa: F401
    AcceleratorKeyError,  # noqa: F401
    AcceleratorNotFoundError,
    AcceleratorOSError,  # noqa: F401
    AcceleratorRuntimeError,  # noqa: F401
    AcceleratorTypeError,  # noqa: F401
    AcceleratorUnavailableError,
    AcceleratorValueError,  # noqa: F401
    PluginError,
    PluginWarning,
    TyingWarning,
    WeightTyingError,
)

if TYPE_CHECKING:
    from accel.accelerator import Accelerator
    from accel.markers import hookimpl, hookspec
    from accel.registry import AcceleratorRegistry
    from accel.types import (
        AcceleratorInfo,
        AcceleratorSpec,
        Availability,
        MemoryStats,
        MoveContext,
        PluginFailure,
        TieCheck,
    )

__version__ = "0.1.0.dev0"

__all__ = [
    "Accelerator",
    "AcceleratorError",
    "AcceleratorInfo",
    "AcceleratorNotFoundError",
    "AcceleratorRegistry",
    "AcceleratorSpec",
    "AcceleratorUnavailableError",
    "Availability",
    "MemoryStats",
    "MoveContext",
    "PluginError",
    "PluginFailure",
    "PluginWarning",
    "TieCheck",
    "TyingWarning",
    "WeightTyingError",
    "__version__",
    "default_registry",
    "get_accelerator",
    "hookimpl",
    "hookspec",
    "list_accelerators",
]

# Public name -> the module that defines it, imported on first access (PEP 562).
_LAZY_NAMES = {
    "Accelerator": "accel.accelerator",
    "AcceleratorRegistry": "accel.registry",
    "AcceleratorInfo": "accel.types",
    "AcceleratorSpec": "accel.types",
    "Availability": "accel.types",
    "MemoryStats": "accel.types",
    "MoveContext": "accel.types",
    "PluginFailure": "accel.types",
    "TieCheck": "accel.types",
    "hookimpl": "accel.markers",
    "hookspec": "accel.markers",
}

__getattr__, __dir__ = lazy_names(globals(), _LAZY_NAMES, __all__)


_default_registry: AcceleratorRegistry | None = None
_default_registry_lock = threading.Lock()


def default_registry() -> AcceleratorRegistry:
    """The registry behind the module-level functions, created on first use.

    It loads the built-ins and the ``accel`` entry-point group. Libraries that
    want their own plugins, or none, create an :class:`AcceleratorRegistry`.
    """
    global _default_registry
    if _default_registry is None:
        with _default_registry_lock:
            if _default_registry is None:
                from accel.registry import AcceleratorRegistry

                _default_registry = AcceleratorRegistry()
    return _default_registry


def get_accelerator(
    name: str | Accelerator | None = None, *, tie_check: TieCheck = "error"
) -> Accelerator:
    """Select an accelerator from the default registry.

    See :meth:`AcceleratorRegistry.get_accelerator`: ``name`` may be a name, an
    alias, ``"name:index"`` or ``"auto"``; ``None`` reads ``$ACCEL_ACCELERATOR``. A
    handle (from any registry) is returned as it is.
    """
    from accel.accelerator import Accelerator  # torch-free until a handle is asked for

    if isinstance(name, Accelerator):
        return name
    return default_registry().get_accelerator(name, tie_check=tie_check)


def list_accelerators() -> list[AcceleratorInfo]:
    """Every accelerator of the default registry, available or not."""
    return default_registry().list_accelerators()
