"""The ``tpu`` accelerator (alias ``xla``), on torch_xla's PJRT runtime.

Where TorchTPU is loaded (its PrivateUse1 backend is named ``tpu``), ``tpu`` is
TorchTPU's, an accelerator without a plugin (:mod:`accel.plugins.torch_device`), and
this one answers to ``xla`` alone.

torch_xla is imported only when this accelerator is probed *and* the process is
configured for it (``PJRT_DEVICE`` set, or TPU hardware present): importing it
sets ``PJRT_DEVICE`` for the whole process as a side effect, and on a
misconfigured host it can wait on cloud metadata for a long time.

Asked for by name, ``tpu`` runs on any configured PJRT device, so
``PJRT_DEVICE=CPU`` runs it on XLA:CPU; ``"auto"`` picks it only when the
runtime's device type really is TPU.

Moving a module to or from an XLA device unties its shared parameters; torch's own
rule says so (docs/tpu.md), and every such move, to ``tpu`` or leaving XLA through
another accelerator, keeps the ties of before: accel's move applies the rule
(docs/architecture.md), :mod:`accel.tying` holds the logic.
:class:`accel.plugins.TpuPlugin` also declares ``unties_weights=True``, which only
confirms what the rule measures.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import TYPE_CHECKING

import torch

import accel.plugins._xla_versions as _xla_versions
from accel.markers import hookimpl
from accel.plugins._pjrt import (
    PjrtDevice,
    device_remedy,
    known_device_types,
    missing_runtime_package,
    runtime_start_failure,
)
from accel.plugins._xla_training import XlaTrainingHooks
from accel.types import AcceleratorSpec, Availability

if TYPE_CHECKING:
    import torch

__all__: list[str] = []  # TpuPlugin is public in accel.plugins


def torchtpu_loaded() -> bool:
    """TorchTPU (``torch-tpu``) has renamed PrivateUse1 to ``tpu`` in this process: it
    then answers to ``tpu``, and torch_xla to ``xla`` alone. A name, not a probe."""
    return bool(torch._C._get_privateuse1_backend_name() == "tpu")


def tpu_hardware_present() -> bool:
    """TPU chips are visible to this host (checked without importing torch_xla)."""
    if glob.glob("/dev/accel*"):
        return True  # TPU v2-v4 expose /dev/accelN
    # v5p / v6e expose VFIO groups; GPU passthrough hosts do too, so also ask for libtpu.
    return bool(glob.glob("/dev/vfio/[0-9]*")) and importlib.util.find_spec("libtpu") is not None


def probe_xla() -> Availability:
    """Whether torch_xla can be used here, importing it only when configured.

    The runtime is started here too (once per process, as the first device count
    would), so a device type torch_xla cannot start (``PJRT_DEVICE=CUDA`` without a
    CUDA build or plugin) is reported as unavailable, with what to install or set,
    instead of failing later with torch_xla's own error.
    """
    pjrt = PjrtDevice.parse(os.environ.get("PJRT_DEVICE", ""))
    if pjrt.value and pjrt.device_type not in known_device_types():
        return Availability(
            False,
            reason=f"PJRT_DEVICE={pjrt.value!r} is not a PJRT device type torch_xla knows",
            remedy=f"set PJRT_DEVICE to one of {', '.join(known_device_types())} (the last "
            f"ones come from installed PJRT plugins), or unset it",
        )
    if importlib.util.find_spec("torch_xla") is None:
        remedy = _xla_versions.install_torch_xla_remedy()
        if pjrt.is_gpu:
            remedy += f"; for XLA on CUDA GPUs, then: {device_remedy(pjrt)}"
        return Availability(False, reason="torch_xla is not installed", remedy=remedy)
    if pjrt.value and not pjrt.in_upper_case:
        # torch_xla would refuse it only at its runtime start, with no remedy.
        return Availability(
            False,
            reason=f"PJRT_DEVICE={pjrt.value!r} is not in upper case, and torch_xla reads "
            f"device types case-sensitively (it would fail: No PjRtPlugin registered for: "
            f"{pjrt.value.split('_')[0]})",
            remedy=f"set PJRT_DEVICE={pjrt.value.upper()} (upper case)",
        )
    # A torch_xla built for another torch fails to import, or crashes: say so first.
    mismatch = _xla_versions.find_torch_xla_mismatch()
    if mismatch is not None:
        return Availability(False, reason=mismatch.reason, remedy=mismatch.remedy)
    on_tpu_host = tpu_hardware_present()
    if not pjrt.value and not on_tpu_host:
        return Availability(
            False,
            reason="PJRT_DEVICE is not set and no TPU hardware was found",
            remedy="run on a TPU host, or set PJRT_DEVICE=CPU to use XLA on the CPU",
        )
    missing = missing_runtime_package(pjrt)
    if missing is not None:
        return Availability(
            False,
            reason=f"PJRT_DEVICE={pjrt.value} needs the {missing!r} package, which is not "
            f"installed",
            remedy=device_remedy(pjrt),
        )
    if pjrt.device_type == "TPU" and not on_tpu_host:
        # Initialising a TPU runtime without chips waits on cloud metadata; say no now.
        return Availability(
            False,
            reason="PJRT_DEVICE=TPU but no TPU hardware was found on this host",
            remedy="run on a TPU host, or set PJRT_DEVICE=CPU to use XLA on the CPU",
        )
    try:
        import torch_xla  # noqa: F401
        import torch_xla.runtime as xr
    except Exception as exc:
        return Availability(
            False,
            reason=f"importing torch_xla failed: {type(exc).__name__}: {exc}".splitlines()[0],
            remedy=_xla_versions.reinstall_torch_xla_remedy(),
        )
    runtime = PjrtDevice.parse(str(xr.device_type() or pjrt.value or "TPU"))
    failure = _runtime_failures.get(runtime.value)
    if failure is None:
        try:
            xr.addressable_runtime_device_count()  # starts the runtime, once per process
        except Exception as exc:
            failure = _runtime_failures[runtime.value] = runtime_start_failure(runtime, exc)
    if failure is not None:
        return Availability(False, reason=failure[0], remedy=failure[1])
    return Availability(
        True,
        reason=f"PJRT device type {runtime.device_type}",
        auto=runtime.device_type == "TPU",
    )


# A PJRT runtime that failed to start is never started again in this process: a second
# attempt can abort the interpreter (torch_xla 2.9 with PJRT_DEVICE=NEURON does).
_runtime_failures: dict[str, tuple[str, str]] = {}


class TpuPlugin(XlaTrainingHooks):
    """Google TPUs (and any PJRT device) through torch_xla."""

    @hookimpl
    def register_accelerators(self) -> list[AcceleratorSpec]:
        if torchtpu_loaded():  # TorchTPU's device type is "tpu": the name follows the TPU
            return [
                AcceleratorSpec(
                    "xla",
                    priority=200,
                    description="TPUs and other PJRT devices via torch_xla ('tpu' is TorchTPU)",
                    unties_weights=True,
                )
            ]
        return [
            AcceleratorSpec(
                "tpu",
                aliases=("xla",),
                priority=200,
                description="Google TPUs via torch_xla (PJRT)",
                # torch's rule says so anyway; declared for readers and older accel.
                unties_weights=True,
            )
        ]

    @hookimpl
    def is_available(self) -> Availability:
        return probe_xla()

    @hookimpl
    def device_count(self) -> int:
        import torch_xla.runtime as xr

        return int(xr.addressable_runtime_device_count())

    @hookimpl
    def get_device(self, index: int | None) -> torch.device:
        import torch_xla

        device: torch.device = torch_xla.device(index)
        return device

    @hookimpl
    def distributed_backend(self) -> str:
        return "xla"
