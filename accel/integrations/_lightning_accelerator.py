"""The Lightning accelerator backed by an accel accelerator.

Lightning asks an accelerator *class* whether it is available, how to parse
``devices=`` and which devices that means (``type(accelerator).parse_devices(...)``),
so every :class:`AccelAccelerator` instance gets a subclass of its own that knows its
accel handle. Everything it answers comes from the accel plugin; nothing here knows
any particular device.

That subclass has no importable name, so an instance pickles (for Lightning's
``spawn`` launcher) as the accelerator's name and index, and the new process selects
it again from accel's default registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from lightning.pytorch.accelerators import Accelerator as LightningAccelerator
from typing_extensions import override

import accel
from accel.errors import AcceleratorTypeError, AcceleratorValueError

__all__ = ["AccelAccelerator", "as_lightning_accelerator"]


class AccelAccelerator(LightningAccelerator):
    """A Lightning accelerator for any accel accelerator, built-in or third-party.

    Works with the Trainer and with Fabric (it is both kinds of Lightning
    accelerator). Availability, device counts, ``devices=`` parsing and device
    stats (:meth:`accel.Accelerator.memory_stats`) all come from the accel plugin,
    so a vendor's accel plugin reaches Lightning users with no Lightning code of
    the vendor's own.

    :param accelerator: an accel accelerator name (``"npu"``, ``"tpu"``,
        ``"cuda:1"``), a handle from :func:`accel.get_accelerator`, or ``None`` for
        ``$ACCEL_ACCELERATOR`` / ``"auto"``.
    :param registry: the registry to select ``accelerator`` from (default: accel's
        default registry); only with a name.
    :raises accel.AcceleratorNotFoundError: no such accelerator.
    :raises accel.AcceleratorUnavailableError: it cannot be used here.

    Pair it with :class:`~accel.integrations.lightning.AccelStrategy` (Trainer) or
    :class:`~accel.integrations.lightning.AccelFabricStrategy` (Fabric): on its own,
    Lightning places single-device runs of accelerators it does not know on the CPU.
    """

    _accel: ClassVar[accel.Accelerator | None] = None
    # The registry ``_accel`` was selected from by name (None: accel's default one, or
    # a handle given as it is). On the class, like the handle: pickling re-selects.
    _registry: ClassVar[accel.AcceleratorRegistry | None] = None

    def __new__(
        cls,
        accelerator: str | accel.Accelerator | None = None,
        *,
        registry: accel.AcceleratorRegistry | None = None,
    ) -> AccelAccelerator:
        handle = _select(accelerator, registry)
        bound = type(
            f"{cls.__name__}[{handle.name}]",
            (cls,),
            {"_accel": handle, "_registry": registry, "__module__": cls.__module__},
        )
        instance: AccelAccelerator = super().__new__(bound)
        return instance

    def __init__(
        self,
        accelerator: str | accel.Accelerator | None = None,
        *,
        registry: accel.AcceleratorRegistry | None = None,
    ) -> None:
        # Everything was decided in __new__: the handle lives on this instance's class,
        # where Lightning's class-level questions can reach it.
        super().__init__()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as ``NAME[:INDEX]`` and the tie check, re-selected from accel's default
        registry on unpickling (in a ``spawn``-ed process: its entry-point plugins).

        :raises TypeError: the accelerator is not in the default registry (it came from
            a registry of the caller's own, which another process cannot rebuild).
        """
        handle = self.handle()
        name = handle.name if handle.index is None else f"{handle.name}:{handle.index}"
        if not _in_default_registry(handle):
            raise AcceleratorTypeError(
                f"cannot pickle AccelAccelerator({name!r}): a new process re-selects it by "
                f"name from accel's default registry, where {handle.name!r} is not "
                f"registered (it came from an AcceleratorRegistry of your own). Install "
                f"its plugin as an 'accel' entry point, or launch with "
                f"start_method='popen' (each process then builds its own registry)."
            )
        return (_unpickle, (name, handle.tie_check))

    def __repr__(self) -> str:
        handle = self.handle()
        return f"AccelAccelerator(name={handle.name!r}, device={str(handle.device)!r})"

    @classmethod
    def handle(cls) -> accel.Accelerator:
        """The accel accelerator behind this Lightning accelerator."""
        if cls._accel is None:
            raise AcceleratorTypeError(
                "AccelAccelerator's class methods need an instance's class: use "
                "type(AccelAccelerator('NAME')), not AccelAccelerator itself"
            )
        return cls._accel

    @classmethod
    def _cpu(cls) -> accel.Accelerator:
        """The ``cpu`` accelerator of the registry this one came from, for the way back
        at the end of a run (accel's default registry where that one has no ``cpu``, or
        for a handle given as it is), with this one's tie check."""
        tie_check = cls.handle().tie_check
        if cls._registry is not None and "cpu" in cls._registry.names():
            return cls._registry.get_accelerator("cpu", tie_check=tie_check)
        return accel.get_accelerator("cpu", tie_check=tie_check)

    def handle_for(self, device: torch.device) -> accel.Accelerator:
        """The accel accelerator for ``device``, one of :meth:`get_parallel_devices`."""
        handle = self.handle()
        if device == handle.device:
            return handle
        self._check_device(device)
        return handle.for_index(device.index or 0)

    # -- what Lightning asks the class ---------------------------------------------

    @classmethod
    @override
    def is_available(cls) -> bool:
        return cls.handle().is_available()

    @classmethod
    @override
    def auto_device_count(cls) -> int:
        return len(cls._usable_indices())

    @classmethod
    @override
    def parse_devices(cls, devices: Any) -> list[int]:
        """Turn ``devices=`` into device indices of this accelerator.

        Accepts what Lightning accepts: a count (``2``, ``"2"``; ``-1`` or ``"-1"``
        for all), or indices (``[0, 2]``, ``"0,2"``). An accelerator whose one device
        processes share over ``gloo`` (``cpu``) takes any count, as Lightning's CPU
        accelerator does: ``devices=2`` is two processes on that device.

        :raises ValueError: not one of those, or more devices than the plugin has.
        """
        handle = cls.handle()
        usable = cls._usable_indices()
        if isinstance(devices, str):
            devices = _parse_devices_text(devices, handle.name)
        if isinstance(devices, bool) or not isinstance(devices, (int, Sequence)):
            raise _devices_error(devices, handle.name, "is not a device count or a list of indices")
        shared = cls._shared_device()
        if isinstance(devices, int):
            if devices == -1:
                return usable
            if shared is not None and devices >= 1:
                return [shared] * devices  # one process per "device", all on the one
            if devices < 1 or devices > len(usable):
                raise _devices_error(
                    devices, handle.name, f"but {handle.name!r} has {len(usable)} usable device(s)"
                )
            return usable[:devices]
        indices = list(devices)
        if not indices or any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
            raise _devices_error(devices, handle.name, "is not a non-empty list of device indices")
        if shared is not None and set(indices) == {shared}:
            return indices
        unknown = [i for i in indices if i not in usable]
        if unknown or len(set(indices)) != len(indices):
            raise _devices_error(
                devices, handle.name, f"but the usable device indices are {usable} (no repeats)"
            )
        return indices

    @classmethod
    @override
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        handle = cls.handle()
        return [handle.for_index(index).device for index in cls.parse_devices(devices)]

    @classmethod
    @override
    def name(cls) -> str:
        return cls.handle().name

    @classmethod
    def _shared_device(cls) -> int | None:
        """The index of the one device several processes may share (a ``gloo``
        accelerator with one device, such as ``cpu``), or ``None``.

        The same rule as :func:`accel.distributed.local_accelerator`: there, every
        worker on the machine gets that device.
        """
        handle = cls.handle()
        usable = cls._usable_indices()
        if len(usable) == 1 and handle.distributed_backend == "gloo":
            return usable[0]
        return None

    @classmethod
    def _usable_indices(cls) -> list[int]:
        handle = cls.handle()
        if handle.index is not None:
            return [handle.index]  # selected as "NAME:INDEX": that device only
        return list(range(handle.device_count()))

    # -- what Lightning asks the instance ------------------------------------------

    @override
    def setup_device(self, device: torch.device) -> None:
        """Check that Lightning chose a device of this accelerator.

        :raises ValueError: it did not (Lightning puts single-device runs of
            accelerators it does not know on the CPU unless the strategy says otherwise).
        """
        self._check_device(device)

    @override
    def teardown(self) -> None:
        """Nothing to release: accel keeps no per-run state on the accelerator."""

    @override
    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Memory statistics of ``device`` from the plugin's ``memory_stats``.

        Keys are accel's (``allocated_bytes``, ``peak_allocated_bytes``,
        ``total_bytes``); statistics the accelerator cannot measure are left out
        rather than logged as ``None``.
        """
        if isinstance(device, int):
            device = torch.device(self.handle().device.type, device)
        stats = self.handle_for(torch.device(device)).memory_stats()
        return {key: value for key, value in stats.items() if value is not None}

    def _check_device(self, device: torch.device) -> None:
        handle = self.handle()
        if device.type != handle.device.type:
            raise AcceleratorValueError(
                f"Lightning asked accelerator {handle.name!r} to run on {device}, but its "
                f"devices are of type {handle.device.type!r}. Pass "
                f"strategy=AccelStrategy({handle.name!r}) to the Trainer (or "
                f"AccelFabricStrategy({handle.name!r}) to Fabric) so that Lightning uses "
                f"{handle.name!r}'s own devices."
            )


def as_lightning_accelerator(
    accelerator: AccelAccelerator | str | accel.Accelerator | None,
    registry: accel.AcceleratorRegistry | None,
) -> AccelAccelerator | None:
    """What a strategy's ``accelerator=`` argument means: an :class:`AccelAccelerator`
    as given, a name or handle wrapped in one, ``None`` left to Lightning."""
    if accelerator is None or isinstance(accelerator, AccelAccelerator):
        if registry is not None:
            raise AcceleratorTypeError(
                "registry= selects an accelerator by name; pass a name with it"
            )
        return accelerator
    return AccelAccelerator(accelerator, registry=registry)


def _select(
    accelerator: str | accel.Accelerator | None, registry: accel.AcceleratorRegistry | None
) -> accel.Accelerator:
    # The registry's one rule for "a handle or a name" (a handle with registry= must be
    # that registry's), as everywhere in accel.
    if registry is not None:
        return registry.get_accelerator(accelerator)
    return accel.get_accelerator(accelerator)


def _unpickle(name: str, tie_check: accel.TieCheck) -> AccelAccelerator:
    return AccelAccelerator(accel.get_accelerator(name, tie_check=tie_check))


def _in_default_registry(handle: accel.Accelerator) -> bool:
    """``handle``'s accelerator is the default registry's accelerator of that name."""
    try:
        found = accel.default_registry().get_accelerator(handle.name)
    except accel.AcceleratorError:
        return False
    return found.spec == handle.spec


def _parse_devices_text(text: str, name: str) -> Any:
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    parts = [part.strip() for part in stripped.split(",") if part.strip()]
    if "," in stripped and parts and all(part.isdigit() for part in parts):
        return [int(part) for part in parts]
    raise _devices_error(text, name, "is not a device count or a comma-separated list of indices")


def _devices_error(devices: object, name: str, problem: str) -> ValueError:
    return AcceleratorValueError(
        f"devices={devices!r} for accelerator {name!r} {problem}. Pass a count "
        f"(devices=1), -1 for all, or device indices (devices=[0])."
    )
