"""One transaction for every transformation that unties (issue 45, point 8): moves,
``materialize``, ``parallelize_tied`` and ``fully_shard_tied`` take one capture before
they start, finish it after they end, check once and roll back once.

Followed through one transformation, the model enters each tying module once and
never comes back to one it left: a *visit* starts when a module's code is called
while none of it is running, and ends when the last of its calls returns (calls
inside it, and calls it makes that call back into it, are the same visit). Before this
change one move to an untying device made 14 visits to ``tying/_capture.py``, 6 to
``tying/__init__.py`` and 3 to ``tying/_keeping.py``, and walked the model three times.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn

import accel
import accel.distributed as adist
import accel.tying
from accel.tying import _capture
from helpers.distributed import no_launcher_and_no_group  # noqa: F401  (an autouse fixture)
from helpers.fakes import MetaTpuPlugin
from helpers.models import TiedLM
from helpers.registries import isolated_registry
from helpers.untying_device import UntyingDevicePlugin

TYING = Path(accel.tying.__file__).parent
CAPTURE, TIES, KEEPING = "_capture.py", "__init__.py", "_keeping.py"


def visits(call: Callable[[], Any]) -> list[str]:
    """The tying modules ``call`` visits, in order, one entry per visit."""
    running: dict[str, int] = {}  # module -> its frames on the stack now
    order: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        path = Path(frame.f_code.co_filename)
        if path.parent != TYING or event not in ("call", "return"):
            return
        if event == "call":
            if not running.get(path.name):
                order.append(path.name)
            running[path.name] = running.get(path.name, 0) + 1
        else:
            running[path.name] -= 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return order


def _on_meta() -> TiedLM:
    with torch.device("meta"):
        return TiedLM()


@pytest.mark.parametrize(
    ("plugin", "name"),
    # the TPU plugin on meta: torch's own move; a PrivateUse1 backend's own move hook
    [(MetaTpuPlugin, "tpu"), (UntyingDevicePlugin, "untying")],
    ids=["torch", "plugin"],
)
def test_a_move_that_unties_visits_each_tying_module_once(plugin: type, name: str) -> None:
    acc = isolated_registry(plugin(), builtins=False).get_accelerator(name)
    acc.model_to_device(TiedLM())  # the first move of a handle may fill caches
    model = TiedLM()
    moved: list[nn.Module] = []
    assert visits(lambda: moved.append(acc.model_to_device(model))) == [CAPTURE, KEEPING, TIES]
    assert moved[0].head.weight is moved[0].embed.weight


def test_materialize_visits_each_tying_module_once() -> None:
    acc = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    model = _on_meta()
    assert visits(lambda: acc.materialize(model)) == [CAPTURE, KEEPING, TIES]
    assert model.head.weight is model.embed.weight and model.head.weight.device.type == "cpu"


def test_a_move_by_torch_walks_the_model_twice_the_capture_and_the_one_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch's own move of a model without tie_weights() re-tied from the capture has
    # the ties of before by construction: the only check is after the post-move hooks.
    walked: list[nn.Module] = []
    walk = _capture.live_slots

    def counted(model: nn.Module) -> list[_capture.ModuleSlots]:
        walked.append(model)
        return walk(model)

    monkeypatch.setattr(_capture, "live_slots", counted)
    monkeypatch.setattr(accel.tying, "live_slots", counted)
    acc = isolated_registry(MetaTpuPlugin(), builtins=False).get_accelerator("tpu")
    model = TiedLM()
    moved = acc.model_to_device(model)
    assert walked == [model, moved]
    assert moved is not model or moved.head.weight is moved.embed.weight


def test_tensor_parallel_visits_each_tying_module_once() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    adist.init_process_group("cpu")
    plan = {"embed": RowwiseParallel(), "head": ColwiseParallel()}
    model = _on_meta()
    # parallelize_tied finds the groups first, for the plan's placements: measured after.
    order = visits(lambda: adist.parallelize_tied(model, plan))
    assert order[-3:] == [CAPTURE, KEEPING, TIES], order
    assert model.head.weight is model.embed.weight


def test_fsdp2_visits_the_capture_and_the_ties_once() -> None:
    adist.init_process_group("cpu")
    model = _on_meta()
    units = [model.embed, model.body, model.head]
    # The shard units are planned from the groups first; the transaction comes after.
    order = visits(lambda: adist.fully_shard_tied(model, units))
    assert order[-2:] == [CAPTURE, TIES], order
    assert model.head.weight is model.embed.weight


def test_a_failed_tensor_parallel_split_leaves_no_hook_and_no_dtensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from accel.distributed import _tensor_parallel

    real = _tensor_parallel.parallelize_module
    model = TiedLM()
    weight = model.embed.weight

    def fails_after_sharding(module: nn.Module, *args: Any) -> nn.Module:
        real(module, *args)  # every style's hooks registered, every slot a DTensor
        if module is model:  # not the meta double the plan is tried on first
            raise RuntimeError("planted failure after parallelize_module")
        return module

    monkeypatch.setattr(_tensor_parallel, "parallelize_module", fails_after_sharding)
    adist.init_process_group("cpu")
    with pytest.raises(RuntimeError, match="planted failure") as caught:
        adist.parallelize_tied(model, {"embed": RowwiseParallel(), "head": ColwiseParallel()})
    assert "no forward hook of the plan's styles" in "\n".join(caught.value.__notes__)
    assert model.embed.weight is weight and model.head.weight is weight
    assert type(weight) is nn.Parameter
    hooks = [
        name
        for name, module in model.named_modules()
        if module._forward_pre_hooks or module._forward_hooks
    ]
    assert hooks == []
    monkeypatch.undo()
    adist.parallelize_tied(model, {"embed": RowwiseParallel(), "head": ColwiseParallel()})
    assert model.head.weight is model.embed.weight and model.embed.weight is not weight
