"""The built-in accelerator plugins.

Each is an ordinary plugin, registered through the same hooks a third-party
plugin uses; the registry imports this package only on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from accel.plugins.cpu import CpuPlugin
from accel.plugins.gpu import CudaPlugin, MpsPlugin
from accel.plugins.tpu import TpuPlugin

__all__ = ["CpuPlugin", "CudaPlugin", "MpsPlugin", "TpuPlugin"]

#: (plugin name, factory) for every built-in, in registration order.
BUILTIN_PLUGINS: Final[tuple[tuple[str, Callable[[], object]], ...]] = (
    ("cpu", CpuPlugin),
    ("cuda", CudaPlugin),
    ("mps", MpsPlugin),
    ("tpu", TpuPlugin),
)
