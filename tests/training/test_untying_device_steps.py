"""On a device torch drives no kernels for (a PrivateUse1 backend, here the fake of
tests/helpers/untying_device.py): a checkpoint loads though the device refuses host
copies in place, and a refused batch names the hook it failed in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import accel.training.checkpoint._restoring as restoring
from helpers.registries import isolated_registry
from helpers.untying_device import HostMoves, UntyingDevicePlugin, values


@pytest.fixture(autouse=True)
def _fresh_copy_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restoring, "_IN_PLACE_FROM_HOST", {}, raising=False)


def test_load_works_on_a_device_that_refuses_host_copies_in_place(tmp_path: Path) -> None:
    registry = isolated_registry(UntyingDevicePlugin())
    acc, cpu = registry.get_accelerator("untying"), registry.get_accelerator("cpu")
    saved = nn.Linear(3, 2)
    path = tmp_path / "model.pt"
    cpu.save({"model": saved}, path)
    model = acc.model_to_device(nn.Linear(3, 2))
    with HostMoves():
        remainder = acc.load(path, {"model": model})
    assert remainder == {}
    assert model.weight.device.type == "privateuseone"
    assert torch.equal(values(model.weight), saved.weight.detach())
    assert torch.equal(values(model.bias), saved.bias.detach())


def test_the_copy_probe_says_what_the_device_does() -> None:
    device = torch.device("privateuseone", 0)
    with HostMoves():
        assert restoring.copies_host_tensors_in_place(device) is False
    assert restoring.copies_host_tensors_in_place(torch.device("cpu")) is True


def test_a_refused_batch_names_the_hook_it_failed_in() -> None:
    # maia: a device type torch names that is not PrivateUse1, so no contiguous retry.
    acc = isolated_registry(UntyingDevicePlugin("other", "maia")).get_accelerator("other")
    with HostMoves("maia"), pytest.raises(RuntimeError, match="only contiguous") as failure:
        acc.batch_to_device({"x": torch.ones(2, 3).t()})
    notes = getattr(failure.value, "__notes__", [])
    assert any("raised in hook 'batch_to_device' of plugin 'accel.fallbacks'" in n for n in notes)


def test_a_privateuse1_device_that_refuses_a_view_gets_contiguous_copies() -> None:
    acc = isolated_registry(UntyingDevicePlugin()).get_accelerator("untying")
    view = torch.arange(6.0).reshape(2, 3).t()
    with HostMoves():
        moved = acc.batch_to_device({"x": view})
    assert moved["x"].device.type == "privateuseone"
    assert torch.equal(values(moved["x"]), view)


def test_device_loader_moves_a_view_as_batch_to_device_does() -> None:
    # No plugin moves batches, so the loader gets accel's own mover (BatchMover): the
    # fallback's move, its contiguous retry included.
    acc = isolated_registry(UntyingDevicePlugin()).get_accelerator("untying")
    view = torch.arange(6.0).reshape(2, 3).t()
    with HostMoves():
        (moved,) = list(acc.device_loader([{"x": view}]))
    assert moved["x"].device.type == "privateuseone"
    assert torch.equal(values(moved["x"]), view)
