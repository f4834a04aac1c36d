"""load_sharded reads a checkpoint that torch's DCP wrote without accel: the layout
of torchtitan and of torch's own recipes, plain top-level values included, with the
optimizer's state keyed by parameter number (``optimizer.state_dict()``) or by name
(``torch.distributed.checkpoint.state_dict``). What it cannot read is a typed accel
error naming the entry, never DCP's ``CheckpointException`` (a ``BaseException``).

One process: without a group (DCP runs without one) and in a gloo group of one, where
DCP hands each rank's failure over through the group's object collectives."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

import accel
import accel.distributed
from helpers.distributed import no_launcher_and_no_group  # noqa: F401  (an autouse fixture)


@pytest.fixture(autouse=True)
def quiet_dcp() -> Iterator[None]:
    with warnings.catch_warnings():
        # DCP says, on every call without a process group, that it runs without one.
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*process group is not initialized.*")
        yield


@pytest.fixture(params=["no group", "gloo"])
def group(request: pytest.FixtureRequest) -> Iterator[str]:
    """No process group, or a gloo group of one."""
    if request.param == "gloo":
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield str(request.param)
    if dist.is_initialized():
        dist.destroy_process_group()


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(2):
        model(torch.randn(5, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def _fresh() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """Another model, an optimizer that has not stepped (no moments yet) and another
    learning rate: everything a load must overwrite."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)


def _assert_restored(saved: tuple[Any, ...], restored: tuple[Any, ...]) -> None:
    (model, optimizer, *_), (model_back, optimizer_back, *_) = saved, restored
    pairs = zip(model.state_dict().items(), model_back.state_dict().values(), strict=True)
    for (name, value), back in pairs:
        assert torch.equal(back, value), name
    moments = [optimizer.state[p]["exp_avg"] for p in model.parameters()]
    moments_back = [optimizer_back.state[p]["exp_avg"] for p in model_back.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(moments, moments_back, strict=True))
    assert optimizer_back.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == 0.025


@pytest.mark.usefixtures("group")
def test_torchs_own_layout_with_a_top_level_step_loads(tmp_path: Path) -> None:
    model, optimizer, _ = _trained(0)
    # What torchtitan and torch's recipes write: plain values beside the state dicts.
    plain = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7}
    dcp.save(plain, checkpoint_id=str(tmp_path / "ckpt"))

    restored = _fresh()
    state = {"model": restored[0], "optimizer": restored[1], "step": 0}
    remainder = accel.distributed.load_sharded(tmp_path / "ckpt", state)

    assert remainder == {"step": 7}
    _assert_restored((model, optimizer), restored)


def test_the_state_dict_apis_layout_loads_with_a_scheduler_beside_it(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained(0)
    model_state, optimizer_state = get_state_dict(model, optimizer)  # by parameter name
    saved = {
        "model": model_state,
        "optimizer": optimizer_state,
        "lr_scheduler": scheduler.state_dict(),
        "train_state": {"step": 7, "tokens": 1234},
    }
    dcp.save(saved, checkpoint_id=str(tmp_path / "ckpt"))

    restored = _fresh()
    state = {
        "model": restored[0],
        "optimizer": restored[1],
        "lr_scheduler": restored[2],
        "train_state": {"step": 0, "tokens": 0},
    }
    remainder = accel.distributed.load_sharded(tmp_path / "ckpt", state)

    assert remainder == {"train_state": {"step": 7, "tokens": 1234}}
    assert restored[2].state_dict() == scheduler.state_dict()
    _assert_restored((model, optimizer), restored)


def test_accels_own_layout_still_loads(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained(0)
    rng = accel.get_accelerator("cpu").rng_state()
    accel.distributed.save_sharded(
        {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 7, "rng": rng},
        tmp_path / "ckpt",
    )

    restored = _fresh()
    state = {"model": restored[0], "optimizer": restored[1], "scheduler": restored[2]}
    remainder = accel.distributed.load_sharded(
        tmp_path / "ckpt", {**state, "step": 0, "rng": accel.get_accelerator("cpu").rng_state()}
    )

    assert remainder["step"] == 7 and torch.equal(remainder["rng"]["torch"], rng["torch"])
    assert restored[2].state_dict() == scheduler.state_dict()
    _assert_restored((model, optimizer), restored)


def test_a_plain_value_the_checkpoint_lacks_is_a_key_error_naming_it(tmp_path: Path) -> None:
    model = _trained(0)[0]
    dcp.save({"model": model.state_dict(), "step": 7}, checkpoint_id=str(tmp_path / "ckpt"))

    state = {"model": _fresh()[0], "step": 0, "epoch": 0}
    try:
        accel.distributed.load_sharded(tmp_path / "ckpt", state)
    except Exception as error:  # DCP's CheckpointException would slip past this
        caught: Exception = error
    else:
        pytest.fail("load_sharded loaded a checkpoint without 'epoch'")

    assert isinstance(caught, accel.AcceleratorKeyError) and isinstance(caught, KeyError)
    message = str(caught)
    assert "state['epoch']" in message and "'accel.plain.epoch'" in message
    assert "'model', 'step'" in message  # what the checkpoint does hold


@pytest.mark.usefixtures("group")
def test_a_model_entry_the_checkpoint_lacks_is_a_key_error_naming_it(tmp_path: Path) -> None:
    model = _trained(0)[0]
    dcp.save({"model": model.state_dict(), "step": 7}, checkpoint_id=str(tmp_path / "ckpt"))

    bigger = nn.Sequential(model, nn.Linear(2, 2))  # its entries are "0.0.weight", ...
    with pytest.raises(accel.AcceleratorKeyError) as caught:
        accel.distributed.load_sharded(tmp_path / "ckpt", {"model": bigger, "step": 0})

    message = str(caught.value)
    assert "state['model']" in message and "'model.0.0.weight'" in message
    assert "of its 6 entries" in message


@pytest.mark.usefixtures("group")
def test_a_tensor_of_another_shape_is_a_value_error(tmp_path: Path) -> None:
    model, _, _ = _trained(0)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "ckpt"))

    wider = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    with pytest.raises(accel.AcceleratorValueError) as caught:
        accel.distributed.load_sharded(tmp_path / "ckpt", {"model": wider})

    assert "could not read the checkpoint at" in str(caught.value)
    assert "Size mismatch" in str(caught.value)
