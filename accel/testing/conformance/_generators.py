"""Promises of the generators: manual_seed, rng_state and set_rng_state (which
refuses another device type's state).

Besides draws, the checks read the ``"device"`` entry of ``acc.rng_state()``: on a
device whose tensors draw from the host generator, a device generator that is never
seeded or put back shows only there.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from accel.testing.conformance._catalog import Subject, promise

__all__ = ["PROMISES"]


def _host_draws() -> list[float]:
    return torch.rand(6).tolist()


def _device_draws(subject: Subject) -> list[float]:
    return torch.rand(6, device=subject.accelerator.device).to("cpu").tolist()


@promise("generators.manual_seed_host", "manual_seed makes the host's draws repeat")
def manual_seed_host(subject: Subject) -> None:
    acc = subject.accelerator
    acc.manual_seed(1234)
    first = _host_draws()
    acc.manual_seed(1234)
    assert _host_draws() == first, "the same seed gave other draws on the host"
    acc.manual_seed(4321)
    assert _host_draws() != first, "another seed gave the same draws on the host"


@promise(
    "generators.manual_seed_device",
    "manual_seed makes the device's draws repeat",
    needs=("random",),
)
def manual_seed_device(subject: Subject) -> None:
    acc = subject.accelerator
    acc.manual_seed(1234)
    first = _device_draws(subject)
    acc.manual_seed(1234)
    assert _device_draws(subject) == first, "the same seed gave other draws on the device"
    acc.manual_seed(4321)
    assert _device_draws(subject) != first, "another seed gave the same draws on the device"


def _same(got: Any, expected: Any) -> bool:
    """Two generator states are equal: the same containers, numbers and tensors."""
    if isinstance(expected, torch.Tensor):
        return isinstance(got, torch.Tensor) and torch.equal(got.to("cpu"), expected.to("cpu"))
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and sorted(got) == sorted(expected)
            and all(_same(got[key], expected[key]) for key in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(got) == len(expected)
            and all(_same(a, b) for a, b in zip(got, expected, strict=True))
        )
    return bool(got == expected)


def _holds_state(state: Any) -> bool:
    """The device entry keeps a generator (a tensor or a number somewhere in it); an
    entry without one (``{"type": "opencl", "states": []}``) has nothing to seed."""
    if isinstance(state, torch.Tensor):
        return state.numel() > 0
    if isinstance(state, dict):
        return any(_holds_state(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(_holds_state(value) for value in state)
    return isinstance(state, (int, float)) and not isinstance(state, bool)


@promise(
    "generators.manual_seed_device_state",
    "manual_seed seeds the device generators: the same seed leaves rng_state()'s "
    '"device" entry the same, another seed changes it',
)
def manual_seed_device_state(subject: Subject) -> None:
    acc = subject.accelerator
    acc.manual_seed(1)
    one = acc.rng_state()["device"]
    acc.manual_seed(2)
    two = acc.rng_state()["device"]
    acc.manual_seed(1)
    again = acc.rng_state()["device"]
    assert _same(again, one), (
        'manual_seed(1) twice left the device generators in two states (rng_state()["device"])'
    )
    if _holds_state(one):
        assert not _same(two, one), (
            'manual_seed(1) and manual_seed(2) left rng_state()["device"] the same: '
            "manual_seed does not seed the device generators"
        )


def _round_trip(subject: Subject, *, through_file: bool) -> None:
    acc = subject.accelerator
    has_random = subject.limits.random is None
    acc.manual_seed(99)
    state = acc.rng_state()
    first = (_host_draws(), _device_draws(subject) if has_random else None)
    # Every generator elsewhere, the device's too (on a device whose tensors draw from
    # the host's, draws alone would not move it): set_rng_state must bring each back.
    acc.manual_seed(7)
    if through_file:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        try:
            state = torch.load(buffer, weights_only=True)
        except Exception as exc:
            raise AssertionError(
                f"rng_state() does not load with weights_only=True: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
    acc.set_rng_state(state)
    restored = acc.rng_state()["device"]
    second = (_host_draws(), _device_draws(subject) if has_random else None)
    assert second[0] == first[0], "after set_rng_state the host's draws differ"
    assert second[1] == first[1], "after set_rng_state the device's draws differ"
    assert _same(restored, state["device"]), (
        'after set_rng_state, rng_state()["device"] is not the state given: set_rng_state '
        "does not put the device generators back"
    )


@promise(
    "generators.rng_state_round_trip",
    "set_rng_state(rng_state()) makes the draws repeat, on the host and the device, and "
    'puts the "device" entry back',
)
def rng_state_round_trip(subject: Subject) -> None:
    _round_trip(subject, through_file=False)


@promise(
    "generators.rng_state_weights_only",
    "rng_state() saved with torch.save loads with weights_only=True, and the loaded state "
    "makes the draws repeat",
)
def rng_state_weights_only(subject: Subject) -> None:
    _round_trip(subject, through_file=True)


def _foreign_type(device_type: str) -> str:
    """A device type other than the one under test, for a state that is not its own."""
    return "cuda" if device_type != "cuda" else "mps"


@promise(
    "generators.set_rng_state_refuses_other_type",
    'set_rng_state refuses a "device" entry from another device type with a ValueError, '
    "and leaves the device generators as they were",
)
def set_rng_state_refuses_other_type(subject: Subject) -> None:
    acc = subject.accelerator
    acc.manual_seed(5)
    state = acc.rng_state()
    before = state["device"]
    other = _foreign_type(acc.device.type)
    # What the fallback's rng_state gives on that device type: a resumed run's checkpoint.
    foreign = {"type": other, "states": [torch.zeros(16, dtype=torch.uint8)]}
    try:
        acc.set_rng_state({**state, "device": foreign})
    except ValueError:
        pass
    else:
        raise AssertionError(
            f"set_rng_state accepted a {other!r} generator state on {acc.device.type!r} "
            "without a word: a set_rng_state hook must refuse another device type's state "
            "with a ValueError (a run resumed on another device would silently draw "
            "other numbers)"
        )
    assert _same(acc.rng_state()["device"], before), (
        'the refused set_rng_state changed the device generators (rng_state()["device"] differs)'
    )


PROMISES = (
    manual_seed_host,
    manual_seed_device,
    manual_seed_device_state,
    rng_state_round_trip,
    rng_state_weights_only,
    set_rng_state_refuses_other_type,
)
