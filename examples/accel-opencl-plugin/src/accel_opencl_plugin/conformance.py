"""What an OpenCL device under torch-opencl 0.1.0.dev23 cannot do, for accel's
conformance kit: ``accel conformance opencl --limits accel_opencl_plugin.conformance:LIMITS``.

Each reason is what the backend lacks (found by running the kit without it); every
promise not named here must hold on the device.
"""

from __future__ import annotations

from accel.testing.conformance import Limits

__all__ = ["LIMITS"]

LIMITS = Limits(
    forward="torch-opencl has no matmul and no strided views (as_strided needs a storage offset)",
    reductions="torch-opencl has no reduction kernels (sum, norm), so no clip_grad_norm_",
    random="torch-opencl has no random kernels (uniform_) and no device generator",
    autocast="torch-opencl registers no AMP support (torch.autocast refuses the device type)",
    distributed="gloo carries no opencl tensors and torch-opencl has no collective library",
)
