"""PJRT device types: which ones torch_xla can run, and what each needs when it cannot.

torch_xla picks its runtime from ``PJRT_DEVICE``. A few device types are built in
(``CPU``, ``TPU`` and, for the builds or SDKs that bring them, ``CUDA``/``GPU``,
``NEURON`` and ``XPU``); any other comes from an installed PJRT plugin package, which
registers itself in the ``torch_xla.plugins`` entry-point group. Both are known here
without importing torch_xla, so a typo is caught before the runtime starts, and a
runtime that fails to start is explained in terms of what to install or set.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Final

__all__ = [
    "BUILTIN_DEVICE_TYPES",
    "PLUGIN_GROUP",
    "PjrtDevice",
    "device_remedy",
    "installed_plugin_names",
    "known_device_types",
    "missing_runtime_package",
    "runtime_start_failure",
]

#: The device types torch_xla 2.9 itself recognises in ``PJRT_DEVICE``.
BUILTIN_DEVICE_TYPES: Final = ("CPU", "TPU", "CUDA", "GPU", "NEURON", "XPU")
#: The entry-point group through which PJRT plugin packages register device types.
PLUGIN_GROUP: Final = "torch_xla.plugins"
_CUDA_REMEDY: Final = (
    "the torch_xla wheels on PyPI run CPU and TPU only: install a CUDA build of "
    "torch_xla, or a PJRT GPU plugin package (it registers the 'torch_xla.plugins' entry "
    "point 'cuda'), next to the CUDA libraries it was built for; or use "
    "accel.get_accelerator('cuda') for CUDA without XLA, or PJRT_DEVICE=CPU for XLA on "
    "the CPU"
)
# Python packages a built-in device type loads when its runtime starts.
_RUNTIME_PACKAGES: Final = {"NEURON": "libneuronxla"}
_REMEDIES: Final = {
    "CUDA": _CUDA_REMEDY,
    "GPU": _CUDA_REMEDY,
    "NEURON": "install the AWS Neuron SDK for PyTorch (torch-neuronx with libneuronxla, "
    "from Neuron's package index) on an Inferentia or Trainium host",
    "XPU": "install torch_xla's Intel XPU support (a torch_xla build with XPU, or its "
    "PJRT plugin) with Intel's GPU drivers",
    "CPU": "reinstall torch_xla with the torch it was built for (pip install 'accel-torch[tpu]')",
}


@dataclass(frozen=True)
class PjrtDevice:
    """The device type ``PJRT_DEVICE`` asks for, read the way torch_xla reads it."""

    #: The variable as set, stripped (``"cuda"``, ``"TPU_LEGACY"``).
    value: str
    #: The device type it names: up to the first ``_``, upper case. torch_xla itself
    #: compares case-sensitively (``cpu`` fails with "No PjRtPlugin registered for: cpu"),
    #: so a value not in upper case is refused (:attr:`in_upper_case`).
    device_type: str

    @classmethod
    def parse(cls, value: str) -> PjrtDevice:
        value = value.strip()
        return cls(value, value.upper().split("_")[0])

    @property
    def in_upper_case(self) -> bool:
        """Whether the device type is spelled as torch_xla needs it (``CPU``, not ``cpu``)."""
        return self.value.split("_")[0] == self.device_type

    @property
    def is_gpu(self) -> bool:
        return self.device_type in ("CUDA", "GPU")


def installed_plugin_names() -> tuple[str, ...]:
    """Device types registered by installed PJRT plugin packages, upper case (as
    torch_xla registers them), read from package metadata alone."""
    return tuple(sorted({ep.name.upper() for ep in entry_points(group=PLUGIN_GROUP)}))


def known_device_types() -> tuple[str, ...]:
    """Every device type torch_xla would accept here: the built-ins, then plugins'."""
    plugins = [name for name in installed_plugin_names() if name not in BUILTIN_DEVICE_TYPES]
    return (*BUILTIN_DEVICE_TYPES, *plugins)


def runtime_start_failure(device: PjrtDevice, exc: BaseException) -> tuple[str, str]:
    """``(reason, remedy)`` for a PJRT runtime that would not start on ``device``."""
    detail = f"{type(exc).__name__}: {exc}".splitlines()[0].split(". Make sure")[0]
    what = "XLA on CUDA GPUs" if device.is_gpu else f"the PJRT device type {device.device_type}"
    reason = (
        f"PJRT_DEVICE={device.value} asks for {what}, but torch_xla's runtime could not "
        f"start it ({detail})"
    )
    return reason, device_remedy(device)


def device_remedy(device: PjrtDevice) -> str:
    """What to install or set so that torch_xla can run on ``device``."""
    if device.device_type not in _REMEDIES and device.device_type in installed_plugin_names():
        return (
            f"the installed PJRT plugin for {device.device_type} failed to start: check its "
            f"package and the device's drivers, or set PJRT_DEVICE=CPU for XLA on the CPU"
        )
    return _REMEDIES.get(
        device.device_type,
        f"install the PJRT plugin package for {device.device_type}, or set "
        f"PJRT_DEVICE to one of {', '.join(known_device_types())}",
    )


def missing_runtime_package(device: PjrtDevice) -> str | None:
    """The package ``device``'s runtime would import and cannot, found without
    starting it (a failed start cannot always be retried in the same process)."""
    package = _RUNTIME_PACKAGES.get(device.device_type)
    if package is not None and importlib.util.find_spec(package) is None:
        return package
    return None
