"""Promises of the device's runtime: memory_stats, synchronize and mark_step."""

from __future__ import annotations

import torch

from accel.testing.conformance._catalog import Subject, promise

__all__ = ["PROMISES"]

_KEYS = ("allocated_bytes", "peak_allocated_bytes", "total_bytes")


@promise(
    "runtime.memory_stats",
    "memory_stats gives allocated, peak and total bytes, each a count or None, never an error",
)
def memory_stats(subject: Subject) -> None:
    stats = subject.accelerator.memory_stats()
    assert sorted(stats) == sorted(_KEYS), f"memory_stats() has the keys {sorted(stats)}"
    for key in _KEYS:
        value = stats[key]  # type: ignore[literal-required]
        assert value is None or (isinstance(value, int) and value >= 0), (
            f"memory_stats()[{key!r}] is {value!r}, not a byte count or None"
        )
    allocated, peak = stats["allocated_bytes"], stats["peak_allocated_bytes"]
    if allocated is not None and peak is not None:
        assert peak >= allocated, f"peak {peak} is below the {allocated} bytes in use"


def _queued_work(subject: Subject) -> torch.Tensor:
    tensor = torch.zeros(4, device=subject.accelerator.device)
    tensor.add_(1.0)
    tensor.mul_(3.0)
    return tensor


@promise(
    "runtime.synchronize",
    "synchronize returns once queued work is done, never an error",
)
def synchronize(subject: Subject) -> None:
    tensor = _queued_work(subject)
    subject.accelerator.synchronize()
    assert tensor.to("cpu").tolist() == [3.0] * 4, "the work before synchronize() was lost"


@promise(
    "runtime.mark_step",
    "mark_step ends the step and keeps the work queued before it",
)
def mark_step(subject: Subject) -> None:
    tensor = _queued_work(subject)
    subject.accelerator.mark_step()
    tensor.add_(1.0)
    subject.accelerator.mark_step()
    assert tensor.to("cpu").tolist() == [4.0] * 4, "the work around mark_step() was lost"


PROMISES = (memory_stats, synchronize, mark_step)
