"""Promises of selection, availability and the devices an accelerator counts."""

from __future__ import annotations

from accel.errors import AcceleratorUnavailableError
from accel.testing.conformance._catalog import Subject, promise

__all__ = ["PROMISES"]


@promise(
    "selection.by_name",
    "selected by its name and its aliases, available, listed with its device count",
)
def by_name(subject: Subject) -> None:
    acc, registry = subject.accelerator, subject.registry
    again = registry.get_accelerator(acc.name)
    assert again.name == acc.name, f"get_accelerator({acc.name!r}) gave {again.name!r}"
    assert acc.is_available(), f"{acc.name!r} was selected but is_available() is False"
    rows = [row for row in registry.list_accelerators() if row.name == acc.name]
    assert len(rows) == 1, f"list_accelerators() has {len(rows)} rows for {acc.name!r}"
    row = rows[0]
    assert row.available, f"list_accelerators() says {acc.name!r} is unavailable: {row.reason}"
    assert row.device_count == acc.device_count(), (
        f"list_accelerators() counts {row.device_count} devices, device_count() "
        f"{acc.device_count()}"
    )
    for alias in acc.spec.aliases:
        chosen = registry.get_accelerator(alias)
        # An alias shared by several accelerators picks the best available one.
        assert chosen.name == acc.name or alias in chosen.spec.aliases, (
            f"alias {alias!r} selected {chosen.name!r}, which does not declare it"
        )


@promise(
    "devices.count_and_index",
    "at least one device; each index selects its own device, one past the last is refused",
)
def count_and_index(subject: Subject) -> None:
    acc, registry = subject.accelerator, subject.registry
    count = acc.device_count()
    assert isinstance(count, int), f"device_count() is {count!r}, not an int"
    assert count >= 1, f"device_count() is {count} for an available accelerator"
    for index in range(count):
        device = acc.for_index(index).device
        assert device.type == acc.device.type, (
            f"for_index({index}) is on {device}, not a {acc.device.type} device"
        )
        named = registry.get_accelerator(f"{acc.name}:{index}").device
        assert named == device, f"{acc.name}:{index} is {named}, for_index({index}) {device}"
    assert len({str(acc.for_index(i).device) for i in range(count)}) == count, (
        f"the {count} indices do not name {count} different devices"
    )
    try:
        beyond = acc.for_index(count)
    except AcceleratorUnavailableError:
        pass
    else:
        raise AssertionError(
            f"for_index({count}) gave {beyond.device} although device_count() is {count}"
        )


@promise("devices.distributed_backend", "names a torch.distributed backend")
def distributed_backend(subject: Subject) -> None:
    backend = subject.accelerator.distributed_backend
    assert isinstance(backend, str), f"distributed_backend is {backend!r}, not a str"
    assert backend, "distributed_backend is ''"


PROMISES = (by_name, count_and_index, distributed_backend)
