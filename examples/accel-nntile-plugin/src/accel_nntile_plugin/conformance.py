"""What the nntile device under torch-nntile 0.1.0 cannot do, for accel's conformance
kit: ``accel conformance nntile --limits accel_nntile_plugin.conformance:LIMITS``.

Each reason is what the backend lacks (found by running the kit without it); every
promise not named here must hold on the device.
"""

from __future__ import annotations

from accel.testing.conformance import Limits

__all__ = ["LIMITS"]

LIMITS = Limits(
    random="torch-nntile has no random kernels (uniform_, normal_) and no device generator",
    autocast="nntile tensors are float32 or int64: no half precision to autocast to",
    distributed="gloo carries no nntile tensors and torch-nntile has no collective library",
)
