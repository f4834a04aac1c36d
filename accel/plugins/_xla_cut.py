"""Cutting the lazy graph, and on XLA:CPU keeping the host tracing while a step runs.

Every graph cut the ``tpu`` plugin makes goes through :func:`cut`.

Why the extra work on XLA:CPU: torch_xla donates to the execution the buffers of the
tensors a graph updates in place (every parameter and optimizer state an optimizer
step writes). torch_xla drops its own last reference to those buffers on the thread
that cut the graph, as ``torch_xla.sync()`` returns, and PJRT's release of a buffer
waits for an outstanding donation hold (``CommonPjRtBuffer::ReleaseBuffer``); on the
CPU client, for a step like nanoGPT's, that hold lasts until the execution has ended.
So the host sat out the step's whole execution inside the sync instead of tracing the
next step meanwhile: 13 ms of a 57 ms step on nanoGPT's loop with gradient
accumulation 2, where the hand-written loop, cut at every micro-batch, waits only for
its last one (``benchmarks/bench_nanogpt_loop_xla.py``; the stack seen with ``perf``).

:func:`hold_for_step` takes an alias of each tensor the step is about to overwrite, so
the reference torch_xla drops at the sync is no longer the last one, and the sync
returns at once. The next cut drops the aliases, when the execution that took the old
buffers has ended and their release no longer waits (dropping them any earlier would
wait for it just the same). The graphs compile as before, with the same input-output
aliases (``tests/training/test_step_overlap_xla.py``). The cost is a reference per
tensor, held one cut longer than torch_xla holds it; should the runtime copy a buffer
it cannot donate, at most one more copy of what the step overwrites, for one step.
On other devices nothing is held: a TPU has the least memory to spare.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

__all__ = ["cut", "hold_for_step", "release_held"]


class _Held(threading.local):
    """Per thread (the tracing thread cuts its own graphs): the aliases kept alive."""

    def __init__(self) -> None:
        self.for_next_cut: list[Any] = []  # what the step being traced overwrites
        self.in_flight: list[Any] = []  # what the graph the last cut dispatched read


_HELD = _Held()


def cut() -> None:
    """``torch_xla.sync()``: dispatch the pending graph; keep what it reads alive."""
    import torch_xla

    held = _HELD
    held.in_flight = []  # read by the graph before the last one: ended meanwhile
    torch_xla.sync()
    held.in_flight, held.for_next_cut = held.for_next_cut, []


def hold_for_step(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """On XLA:CPU, keep an alias of each tensor ``optimizer``'s step overwrites until the
    cut after the step's own."""
    if not _host_is_the_device(device.type):
        return
    aliases = [param.detach() for group in optimizer.param_groups for param in group["params"]]
    for state in optimizer.state.values():
        for value in state.values():
            # AdamW's step counter stays on the CPU; only device tensors are donated.
            if isinstance(value, torch.Tensor) and value.device.type == "xla":
                aliases.append(value.detach())
    _HELD.for_next_cut.extend(aliases)


def release_held() -> None:
    """Drop every alias (``acc.synchronize()``: no execution is running any more)."""
    _HELD.for_next_cut = []
    _HELD.in_flight = []


@functools.cache
def _host_is_the_device(device_type: str) -> bool:
    import torch_xla.runtime as xr

    return device_type == "xla" and xr.device_type() == "CPU"
