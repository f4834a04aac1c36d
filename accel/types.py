"""Small value types that plugins return and the registry reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from accel._util.names import check_accelerator_name
from accel.errors import AcceleratorTypeError, AcceleratorValueError

if TYPE_CHECKING:
    import torch

__all__ = [
    "AcceleratorInfo",
    "AcceleratorSpec",
    "Availability",
    "MemoryStats",
    "MoveContext",
    "PluginFailure",
    "TieCheck",
]

#: What a move that can untie weights does when the model's ties changed during it.
TieCheck = Literal["error", "warn", "off"]
TIE_CHECK_MODES: tuple[TieCheck, ...] = ("error", "warn", "off")


def checked_tie_check(value: object) -> TieCheck:
    """``value`` as a ``tie_check`` mode, normalised like accelerator names (case and
    surrounding whitespace ignored: ``"WARN"`` is ``"warn"``).

    :raises AcceleratorTypeError: ``value`` is not a str (``True``, say).
    :raises AcceleratorValueError: it names no mode.
    """
    modes = ", ".join(map(repr, TIE_CHECK_MODES))
    if not isinstance(value, str):
        raise AcceleratorTypeError(
            f"tie_check must be a str, one of {modes}; got {type(value).__name__}: {value!r}"
        )
    for mode in TIE_CHECK_MODES:
        if value.strip().lower() == mode:
            return mode
    raise AcceleratorValueError(f"tie_check must be one of {modes}, got {value!r}")


def _check_type(what: str, value: object, kind: type) -> None:
    """Raise unless ``value`` is a ``kind``; a bool is no int here (``priority=True``).

    :raises AcceleratorTypeError: naming ``what`` and the value found.
    """
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        article = "an" if kind is int else "a"
        raise AcceleratorTypeError(f"{what} must be {article} {kind.__name__}, got {value!r}")


@dataclass(frozen=True)
class AcceleratorSpec:
    """An accelerator a plugin provides, as returned by its ``register_accelerators`` hook.

    >>> AcceleratorSpec("NPU", aliases=("ascend",), priority=150, description="Ascend NPUs")
    ... # doctest: +ELLIPSIS
    AcceleratorSpec(name='npu', aliases=('ascend',), priority=150, description='Ascend NPUs', ...)
    """

    #: Canonical name, normalised to lower case.
    name: str
    #: Other names that select it. An alias may be shared by several accelerators of
    #: one provider (the built-in ``gpu`` names both ``cuda`` and ``mps``); it then
    #: resolves to the highest-priority available one.
    aliases: tuple[str, ...] = ()
    #: Rank in ``"auto"`` selection: the highest available priority wins.
    priority: int = 0
    #: One line for listings.
    description: str = ""
    #: Moves to this accelerator's device give every slot a Parameter of its own (its
    #: tensors cannot take over another device's storage in place, as on XLA): accel
    #: then keeps the model's ties on every move to it, as the TPU plugin's are kept
    #: (snapshot, re-tie, the model's ``tie_weights()``, validation by ``tie_check``).
    unties_weights: bool = False
    #: Its ``is_available`` (or ``device_count``) must initialise the device runtime to
    #: answer (torch-opencl sets up OpenCL to count devices): listing and ``"auto"``
    #: then leave it unprobed until it is selected by name (see ``is_available``).
    probing_initialises: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", check_accelerator_name(self.name, "accelerator name"))
        if isinstance(self.aliases, str):
            raise AcceleratorTypeError(
                f"aliases of {self.name!r} must be a tuple of str, not a str"
            )
        aliases = tuple(check_accelerator_name(alias, "alias") for alias in self.aliases)
        object.__setattr__(self, "aliases", tuple(a for a in aliases if a != self.name))
        _check_type(f"priority of {self.name!r}", self.priority, int)
        _check_type(f"description of {self.name!r}", self.description, str)
        for flag in ("unties_weights", "probing_initialises"):
            _check_type(f"{flag} of {self.name!r}", getattr(self, flag), bool)


@dataclass(frozen=True)
class Availability:
    """Whether an accelerator can be used here, as returned by ``is_available``.

    >>> Availability(False, reason="torch_xla is not installed",
    ...              remedy="pip install 'torch_xla==2.9.*'")  # doctest: +ELLIPSIS
    Availability(available=False, ...)
    """

    #: It can be selected by name.
    available: bool
    #: Why not (or, when available, anything worth knowing).
    reason: str = ""
    #: What the user can install or set to make it available.
    remedy: str = ""
    #: ``"auto"`` may pick it. False for an accelerator that works when asked for by
    #: name but should not be chosen silently, e.g. TPU running on XLA:CPU.
    auto: bool = True

    def __post_init__(self) -> None:
        for name, kind in {"available": bool, "auto": bool, "reason": str, "remedy": str}.items():
            _check_type(f"Availability.{name}", getattr(self, name), kind)


@dataclass(frozen=True)
class AcceleratorInfo:
    """One row of :func:`accel.list_accelerators`."""

    name: str
    aliases: tuple[str, ...]
    available: bool
    device_count: int
    priority: int
    #: ``"built-in"``, or the distribution that supplied the plugin ("name version").
    provider: str
    description: str
    #: Why it is unavailable (empty when available).
    reason: str
    #: What to install or set to make it available.
    remedy: str = ""
    #: ``"auto"`` may choose it.
    auto: bool = True


@dataclass
class MoveContext:
    """Passed to every move hook of one :meth:`Accelerator.model_to_device` call.

    Plugins keep what they learn before the move in :attr:`notes` (keyed by a name
    of their own) and read it back in ``post_move_hook``.
    """

    #: Canonical name of the accelerator doing the move.
    accelerator: str
    #: Where the model is going.
    device: torch.device
    #: What to do when tied weights come apart (see :data:`TieCheck`).
    tie_check: TieCheck = "error"
    #: Scratch space shared by the hooks of this one move.
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that failed to load or register, and why."""

    #: The entry point's (or plugin's) name.
    name: str
    #: The distribution that shipped it ("name version"), or how it was registered.
    provider: str
    #: The error, as one line.
    error: str
    #: Names it tried to claim that are disputed now (another plugin had them, or
    #: they are its aliases of such a name), in the order it declared them; asking
    #: for one of them raises :class:`PluginError` rather than silently picking one.
    conflicting_names: tuple[str, ...] = ()


class MemoryStats(TypedDict):
    """Memory of one device, in bytes; ``None`` where the runtime does not report it."""

    #: Bytes in use now (CPU: the process's resident memory).
    allocated_bytes: int | None
    #: The most bytes in use at once since the process started, or since the
    #: runtime's peak counter was last reset (CPU: the process's peak resident memory).
    peak_allocated_bytes: int | None
    #: Bytes the device has (CPU: the machine's RAM).
    total_bytes: int | None
