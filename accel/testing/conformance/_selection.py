"""Promises of selection, availability and the devices an accelerator counts."""

from __future__ import annotations

from typing import Any

import torch

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


def _torch_state() -> dict[str, Any]:
    """What an availability probe must leave as it was, as torch's public API shows it
    (the PrivateUse1 name has no public getter: torch's own accessor reads it)."""
    return {
        "the host generator's state": torch.get_rng_state(),
        "the host generator's seed": torch.initial_seed(),
        "the default device": torch.get_default_device(),
        "the default dtype": torch.get_default_dtype(),
        "CUDA initialised": torch.cuda.is_initialized(),  # type: ignore[no-untyped-call]
        "the PrivateUse1 backend's name": torch._C._get_privateuse1_backend_name(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "the host's thread count": torch.get_num_threads(),
    }


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"{what} ({before[what]!r} became {after[what]!r})"
        if not isinstance(before[what], torch.Tensor)
        else what
        for what in before
        if not (
            torch.equal(before[what], after[what])
            if isinstance(before[what], torch.Tensor)
            else before[what] == after[what]
        )
    ]


@promise(
    "selection.is_available_pure",
    "is_available gives the same answer when asked again and leaves torch's state as it "
    "was: generators, default device and dtype, initialised runtimes, PrivateUse1 name",
)
def is_available_pure(subject: Subject) -> None:
    acc = subject.accelerator
    before = _torch_state()
    answers = [acc.is_available() for _ in range(3)]
    changed = _changed(before, _torch_state())
    assert not changed, (
        f"is_available() changed {', '.join(changed)}: the hook runs whenever anyone lists "
        'accelerators or asks for "auto", so it must be side-effect free (declare '
        "AcceleratorSpec(..., probing_initialises=True) where probing must initialise)"
    )
    assert answers == [True] * 3, f"is_available() asked three times answered {answers}"


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


PROMISES = (by_name, is_available_pure, count_and_index, distributed_backend)
