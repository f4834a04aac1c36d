"""The built-in accelerator plugins.

Each is an ordinary plugin, registered through the same hooks a third-party
plugin uses; the registry imports this package only on first use. All but the
last declare an accelerator; the last is the TPU plugin's cross-cutting companion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from accel.plugins.cpu import CpuPlugin
from accel.plugins.gpu import CudaPlugin, MpsPlugin
from accel.plugins.tpu import TieGuardPlugin, TpuPlugin

__all__ = ["CpuPlugin", "CudaPlugin", "MpsPlugin", "TieGuardPlugin", "TpuPlugin"]

#: (plugin name, factory) for every built-in, in registration order.
BUILTIN_PLUGINS: Final[tuple[tuple[str, Callable[[], object]], ...]] = (
    ("cpu", CpuPlugin),
    ("cuda", CudaPlugin),
    ("mps", MpsPlugin),
    ("tpu", TpuPlugin),
    # Cross-cutting: keeps ties on other accelerators' moves that can untie them,
    # such as a model leaving XLA for the CPU (see accel.plugins.tpu).
    ("tpu-tie-guard", TieGuardPlugin),
)
