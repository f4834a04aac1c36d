"""Promises of the generators: manual_seed, rng_state and set_rng_state."""

from __future__ import annotations

import io

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


def _round_trip(subject: Subject, *, through_file: bool) -> None:
    acc = subject.accelerator
    has_random = subject.limits.random is None
    acc.manual_seed(99)
    state = acc.rng_state()
    first = (_host_draws(), _device_draws(subject) if has_random else None)
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
    second = (_host_draws(), _device_draws(subject) if has_random else None)
    assert second[0] == first[0], "after set_rng_state the host's draws differ"
    assert second[1] == first[1], "after set_rng_state the device's draws differ"


@promise(
    "generators.rng_state_round_trip",
    "set_rng_state(rng_state()) makes the draws repeat, on the host and the device",
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


PROMISES = (manual_seed_host, manual_seed_device, rng_state_round_trip, rng_state_weights_only)
