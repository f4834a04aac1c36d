"""How far a move goes into accel: a CPU -> CPU move of a tied model enters few modules,
and none of the TPU plugin's (issue 38: CPU and GPU moves do not pay for tying)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import accel
from helpers.models import TiedLM

#: The most accel modules a CPU -> CPU move may enter: the handle, the move, the
#: capture, the hook caller, the fallback and the move's context type.
MOST_MODULES = 6


def _accel_modules_entered(call: Callable[[], Any]) -> set[str]:
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name == "accel" or name.startswith("accel."):
                entered.add(name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def test_a_cpu_move_of_a_tied_model_enters_few_accel_modules(
    registry: accel.AcceleratorRegistry,
) -> None:
    cpu = registry.get_accelerator("cpu")
    model = TiedLM()
    cpu.model_to_device(model)  # the first move of a handle may set up caches
    entered = _accel_modules_entered(lambda: cpu.model_to_device(model))
    assert not any(name.startswith("accel.plugins.tpu") for name in entered), entered
    assert not any(
        name.startswith("accel.tying") and name != "accel.tying._capture" for name in entered
    ), entered
    assert len(entered) <= MOST_MODULES, ", ".join(sorted(entered))
    assert model.head.weight is model.embed.weight
