"""The demo trains with device_loader and optimizer_step and reports its step time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from accel.tools._demo import run_demo
from helpers.processes import run_python
from helpers.registries import isolated_registry
from helpers.replacing import ReplacingAccelerator
from helpers.training_fakes import BareAccelerator


def test_the_demo_trains_and_times_every_step() -> None:
    lines: list[str] = []
    report = run_demo("cpu", steps=7, registry=isolated_registry(), echo=lines.append)
    assert len(report.losses) == 7  # past one pass over the data
    assert report.losses[-1] < report.losses[0] / 2
    assert 0 < report.seconds_per_step < 10
    timing = next(line for line in lines if line.startswith("time per step: "))
    assert timing.split()[4] == "ms"
    assert timing.endswith(" ms (after the first 2)")  # no XLA here, so nothing compiles
    assert lines[-1] == "ties still held after training: yes"


def _demo_on_tpu(steps: int) -> list[str]:
    result = run_python(
        ["-m", "accel", "demo", "--accelerator", "tpu", "--steps", str(steps)], timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.xla
def test_the_tpu_demo_compiles_the_same_graphs_whatever_the_steps() -> None:
    def graphs(lines: list[str]) -> int:
        line = next(line for line in lines if line.startswith("XLA graphs compiled: "))
        return int(line.split()[3])

    short, long = _demo_on_tpu(3), _demo_on_tpu(25)
    assert graphs(short) == graphs(long) <= 3
    timing = next(line for line in long if line.startswith("time per step: "))
    assert timing.endswith(" ms (after the first 2, where XLA compiles)")
    assert "step  25  loss" in "\n".join(long)


def test_the_docs_loop_runs_unchanged_on_the_cpu_and_a_third_party_accelerator(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        from training_loop import train
    finally:
        sys.path.pop(0)
    registry = isolated_registry(BareAccelerator())
    on_cpu = train(registry.get_accelerator("cpu"), 20, checkpoint=str(tmp_path / "cpu.pt"))
    on_bare = train(registry.get_accelerator("bare"), 20, checkpoint=str(tmp_path / "bare.pt"))
    assert on_cpu == on_bare and on_cpu[-1] < on_cpu[0] / 5
    saved = torch.load(tmp_path / "bare.pt")
    assert set(saved) == {"model", "optimizer"} and saved["optimizer"]["state"]


def test_the_demo_judges_the_module_the_move_returned() -> None:
    # The plugin's move returns a tied copy and leaves the model it was given untied:
    # judged (and trained), the copy holds its tie.
    lines: list[str] = []
    registry = isolated_registry(ReplacingAccelerator("replacer"))
    report = run_demo("replacer", steps=3, registry=registry, echo=lines.append)
    assert "tied group: embed.weight, head.weight: held" in lines
    assert "every tie held: yes" in lines
    assert lines[-1] == "ties still held after training: yes"
    assert report.ties_held is True
    assert report.count_after == report.count_before
