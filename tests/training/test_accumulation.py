"""Gradient accumulation: acc.no_sync on DDP, FSDP2 and plain models, through plugins,
and two gloo ranks accumulating two micro-steps equal one step on the whole batch."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from helpers.distributed import no_launcher_and_no_group, read_reports, run_torchrun
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator

__all__ = ["no_launcher_and_no_group"]  # the fixture, used by every test here
SCRIPT = Path(__file__).resolve().parent / "scripts" / "accumulate_no_sync.py"


class DdpLike(torch.nn.Linear):
    """Has DDP's ``no_sync()``: records when it is entered and left."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.events: list[str] = []

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.events.append("enter")
        yield
        self.events.append("exit")


class Fsdp2Like(torch.nn.Linear):
    """Has FSDP2's ``set_requires_gradient_sync``: records each setting."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.settings: list[bool] = []

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        self.settings.append(requires_gradient_sync)


@pytest.mark.parametrize("accelerator", ["cpu", "bare"])
def test_no_sync_uses_ddps_no_sync_and_fsdp2s_switch(accelerator: str) -> None:
    acc = isolated_registry(BareAccelerator()).get_accelerator(accelerator)
    ddp, fsdp = DdpLike(), Fsdp2Like()
    with acc.no_sync(ddp):
        assert ddp.events == ["enter"]
    with acc.no_sync(fsdp):
        assert fsdp.settings == [False]
    assert ddp.events == ["enter", "exit"] and fsdp.settings == [False, True]
    with acc.no_sync(ddp, enabled=False), acc.no_sync(fsdp, enabled=False):
        pass
    assert ddp.events == ["enter", "exit"] and fsdp.settings == [False, True]  # untouched


def test_fsdp2s_sync_comes_back_when_the_block_raises() -> None:
    fsdp = Fsdp2Like()
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    with pytest.raises(RuntimeError, match="boom"), cpu.no_sync(fsdp):
        raise RuntimeError("boom")
    assert fsdp.settings == [False, True]


def test_a_plain_model_accumulates_gradients_as_without_no_sync() -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(4, 3)
    with cpu.no_sync(model):
        model(x).sum().backward()
    with cpu.no_sync(model, enabled=False):
        model(x).sum().backward()
    expected = torch.autograd.grad(model(x).sum() * 2, model.weight)[0]
    torch.testing.assert_close(model.weight.grad, expected)


def test_a_plugins_no_sync_is_asked() -> None:
    class OwnReduction(BareAccelerator):
        def __init__(self) -> None:
            super().__init__("own")
            self.asked: list[tuple[Any, bool]] = []

        @accel.hookimpl
        def no_sync(self, model: torch.nn.Module, enabled: bool) -> Any:
            self.asked.append((model, enabled))
            return nullcontext("paused")

    plugin = OwnReduction()
    acc = isolated_registry(plugin).get_accelerator("own")
    model = torch.nn.Linear(1, 1)
    with acc.no_sync(model, enabled=True) as value:
        assert value == "paused"
    assert plugin.asked == [(model, True)]


@pytest.mark.parametrize(
    ("model", "enabled", "match"),
    [
        ("model", True, "no_sync expects the model being trained .* got str"),
        (torch.nn.Linear(1, 1), 1, r"no_sync\(enabled=...\) expects a bool, got int"),
    ],
)
def test_bad_no_sync_arguments_are_refused(model: Any, enabled: Any, match: str) -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    with pytest.raises(TypeError, match=match):
        cpu.no_sync(model, enabled=enabled)


def test_two_gloo_ranks_accumulating_under_no_sync_equal_one_step_on_the_whole_batch(
    tmp_path: Path,
) -> None:
    """Slow-ish: torchrun, two CPU processes on loopback (about 10 s)."""
    result = run_torchrun([str(SCRIPT), str(tmp_path)])
    assert result.returncode == 0, result.stdout[-4000:]
    for report in read_reports(tmp_path, 2):
        assert report["reductions"][0] == 0, report  # the micro-step under no_sync
        assert report["reductions"][1] >= 1, report  # the synced one
        assert report["unsynced_after_first"], report  # each rank had its own gradient
        assert report["diff"] < 1e-6, report


@pytest.fixture
def one_gloo_rank(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_no_sync_on_the_module_ddp_wraps_warns_at_the_callers_line_naming_the_wrapper(
    one_gloo_rank: None,
) -> None:
    from accel.errors import GradientSyncWarning

    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    # The mistake: DDP all-reduces in every backward() all the same.
    line = sys._getframe().f_lineno + 1
    with pytest.warns(GradientSyncWarning) as caught, cpu.no_sync(ddp.module):
        ddp(torch.ones(2, 3)).sum().backward()
    (warning,) = caught
    message = str(warning.message)
    assert "the Linear that a DistributedDataParallel wraps" in message
    assert "acc.no_sync(ddp" in message and "not its .module" in message
    assert (warning.filename, warning.lineno) == (__file__, line)  # not accel's, not torch's
    for right in (ddp, torch.nn.Linear(3, 1)):  # the wrapper; a model no DDP wraps
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with cpu.no_sync(right):
                right(torch.ones(2, 3)).sum().backward()
