"""device_loader and batch_to_device on real torch_xla (XLA:CPU): the same containers as
on the CPU, the plugins' batch hooks inside the parallel loader, batches already on the
device, and a loader wrapped twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.training.batch import move_batch
from helpers.nested_batches import check_walked, every_container

pytestmark = pytest.mark.xla


class TagsBatches:
    """A cross-cutting plugin (it names no accelerator) that moves batches itself and
    tags them, so a test sees that its hook ran."""

    def __init__(self) -> None:
        self.seen_devices: list[str] = []

    @accel.hookimpl
    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        self.seen_devices.extend(t.device.type for t in batch.values() if torch.is_tensor(t))
        moved = move_batch(batch, device)
        moved["tagged"] = True
        return moved


@pytest.fixture
def tpu(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    return registry.get_accelerator("tpu")


def _on_xla(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "xla"


def test_every_container_kind_comes_out_of_xla_as_out_of_the_cpu(tpu: accel.Accelerator) -> None:
    batch = every_container()
    check_walked(batch, tpu.batch_to_device(batch), _on_xla)
    batches = [every_container(offset=i) for i in range(3)]
    seen = list(tpu.device_loader(batches))
    assert len(seen) == 3
    for original, out in zip(batches, seen, strict=True):
        check_walked(original, out, _on_xla)
    assert seen[2]["shared"].cpu().tolist() == [3.0, 3.0]
    assert seen[1]["sample"].tokens.cpu().tolist() == [4.0] * 3


def test_checkpoints_of_xla_tensors_keep_every_container_kind(tpu: accel.Accelerator) -> None:
    from accel.training.checkpoint._state import to_cpu

    on_xla = tpu.batch_to_device(every_container())
    back = to_cpu(on_xla)
    check_walked(on_xla, back, lambda t: t.device.type == "cpu")
    assert back["frozen"].mask.tolist() == [1.0, 1.0]


def test_the_plugins_batch_hooks_run_inside_the_xla_device_loader(
    registry: accel.AcceleratorRegistry,
) -> None:
    plugin = TagsBatches()
    registry.register(plugin)
    tpu = registry.get_accelerator("tpu")
    seen = list(tpu.device_loader([{"x": torch.full((2,), float(i))} for i in range(3)]))
    assert [batch["tagged"] for batch in seen] == [True] * 3
    assert [batch["x"].cpu().tolist() for batch in seen] == [[float(i)] * 2 for i in range(3)]
    # The parallel loader copied the tensors before the hook ran (docs/training.md).
    assert plugin.seen_devices == ["xla"] * 3


def test_batches_already_on_the_device_and_mixed_ones_pass_through(
    tpu: accel.Accelerator, tmp_path: Path
) -> None:
    import torch_xla.debug.metrics as met

    on_device = torch.ones(2, device=tpu.device)
    batches = [{"x": on_device * i, "host": torch.full((1,), float(i)), "i": i} for i in range(3)]
    marks_before = met.counter_value("MarkStep") or 0
    seen = list(tpu.device_loader(batches))
    assert [b["x"].cpu().tolist() for b in seen] == [[float(i)] * 2 for i in range(3)]
    assert [b["host"].device.type for b in seen] == ["xla"] * 3
    assert [b["host"].cpu().tolist() for b in seen] == [[float(i)] for i in range(3)]
    assert seen[2]["x"] is batches[2]["x"], "a tensor already on the device is not copied"
    assert (met.counter_value("MarkStep") or 0) - marks_before >= 3
    only_device = list(tpu.device_loader([on_device, (on_device, "tag")]))
    assert only_device[0] is on_device and only_device[1] == (on_device, "tag")
    # What used to fail after such a loop (torch_xla aborted the process).
    tpu.mark_step()
    tpu.save({"x": seen[1]["x"]}, tmp_path / "after.pt")
    assert torch.load(tmp_path / "after.pt")["x"].tolist() == [1.0, 1.0]


def test_a_loader_wrapped_twice_yields_each_batch_once_through_both_moves(
    registry: accel.AcceleratorRegistry,
) -> None:
    plugin = TagsBatches()
    registry.register(plugin)
    tpu = registry.get_accelerator("tpu")
    twice = tpu.device_loader(
        tpu.device_loader([{"x": torch.full((1,), float(i))} for i in range(4)])
    )
    assert len(twice) == 4
    for _epoch in range(2):
        seen = list(twice)
        assert [b["x"].cpu().tolist() for b in seen] == [[float(i)] for i in range(4)]
        assert all(b["tagged"] for b in seen)
    assert len(plugin.seen_devices) == 2 * 4 * 2  # two moves per batch, two epochs
