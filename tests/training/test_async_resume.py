"""Resume is exact with asynchronous saves: a run killed (SIGKILL) in the middle of a
background write, or preempted (SIGTERM) while its last save is pending, and restarted
until done, ends with the parameters of an uninterrupted run with synchronous saves,
bit for bit; the checkpoint before the one being written is always there and loads.

``scripts/async_loop.py`` is ``scripts/resumable_loop.py`` saving asynchronously;
where it dies, and whether a background write ends before the prune after its save,
are chosen by environment variable, never by timing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accel
from accel.training.checkpoint._atomic import is_temporary
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TIMEOUT_S = 120


def _run(script: str, directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("KILL_AFTER_STEP", "KILL_IN_SAVE_AT_STEP", "KILL_IN_WRITE_OF_STEP",
                       "TERM_AFTER_STEP", "WRITE_ENDS")
    }  # fmt: skip
    environment.update(OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--dir", str(directory)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _final(directory: Path) -> dict[str, torch.Tensor]:
    stored = accel.get_accelerator("cpu").load(directory / "final.pt")
    assert stored["step"] == 12
    return stored["model"]  # type: ignore[no-any-return]


def _newest_step(directory: Path) -> int:
    newest = latest_checkpoint(directory)
    assert newest is not None
    stored = accel.get_accelerator("cpu").load(newest)
    assert stored["model"]["embed.weight"] is stored["model"]["head.weight"]
    return int(stored["step"])


def _names(directory: Path) -> list[str]:
    return [path.name for path in list_checkpoints(directory)]


def _assert_bit_exact(resumed: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name
    assert resumed["embed.weight"] is resumed["head.weight"]


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    directory = tmp_path_factory.mktemp("synchronous")
    done = _run("resumable_loop.py", directory)
    assert done.returncode == 0, done.stderr
    return _final(directory)


@pytest.mark.parametrize(
    ("write_ends", "kept"),
    [
        # Each prune ran while that save was still being written: it counted only the
        # complete checkpoints, so the last two of them stay, and the one written after.
        ("after-prune", [6, 9, 12]),
        # Each write was complete before the prune: counted, as a synchronous save is.
        ("before-prune", [9, 12]),
    ],
)
def test_an_uninterrupted_run_saving_asynchronously_trains_as_a_synchronous_one(
    tmp_path: Path, synchronous: dict[str, torch.Tensor], write_ends: str, kept: list[int]
) -> None:
    # The test says when each background write ends: which checkpoints a prune keeps
    # depends on it (docs/training.md: only complete checkpoints count), never on timing.
    done = _run("async_loop.py", tmp_path, WRITE_ENDS=write_ends)
    assert done.returncode == 0, done.stderr
    _assert_bit_exact(_final(tmp_path), synchronous)
    assert _names(tmp_path) == [checkpoint_path(tmp_path, step).name for step in kept]


def test_a_run_killed_during_a_background_write_resumes_bit_exact(
    tmp_path: Path, synchronous: dict[str, torch.Tensor]
) -> None:
    killed = _run("async_loop.py", tmp_path, KILL_IN_WRITE_OF_STEP="9")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _names(tmp_path) == ["step-000000003.pt", "step-000000006.pt"]  # nothing lost
    left = [p.name for p in tmp_path.iterdir() if is_temporary(p)]
    assert len(left) == 1 and left[0].startswith(".step-000000009.pt.")  # the torn write
    assert _newest_step(tmp_path) == 6

    done = _run("async_loop.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "resumed from step-000000006.pt at step 6" in done.stdout
    _assert_bit_exact(_final(tmp_path), synchronous)
    assert not [p for p in tmp_path.iterdir() if is_temporary(p)]


def test_sigterm_exits_once_the_pending_save_is_complete_and_resumes_bit_exact(
    tmp_path: Path, synchronous: dict[str, torch.Tensor]
) -> None:
    preempted = _run("async_loop.py", tmp_path, TERM_AFTER_STEP="4")
    assert preempted.returncode == 0, preempted.stderr
    assert "preempted: saved step 4, complete: True" in preempted.stdout
    assert _newest_step(tmp_path) == 4

    done = _run("async_loop.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "resumed from step-000000004.pt at step 4" in done.stdout
    _assert_bit_exact(_final(tmp_path), synchronous)
