"""accel.training.step: optimizers follow a move made before they were at hand."""

from __future__ import annotations

import copy

import torch

import accel
from accel.training.step import retarget_optimizers
from helpers.fakes import MetaTpuPlugin
from helpers.models import TiedLM


def _stepped_adam(model: TiedLM) -> torch.optim.Adam:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.tensor([[1, 2]])).sum().backward()
    optimizer.step()
    return optimizer


def test_optimizer_follows_a_move_that_replaced_the_parameters() -> None:
    # The TPU plugin's hooks, moving to `meta`: every parameter is a new object after.
    acc = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    acc.register(MetaTpuPlugin())
    tpu = acc.get_accelerator("tpu")
    model = TiedLM()
    optimizer = _stepped_adam(model)
    before = dict(model.named_parameters(remove_duplicate=False))
    tpu.model_to_device(model)
    assert model.head.weight is not before["head.weight"], "the move kept the objects"

    retarget_optimizers([optimizer], before, model)

    params = optimizer.param_groups[0]["params"]
    assert [id(p) for p in params] == [id(p) for p in model.parameters()]
    assert model.head.weight is model.embed.weight
    state = optimizer.state[model.embed.weight]
    assert state["exp_avg"].device.type == "meta"  # state moved with its parameter
    assert state["step"].device.type == "cpu"  # torch keeps this counter on the host


def test_parameters_the_model_never_had_are_left_alone() -> None:
    model = TiedLM()
    extra = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    before = dict(model.named_parameters(remove_duplicate=False))
    moved = copy.deepcopy(model)  # new objects under the same names

    retarget_optimizers([optimizer], before, moved, torch.device("cpu"))

    params = optimizer.param_groups[0]["params"]
    assert params[:-1] == list(moved.parameters())
    assert params[-1] is extra
    assert all(p is not q for p, q in zip(params, model.parameters(), strict=False))


def test_nothing_changes_when_a_name_is_gone() -> None:
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(optimizer.param_groups[0]["params"])
    retarget_optimizers([optimizer], {"no.such": torch.nn.Parameter(torch.zeros(1))}, model)
    assert optimizer.param_groups[0]["params"] == params
