"""A promise: one check of accel's contract, the capabilities it needs, its name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from accel.errors import AcceleratorValueError
from accel.testing.conformance._limits import CAPABILITIES, Limits

if TYPE_CHECKING:
    from accel.accelerator import Accelerator
    from accel.registry import AcceleratorRegistry

__all__ = ["Promise", "Subject", "promise"]


@dataclass(frozen=True)
class Subject:
    """What a check runs against."""

    #: The accelerator under test, on its first device.
    accelerator: Accelerator
    #: The registry it came from: the CPU handle for moves back, names for selection.
    registry: AcceleratorRegistry
    #: A fresh, empty directory the check may write to.
    workdir: Path
    #: The name it was asked for; child processes look it up in the default registry.
    requested: str
    #: What the device cannot do: a promise that only partly needs a capability (draws
    #: on the device in a round trip of every generator) leaves that part out.
    limits: Limits


#: A check: raises (an AssertionError, or whatever broke) when the promise does not hold.
Check = Callable[[Subject], None]


@dataclass(frozen=True)
class Promise:
    """One promise of accel's hooks and handle, checked on the device under test."""

    #: ``area.what``, e.g. ``"moves.ties_kept_back_to_cpu"``.
    name: str
    #: The promise in one sentence, for listings.
    summary: str
    #: The capabilities it needs (:data:`CAPABILITIES`).
    needs: tuple[str, ...]
    check: Check


def promise(name: str, summary: str, *, needs: tuple[str, ...] = ()) -> Callable[[Check], Promise]:
    """Make a check function into a :class:`Promise`."""
    unknown = [need for need in needs if need not in CAPABILITIES]
    if unknown:  # the kit's own mistake: fail at import, in its own tests
        raise AcceleratorValueError(f"promise {name!r} needs unknown capabilities {unknown}")

    def wrap(check: Check) -> Promise:
        return Promise(name, summary, needs, check)

    return wrap
