"""The ``tpu`` accelerator (alias ``xla``), on torch_xla's PJRT runtime.

torch_xla is imported only when this accelerator is probed *and* the process is
configured for it (``PJRT_DEVICE`` set, or TPU hardware present): importing it
sets ``PJRT_DEVICE`` for the whole process as a side effect, and on a
misconfigured host it can wait on cloud metadata for a long time.

Asked for by name, ``tpu`` runs on any configured PJRT device, so
``PJRT_DEVICE=CPU`` runs it on XLA:CPU; ``"auto"`` picks it only when the
runtime's device type really is TPU.

Moving a module to an XLA device unties its shared parameters (see
:mod:`accel.tying`); this plugin alone re-ties and validates them.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import warnings
from typing import TYPE_CHECKING, Final

from accel.errors import WeightTyingError
from accel.markers import hookimpl
from accel.plugins._xla_training import XlaTrainingHooks
from accel.tying import TyingSnapshot, empty_duplicate_slots, format_tie_failure
from accel.types import AcceleratorSpec, Availability, MoveContext

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["TpuPlugin", "TyingWarning"]

_INSTALL: Final = "pip install 'accel[tpu]' (torch_xla matching your torch version)"
# PJRT device types torch_xla knows; anything else is a typo we can report early.
_PJRT_DEVICES: Final = frozenset({"CPU", "TPU", "CUDA", "GPU", "NEURON", "XPU"})
_NOTES_KEY: Final = "accel.tpu.tying"


class TyingWarning(UserWarning):
    """Tied weights came apart in a move and ``tie_check="warn"`` was chosen."""


def tpu_hardware_present() -> bool:
    """TPU chips are visible to this host (checked without importing torch_xla)."""
    if glob.glob("/dev/accel*"):
        return True  # TPU v2-v4 expose /dev/accelN
    # v5p / v6e expose VFIO groups; GPU passthrough hosts do too, so also ask for libtpu.
    return bool(glob.glob("/dev/vfio/[0-9]*")) and importlib.util.find_spec("libtpu") is not None


def probe_xla() -> Availability:
    """Whether torch_xla can be used here, importing it only when configured."""
    if importlib.util.find_spec("torch_xla") is None:
        return Availability(False, reason="torch_xla is not installed", remedy=_INSTALL)
    pjrt_device = os.environ.get("PJRT_DEVICE", "").strip()
    on_tpu_host = tpu_hardware_present()
    if not pjrt_device and not on_tpu_host:
        return Availability(
            False,
            reason="PJRT_DEVICE is not set and no TPU hardware was found",
            remedy="run on a TPU host, or set PJRT_DEVICE=CPU to use XLA on the CPU",
        )
    device_type = pjrt_device.upper().split("_")[0]
    if pjrt_device and device_type not in _PJRT_DEVICES:
        return Availability(
            False,
            reason=f"PJRT_DEVICE={pjrt_device!r} is not a PJRT device type torch_xla knows",
            remedy=f"set PJRT_DEVICE to one of {', '.join(sorted(_PJRT_DEVICES))}",
        )
    if device_type == "TPU" and not on_tpu_host:
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
            remedy=_INSTALL,
        )
    runtime_type = str(xr.device_type() or device_type or "TPU").upper()
    return Availability(
        True,
        reason=f"PJRT device type {runtime_type}",
        auto=runtime_type == "TPU",
    )


class TpuPlugin(XlaTrainingHooks):
    """Google TPUs (and any PJRT device) through torch_xla."""

    @hookimpl
    def register_accelerators(self) -> list[AcceleratorSpec]:
        return [
            AcceleratorSpec(
                "tpu",
                aliases=("xla",),
                priority=200,
                description="Google TPUs via torch_xla (PJRT)",
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

    # trylast / tryfirst: other plugins' hooks see the model whole, before it is
    # hollowed out for the move and after it is re-tied.
    @hookimpl(trylast=True)
    def pre_move_hook(self, model: nn.Module, context: MoveContext) -> None:
        snapshot = TyingSnapshot.capture(model)
        context.notes[_NOTES_KEY] = snapshot
        # Each shared tensor then crosses to the device once, not once per slot: on a
        # GPT-2-sized model that is the difference between matching a bare move and
        # copying the embedding twice. A failed move restores the slots.
        empty_duplicate_slots(list(snapshot.groups))

    @hookimpl(tryfirst=True)
    def post_move_hook(self, model: nn.Module, device: torch.device, context: MoveContext) -> None:
        snapshot: TyingSnapshot = context.notes[_NOTES_KEY]
        snapshot.retie()
        tie_weights = getattr(model, "tie_weights", None)
        if callable(tie_weights):
            tie_weights()  # the model has the last word on its own ties
        if context.tie_check == "off":
            return
        report = snapshot.check(model)
        if report.ok:
            return
        message = format_tie_failure(report, device)
        if context.tie_check == "warn":
            warnings.warn(message, TyingWarning, stacklevel=2)
            return
        raise WeightTyingError(
            message,
            count_before=report.count_before,
            count_after=report.count_after,
            broken_groups=[group.names for group in report.broken],
        )
