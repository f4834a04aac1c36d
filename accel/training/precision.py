"""Mixed precision: which low-precision types each accelerator can autocast to.

``torch.autocast`` handed a type the device cannot use only *warns* and runs the
block in full precision, so a mistake shows up as a slow run, not an error. accel
checks first and refuses with a message that says what the device supports.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

import torch

from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = ["autocast_to"]


def autocast_to(
    accelerator: str,
    device: torch.device,
    dtype: torch.dtype | None,
    *,
    default: torch.dtype,
    supported: Iterable[torch.dtype],
    why: str = "",
) -> AbstractContextManager[Any]:
    """The ``autocast`` hook in one call: ``dtype`` (or ``default``) checked against
    ``supported``, then :func:`torch_autocast`. Example::

        @accel.hookimpl
        def autocast(accelerator, device, dtype):
            return autocast_to(accelerator, device, dtype, default=torch.bfloat16,
                               supported=(torch.bfloat16, torch.float16))
    """
    chosen = checked_autocast_dtype(
        accelerator, dtype, default=default, supported=supported, why=why
    )
    return torch_autocast(accelerator, device, chosen)


def backend_amp_dtypes(accelerator: str, device_type: str) -> tuple[torch.dtype, ...]:
    """The dtypes a PrivateUse1 backend's device module says autocast supports; torch's
    autocast needs its ``get_amp_supported_dtype``, so without it, a clear refusal."""
    module = getattr(torch, device_type, None)
    supported = getattr(module, "get_amp_supported_dtype", None)
    if not callable(supported):
        raise AcceleratorValueError(
            f"accelerator {accelerator!r} cannot autocast: its backend's module "
            f"torch.{device_type} has no get_amp_supported_dtype(), which torch.autocast "
            f"needs. Train in full precision (leave autocast out), or ask the backend's "
            f"authors to add it"
        )
    return tuple(supported())


#: The two 16-bit floating-point types autocast runs in.
HALVES: Final = (torch.bfloat16, torch.float16)


def bfloat16_autocast(
    accelerator: str, device: torch.device, dtype: torch.dtype | None
) -> AbstractContextManager[Any]:
    """:func:`autocast_to` for devices that prefer bfloat16 and take float16 too (the
    CPU and TPUs)."""
    return autocast_to(accelerator, device, dtype, default=torch.bfloat16, supported=HALVES)


def checked_autocast_dtype(
    accelerator: str,
    dtype: torch.dtype | None,
    *,
    default: torch.dtype,
    supported: Iterable[torch.dtype],
    why: str = "",
) -> torch.dtype:
    """``dtype``, or ``default`` when it is ``None``; a clear error if unsupported.

    :param why: said after the list of supported types, e.g. why bfloat16 is missing.
    :raises TypeError: ``dtype`` is not a :class:`torch.dtype`.
    :raises ValueError: the accelerator cannot autocast to ``dtype``.
    """

    chosen = default if dtype is None else dtype
    if not isinstance(chosen, torch.dtype):
        raise AcceleratorTypeError(
            f"autocast(dtype=...) expects a torch.dtype such as torch.bfloat16, got "
            f"{type(chosen).__name__} ({chosen!r})"
        )
    allowed = tuple(supported)
    if chosen not in allowed:
        names = ", ".join(str(item) for item in allowed) or "none"
        raise AcceleratorValueError(
            f"accelerator {accelerator!r} cannot autocast to {chosen}; it supports: "
            f"{names}{why}. Pass one of those as dtype=, or leave dtype out for "
            f"{default}."
        )
    return chosen


def torch_autocast(
    accelerator: str, device: torch.device, dtype: torch.dtype
) -> AbstractContextManager[Any]:
    """``torch.autocast`` for ``device``'s type with ``dtype``.

    :raises ValueError: torch refused ``dtype`` for this device type, where it would
        otherwise only warn and run the block in full precision.
    """

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            context = torch.autocast(device_type=device.type, dtype=dtype)
        except RuntimeError as exc:  # e.g. bfloat16 on a GPU without it
            raise AcceleratorValueError(
                f"accelerator {accelerator!r} cannot autocast to {dtype}: {exc}"
            ) from None
    if not getattr(context, "_enabled", True):
        said = "; ".join(str(warning.message) for warning in caught) or "autocast disabled"
        raise AcceleratorValueError(
            f"accelerator {accelerator!r} cannot autocast to {dtype} on device type "
            f"{device.type!r} (torch: {said}). Pass another dtype=, or leave it out for "
            f"the accelerator's default."
        )
    for warning in caught:  # anything else torch said still reaches the user
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return context


# The short names training configurations use (nanoGPT's, Accelerate's mixed_precision).
_SHORT_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def requested_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``dtype`` as a :class:`torch.dtype`: a string names one (``"float32"``,
    ``"bfloat16"``, or the short ``"fp32"``, ``"bf16"``, ``"fp16"``), so a loop's
    configuration can hold it as text.

    :raises TypeError: neither a dtype, ``None``, nor the name of a torch dtype.
    """

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        named = getattr(torch, _SHORT_NAMES.get(name, name), None)
        if isinstance(named, torch.dtype):
            return named
        raise AcceleratorTypeError(
            f"autocast(dtype={dtype!r}): torch has no dtype of that name; pass a "
            f"torch.dtype such as torch.bfloat16, or a name: 'bfloat16' ('bf16'), "
            f"'float16' ('fp16'), 'float32' ('fp32')"
        )
    raise AcceleratorTypeError(
        f"autocast(dtype=...) expects a torch.dtype such as torch.bfloat16, got "
        f"{type(dtype).__name__} ({dtype!r})"
    )


def checked_autocast_arguments(
    dtype: torch.dtype | str | None, enabled: object
) -> torch.dtype | None:
    """:func:`requested_dtype` of ``dtype``, once ``enabled`` is known to be a bool.

    :raises TypeError: ``dtype`` names no torch dtype, or ``enabled`` is not a bool.
    """
    chosen = requested_dtype(dtype)
    if not isinstance(enabled, bool):
        raise AcceleratorTypeError(
            f"autocast(enabled=...) expects a bool, got {type(enabled).__name__}"
        )
    return chosen


def full_precision(device: torch.device) -> AbstractContextManager[Any]:
    """A block in full precision (float32) on ``device``, also inside an enclosing
    ``autocast`` block: ``torch.autocast(enabled=False)`` for the device's type.

    A device type torch cannot autocast at all (a third-party backend without AMP
    support, ``meta``) computes in full precision anyway: a context that does nothing.
    """

    with warnings.catch_warnings():
        # torch warns about a device type it cannot autocast even when told not to.
        warnings.simplefilter("ignore")
        try:
            return torch.autocast(device_type=device.type, enabled=False)
        except (RuntimeError, AssertionError):
            return nullcontext()
