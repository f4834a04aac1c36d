"""The random generators a training run draws from, as one storable value.

A resumed run draws the same dropout masks and the same data order as the
uninterrupted one only if every generator it uses continues where it stopped:
Python's ``random``, NumPy's global generator (where NumPy is installed), torch's
host generator and the accelerator's device generators (XLA keeps its own).

The state holds only what ``torch.load(weights_only=True)`` reads back: tensors,
ints, tuples and dicts (NumPy's key array is stored as a tensor).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = ["device_generators_of"]

#: The keys of :meth:`Accelerator.rng_state`'s result.
RNG_KEYS = ("python", "numpy", "torch", "device")


def host_rng_state() -> dict[str, Any]:
    """Python's, NumPy's (``None`` without NumPy) and torch's host generator states."""

    return {"python": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}


def set_host_rng_state(state: object) -> None:
    """Put back what :func:`host_rng_state` returned (loaded from a checkpoint or not).

    :raises TypeError: ``state`` is not a dict.
    :raises ValueError: ``state`` lacks one of the keys.
    """

    if not isinstance(state, Mapping):
        raise AcceleratorTypeError(
            f"set_rng_state expects the dict acc.rng_state() returned, got {type(state).__name__}"
        )
    missing = [key for key in ("python", "numpy", "torch") if key not in state]
    if missing:
        raise AcceleratorValueError(
            f"set_rng_state: the state lacks {', '.join(map(repr, missing))} (got keys "
            f"{sorted(state)}); pass what acc.rng_state() returned"
        )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))  # a loaded tuple may be a list
    if state["numpy"] is not None:
        _set_numpy_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def device_generators_of(device_type: str) -> Any:
    """torch's module for ``device_type`` if it has per-device generators
    (``torch.cuda``, ``torch.xpu``, ...), else ``None``."""

    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, "get_rng_state"):
        return None
    available = getattr(module, "is_available", None)
    if available is not None and not available():
        return None
    return module


def _numpy_state() -> dict[str, Any] | None:
    try:
        import numpy
    except ImportError:
        return None

    kind, keys, position, has_gauss, cached_gaussian = numpy.random.get_state(legacy=True)
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(numpy.asarray(keys).astype("int64")),
        "position": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _set_numpy_state(state: dict[str, Any]) -> None:
    try:
        import numpy
    except ImportError:
        return  # saved where NumPy was installed, resumed where it is not: nothing uses it
    keys = state["keys"].numpy().astype("uint32")
    numpy.random.set_state(
        (state["kind"], keys, state["position"], state["has_gauss"], state["cached_gaussian"])
    )
