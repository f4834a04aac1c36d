"""Asynchronous saves over two gloo ranks: acc.save's rank 0 writes and every rank's
wait() returns once the file is complete (or raises rank 0's failure);
save_sharded(asynchronous=True) through DCP's async_save holds the values from before
the call, and DDP and FSDP2 runs killed in the middle of a background write resume
equal to an uninterrupted run with synchronous saves."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

import accel
from accel.training.checkpoint._atomic import is_temporary
from accel.training.checkpoint._retention import list_checkpoints
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    Uninterrupted,
    no_launcher_and_no_group,
    read_reports,
    run_torchrun,
    worker_env,
)


def _launch(script: str, *args: str, **env: str) -> tuple[int, str]:
    done = run_torchrun([str(SCRIPTS / script), *args], env=worker_env(**env))
    return done.returncode, done.stdout


def test_every_ranks_wait_returns_once_rank_0s_file_is_complete(tmp_path: Path) -> None:
    code, output = _launch("async_ranks.py", "wait", str(tmp_path))
    assert code == 0, output
    rank0, rank1 = read_reports(tmp_path, 2)
    assert rank1["done_before_rank_0_wrote"] is False
    for report in (rank0, rank1):
        assert report["complete_after_wait"] is True
        assert report["holds_the_old_values"] is True  # rank 0 changed it after save returned
    assert not [p for p in tmp_path.iterdir() if is_temporary(p)]


def test_rank_0s_failed_write_is_raised_on_every_rank(tmp_path: Path) -> None:
    code, output = _launch("async_ranks.py", "fail", str(tmp_path))
    assert code == 0, output
    rank0, rank1 = read_reports(tmp_path, 2)
    assert rank0["errno"] == rank1["errno"] == errno.EFBIG
    assert "save could not write the checkpoint" in rank0["message"]
    assert "the main process (rank 0) could not write the checkpoint" in rank1["message"]
    assert rank0["previous_intact"] and rank1["previous_intact"]


def test_a_pass_through_save_wrapper_leaves_the_background_write_to_rank_0(
    tmp_path: Path,
) -> None:
    # The wrapper makes the save hook "answered"; accel's fallback then runs in rank
    # 0's background thread, where it must only write (no broadcast nobody joins).
    code, output = _launch("async_ranks.py", "wrapper", str(tmp_path))
    assert code == 0, output
    rank0, rank1 = read_reports(tmp_path, 2)
    assert rank0["wrapper_calls"] == 1 and rank1["wrapper_calls"] == 0
    assert rank0["written_here"] == [str(tmp_path / "c.pt")]
    assert rank1["written_here"] == []
    for report in (rank0, rank1):
        assert report["complete"] is True
        assert report["stored_rank"] == 0


def test_a_synchronous_save_from_a_loop_thread_is_written_by_rank_0_alone(
    tmp_path: Path,
) -> None:
    # Ray Train runs the loop in a thread: that is no background write.
    code, output = _launch("async_ranks.py", "thread", str(tmp_path))
    assert code == 0, output
    rank0, rank1 = read_reports(tmp_path, 2)
    assert rank0["written_here"] == [str(tmp_path / "c.pt")]
    assert rank1["written_here"] == []
    for report in (rank0, rank1):
        assert report["failure"] is None
        assert report["complete"] is True
        assert report["stored_rank"] == 0


def test_an_asynchronous_sharded_save_holds_the_state_from_before_it_returned(
    tmp_path: Path,
) -> None:
    code, output = _launch("async_sharded_ranks.py", "snapshot", str(tmp_path))
    assert code == 0, output
    for report in read_reports(tmp_path, 2):
        assert report == {
            "pending_hidden": True,
            "complete": True,
            "parameters_old": True,
            "moments_old": True,
        }


def _final(directory: Path) -> dict[str, torch.Tensor]:
    stored = accel.get_accelerator("cpu").load(directory / "final.pt")
    assert stored["tied"] is True
    return stored["model"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_killed_during_a_sharded_background_write_resumes_exactly(
    mode: str, tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    reference = _final(uninterrupted(mode))

    run = tmp_path / "run"
    code, output = _launch("async_sharded_ranks.py", mode, str(run), KILL_IN_WRITE_OF_STEP="6")
    assert code != 0, output
    assert [p.name for p in list_checkpoints(run)] == ["step-000000003.pt"]
    torn = [p.name for p in run.iterdir() if is_temporary(p)]
    assert len(torn) == 1 and torn[0].startswith(".step-000000006.pt.")

    code, output = _launch("async_sharded_ranks.py", mode, str(run))
    assert code == 0, output
    assert output.count("resumed from step-000000003.pt at step 3") == 2  # both ranks
    resumed = _final(run)
    assert resumed.keys() == reference.keys()
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name
    # Pruned to two while step 9 was still being written: it did not count.
    assert [p.name for p in list_checkpoints(run)] == [
        "step-000000003.pt",
        "step-000000006.pt",
        "step-000000009.pt",
    ]
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # the torn one removed
