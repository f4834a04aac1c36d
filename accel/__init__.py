"""accel: a pluggy-based accelerator abstraction layer for PyTorch.

>>> import accel
>>> acc = accel.get_accelerator("cpu")
>>> acc.device
device(type='cpu')

Importing accel is cheap and has no side effects: no plugin is loaded and neither
torch nor torch_xla is imported until something needs them.
"""

from __future__ import annotations

import threading

from accel.accelerator import Accelerator
from accel.errors import (
    AcceleratorError,
    AcceleratorNotFoundError,
    AcceleratorUnavailableError,
    PluginError,
    PluginWarning,
    WeightTyingError,
)
from accel.markers import hookimpl, hookspec
from accel.registry import AcceleratorRegistry
from accel.types import (
    AcceleratorInfo,
    AcceleratorSpec,
    Availability,
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
    "MoveContext",
    "PluginError",
    "PluginFailure",
    "PluginWarning",
    "TieCheck",
    "WeightTyingError",
    "__version__",
    "default_registry",
    "get_accelerator",
    "hookimpl",
    "hookspec",
    "list_accelerators",
]

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
                _default_registry = AcceleratorRegistry()
    return _default_registry


def get_accelerator(name: str | None = None, *, tie_check: TieCheck = "error") -> Accelerator:
    """Select an accelerator from the default registry.

    See :meth:`AcceleratorRegistry.get_accelerator`: ``name`` may be a name, an
    alias, ``"name:index"`` or ``"auto"``; ``None`` reads ``$ACCEL_ACCELERATOR``.
    """
    return default_registry().get_accelerator(name, tie_check=tie_check)


def list_accelerators() -> list[AcceleratorInfo]:
    """Every accelerator of the default registry, available or not."""
    return default_registry().list_accelerators()
