"""docs/training.md's SLURM batch script, run as written with stand-ins for ``srun``
and ``scontrol`` on PATH: it names its tasks, counts its runs from an unset
``SLURM_RESTART_COUNT``, and requeues every run that stopped early, never one that
finished or failed. (The launcher stage runs the same script under real SLURM.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.doc_blocks import REPO, slurm_batch_script

PAGE = REPO / "docs" / "training.md"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _stand_in(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run(
    tmp_path: Path, *, srun_status: int, finishes: bool, restarts: str | None
) -> tuple[int, str, str]:
    """One run of the script: (its status, its output, what scontrol was asked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun "trains": it records its arguments, and writes ckpt/final.pt if it finishes.
    final = "mkdir -p ckpt && touch ckpt/final.pt" if finishes else "true"
    _stand_in(bin_dir, "srun", f'echo "$@" > srun.args\n{final}\nexit {srun_status}')
    _stand_in(bin_dir, "scontrol", 'echo "$@" >> scontrol.calls')
    script = tmp_path / "job.sh"
    script.write_text(slurm_batch_script(PAGE).code)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "77"}
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = restarts
    done = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    calls = tmp_path / "scontrol.calls"
    return done.returncode, done.stdout, calls.read_text() if calls.exists() else ""


def test_the_script_names_its_tasks_and_starts_the_training_with_srun() -> None:
    code = slurm_batch_script(PAGE).code
    directives = [line.split()[1] for line in code.splitlines() if line.startswith("#SBATCH")]
    names = {directive.split("=")[0] for directive in directives}
    # Without --ntasks, `srun python train.py` starts one task.
    assert {"--ntasks", "--time", "--signal", "--requeue", "--open-mode"} <= names
    assert "--signal=USR1@90" in directives  # to the steps, not B: (the batch shell)
    assert "srun python train.py" in code


def test_a_first_run_stopped_early_is_requeued_and_counted_as_run_0(tmp_path: Path) -> None:
    status, output, calls = _run(tmp_path, srun_status=0, finishes=False, restarts=None)
    assert status == 0
    assert "job 77 run 0" in output  # SLURM_RESTART_COUNT is unset in the first run
    assert "stopped early: requeueing" in output
    assert calls.split() == ["requeue", "77"]


def test_every_later_run_stopped_early_is_requeued_again(tmp_path: Path) -> None:
    status, output, calls = _run(tmp_path, srun_status=0, finishes=False, restarts="3")
    assert (status, calls.split()) == (0, ["requeue", "77"])
    assert "job 77 run 3" in output


@pytest.mark.parametrize(
    ("srun_status", "finishes"), [(0, True), (1, False)], ids=["finished", "failed"]
)
def test_a_finished_or_failed_run_is_not_requeued(
    srun_status: int, finishes: bool, tmp_path: Path
) -> None:
    status, output, calls = _run(tmp_path, srun_status=srun_status, finishes=finishes, restarts="1")
    assert status == srun_status
    assert calls == "" and "requeueing" not in output
