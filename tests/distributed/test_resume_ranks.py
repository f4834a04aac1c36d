"""Resume across two gloo ranks: DDP through acc.save / acc.load, FSDP2 through
accel.distributed.save_sharded / load_sharded. Both ranks are killed after a
checkpoint, restarted, and end with the parameters of an uninterrupted run, bit for
bit; a SIGTERM to one rank under preemption_guard makes both save at the same step
and exit 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import accel
from accel.training.checkpoint._retention import latest_checkpoint, list_checkpoints
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    Uninterrupted,
    no_launcher_and_no_group,
    run_torchrun,
    worker_env,
)

SCRIPT = str(SCRIPTS / "resumable_ranks.py")


def _launch(mode: str, directory: Path, **env: str) -> tuple[int, str]:
    done = run_torchrun([SCRIPT, mode, str(directory)], env=worker_env(**env))
    return done.returncode, done.stdout


def _final(directory: Path) -> dict[str, torch.Tensor]:
    stored = accel.get_accelerator("cpu").load(directory / "final.pt")
    assert stored["tied"] is True
    return stored["model"]  # type: ignore[no-any-return]


def _assert_equal(resumed: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert resumed.keys() == reference.keys() and "head.weight" in resumed
    for name in reference:
        assert torch.equal(resumed[name], reference[name]), name


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_both_ranks_killed_resume_equal_to_an_uninterrupted_run(
    mode: str, tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    reference = _final(uninterrupted(mode))

    run = tmp_path / "run"
    code, output = _launch(mode, run, KILL_AFTER_STEP="5")
    assert code != 0, output
    assert [p.name for p in list_checkpoints(run)] == ["step-000000003.pt"]
    assert not (run / "final.pt").exists()
    if mode == "ddp":
        assert accel.get_accelerator("cpu").load(run / "step-000000003.pt")["step"] == 3

    code, output = _launch(mode, run)
    assert code == 0, output
    assert output.count("resumed from step-000000003.pt at step 3") == 2  # both ranks
    _assert_equal(_final(run), reference)


def test_sigterm_to_one_rank_makes_both_save_the_same_step_and_exit_0(
    tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    reference = _final(uninterrupted("ddp"))

    run = tmp_path / "run"
    code, output = _launch("ddp", run, TERM_AFTER_STEP="4")
    assert code == 0, output
    # Rank 1 noted it after step 4; the ranks agreed one read later, at step 5.
    assert sorted(re.findall(r"rank (\d) preempted: saved step (\d+)", output)) == [
        ("0", "5"),
        ("1", "5"),
    ]
    newest = latest_checkpoint(run)
    assert newest is not None and newest.name == "step-000000005.pt"

    code, output = _launch("ddp", run)
    assert code == 0, output
    assert output.count("resumed from step-000000005.pt at step 5") == 2
    _assert_equal(_final(run), reference)


def test_a_sigterm_during_start_up_makes_both_ranks_save_at_the_first_step(
    tmp_path: Path,
) -> None:
    # Rank 1 gets SIGTERM after the process group and DDP are up, before the guard:
    # it used to die of it (and torchrun stopped rank 0). Noted, it is agreed on at
    # the guard's entry, so both ranks save at the first read, step 1, and exit 0.
    run = tmp_path / "run"
    code, output = _launch("ddp", run, TERM_AT_START_UP="1", ACCEL_EARLY_SIGNALS="1")
    assert code == 0, output
    assert output.count("rank 1 noted SIGTERM before the loop") == 1
    assert "rank 0 noted nothing" in output  # it stopped on rank 1's request
    assert sorted(re.findall(r"rank (\d) preempted: saved step (\d+)", output)) == [
        ("0", "1"),
        ("1", "1"),
    ]
    newest = latest_checkpoint(run)
    assert newest is not None and newest.name == "step-000000001.pt"


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_ranks_seeded_apart_resume_with_their_own_generators(
    mode: str, tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    # Dropout and the loss scale draw from generators seeded per rank: resumed with
    # rank 0's generators (what a checkpoint used to hold), rank 1 would draw rank 0's
    # masks and scales, and the parameters would differ.
    uninterrupted_run = uninterrupted(mode, SEED_PER_RANK="1")
    run = tmp_path / "run"
    code, output = _launch(mode, run, SEED_PER_RANK="1", KILL_AFTER_STEP="5")
    assert code != 0, output
    assert [p.name for p in list_checkpoints(run)] == ["step-000000003.pt"]
    code, output = _launch(mode, run, SEED_PER_RANK="1")
    assert code == 0, output
    assert output.count("resumed from step-000000003.pt at step 3") == 2
    assert "generators of" not in output  # the same world size: no resharding warning

    finals = {}
    for rank in (0, 1):
        resumed = torch.load(run / f"final-rank{rank}.pt", weights_only=True)
        reference = torch.load(uninterrupted_run / f"final-rank{rank}.pt", weights_only=True)
        _assert_equal(resumed["model"], reference["model"])
        for name, value in reference["rng"].items():
            assert torch.equal(resumed["rng"][name], value), (rank, name)
        finals[rank] = reference["rng"]
    for name in ("torch", "python", "numpy"):  # the ranks did draw apart
        assert not torch.equal(finals[0][name], finals[1][name]), name


def test_torchrun_restarts_a_job_whose_rank_was_killed_and_it_resumes_exactly(
    tmp_path: Path, uninterrupted: Uninterrupted
) -> None:
    uninterrupted_run = uninterrupted("ddp", SEED_PER_RANK="1")
    reference = _final(uninterrupted_run)

    run = tmp_path / "run"
    # Rank 1 alone is SIGKILLed after step 5 (the step-3 checkpoint written): torchrun
    # stops rank 0, starts both again, and they resume from the step-3 checkpoint.
    done = run_torchrun(
        ["--max-restarts", "1", SCRIPT, "ddp", str(run)],
        env=worker_env(SEED_PER_RANK="1", KILL_AFTER_STEP="5", KILL_RANK="1"),
    )
    assert done.returncode == 0, done.stdout
    assert re.search(r"exitcode\s*:\s*-9", done.stdout), done.stdout  # the kill torchrun saw
    assert done.stdout.count("resumed from step-000000003.pt at step 3") == 2, done.stdout
    _assert_equal(_final(run), reference)
    for rank in (0, 1):
        resumed = torch.load(run / f"final-rank{rank}.pt", weights_only=True)
        expected = torch.load(uninterrupted_run / f"final-rank{rank}.pt", weights_only=True)
        for name, value in expected["rng"].items():
            assert torch.equal(resumed["rng"][name], value), (rank, name)
