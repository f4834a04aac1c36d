"""torch_xla's MpModelWrapper (used when Accelerate or a script forks its processes):
`model_to_device` moves the wrapped model under the wrapper's lock, ties kept."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import accel
from accel.tying import count_unique_parameters
from helpers.models import TiedLM
from helpers.registries import isolated_registry

pytestmark = pytest.mark.xla


class LockProbe:
    """A cross-cutting plugin that records whether the wrapper's lock is held mid-move."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.held: list[bool] = []

    @accel.hookimpl
    def pre_move_hook(self) -> None:
        acquired = self.lock.acquire(block=False)
        if acquired:
            self.lock.release()
        self.held.append(not acquired)


def test_the_wrapped_model_moves_under_the_lock_with_its_ties() -> None:
    import torch_xla.distributed.xla_multiprocessing as xmp

    torch.manual_seed(0)
    model = TiedLM()
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    wrapper = xmp.MpModelWrapper(model)
    probe = LockProbe(wrapper._lock)
    registry = isolated_registry(probe)
    tpu = registry.get_accelerator("tpu")

    moved = tpu.model_to_device(wrapper)

    assert moved is model is wrapper._model  # what the wrapper's own to() returns
    assert probe.held == [True]
    assert wrapper._lock.acquire(block=False)  # and released afterwards
    wrapper._lock.release()
    assert moved.head.weight is moved.embed.weight
    assert count_unique_parameters(moved) == 3
    assert moved.embed.weight.device.type == "xla"
    for name, parameter in moved.named_parameters():
        torch.testing.assert_close(parameter.cpu(), expected[name], rtol=0, atol=0)


def test_the_wrappers_own_move_unties_which_is_why_accel_takes_it() -> None:
    """Records torch_xla's behaviour: if this starts failing, the wrapper keeps ties."""
    import torch_xla
    import torch_xla.distributed.xla_multiprocessing as xmp

    moved = xmp.MpModelWrapper(TiedLM()).to(torch_xla.device())

    assert moved.head.weight is not moved.embed.weight
    assert count_unique_parameters(moved) == 4
