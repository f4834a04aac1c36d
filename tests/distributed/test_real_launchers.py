"""accel.distributed under the real launchers: Open MPI's ``mpirun`` and SLURM's ``srun``
and ``sbatch``, each training the tied model with DDP (gloo) on this machine; and a
batch job preempted by its time limit's signal, requeued by its own script, resuming
exactly.

Run by ``bash scripts/test launchers`` (scripts/stages/launchers.sh), which starts a
private munged, slurmctld and slurmd and exports ``SLURM_CONF``; deselected from the
other tiers by the ``launchers`` marker. Every run checks what really happened: both
ranks' final parameters equal (same checksum, also compared through all_gather), ties
kept, world size 2, ranks {0, 1}, the launcher accel recorded, and the port it used.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from helpers.distributed import (  # noqa: F401  (an autouse fixture)
    SCRIPTS,
    free_port,
    no_launcher_and_no_group,
    read_reports,
    worker_env,
)
from helpers.doc_blocks import REPO, slurm_batch_script

pytestmark = [
    pytest.mark.launchers,
    pytest.mark.skipif(
        os.environ.get("ACCEL_LAUNCHERS_STAGE") != "1" or not os.environ.get("SLURM_CONF"),
        reason="needs the SLURM daemons `bash scripts/test launchers` starts",
    ),
]

#: Each launch, bounded; a job that outlives it is cancelled by its SLURM time limit too.
LAUNCH_TIMEOUT_S = 150
#: mpirun as root, and no oversubscription refusal on a 2-core machine.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
#: srun/sbatch: a minute-bounded job, its output kept.
SLURM_LIMIT = ["--time=3"]
TRAIN = [sys.executable, str(SCRIPTS / "train_tied.py"), "cpu"]
# Derived ports, as docs/distributed.md documents them.
PORT_BASE, PORT_SPAN, STEPS_PER_JOB = 20000, 19997, 100


def launch(
    command: list[str], env: dict[str, str], timeout: float = LAUNCH_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run a launcher command, output merged; kill its process group on timeout."""
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        pytest.fail(f"{command[0]} did not finish in {timeout} s:\n{output[-4000:]}")
    return subprocess.CompletedProcess(command, process.returncode, output, "")


def environment(explicit: bool) -> tuple[dict[str, str], int | None]:
    """The launch environment, with MASTER_ADDR/MASTER_PORT set (a free port) or not."""
    if not explicit:
        return worker_env(), None
    port = free_port()
    return worker_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), port


def sbatch(script: str, env: dict[str, str], tmp_path: Path, *options: str) -> str:
    """Submit ``script`` as a batch job, wait for it; returns the job's output."""
    output = tmp_path / "job.out"
    result = launch(
        ["sbatch", "--wait", *SLURM_LIMIT, *options, f"--output={output}", "--wrap", script],
        env,
    )
    job_output = output.read_text() if output.exists() else ""
    result.stdout += job_output
    assert result.returncode == 0, result.stdout[-4000:]
    return job_output


def assert_trained_in_step(reports: list[dict[str, Any]], launcher: str) -> None:
    """Two ranks of one world, DDP in step, ties kept, launched by ``launcher``."""
    assert {report["rank"] for report in reports} == {0, 1}
    for report in reports:
        assert report["world_size"] == 2
        assert (report["launcher"], report["launched"], report["backend"]) == (
            launcher,
            True,
            "gloo",
        )
        assert report["tied"] and report["unique_after"] == report["ddp_unique"] == 3
        assert report["ranks_equal"] and report["own_slot_is_mine"] and report["trained"]
        assert report["plain_ranks_equal"] is False  # the control drifted apart
        assert report["local_world_size"] == 2  # both on this node, as the launcher said
    assert reports[0]["checksum"] == reports[1]["checksum"]
    assert reports[1]["start_differed"]  # DDP's broadcast, not luck, made them equal
    assert reports[0]["master_port"] == reports[1]["master_port"]


def slurm_port(job_id: str, step_id: str) -> int:
    return PORT_BASE + (STEPS_PER_JOB * int(job_id) + int(step_id)) % PORT_SPAN


def openmpi_port(job_id: str) -> int:
    return PORT_BASE + int(job_id) % PORT_SPAN


def assert_port(report: dict[str, Any], explicit_port: int | None) -> None:
    """The port was the one given, else the one derived from the launcher's job id."""
    env = report["launch_env"]
    if explicit_port is not None:
        assert (report["master_port"], report["port_source"]) == (explicit_port, "MASTER_PORT")
    elif report["launcher"] == "slurm":
        assert report["master_port"] == slurm_port(env["SLURM_JOB_ID"], env["SLURM_STEP_ID"])
        assert "SLURM_JOB_ID" in report["port_source"]
    else:
        assert report["master_port"] == openmpi_port(env["OMPI_MCA_ess_base_jobid"])
        assert "OMPI_MCA_ess_base_jobid" in report["port_source"]


@pytest.mark.parametrize("explicit", [False, True], ids=["derived-port", "master-port"])
def test_mpirun_two_ranks_train_in_step(explicit: bool, tmp_path: Path) -> None:
    env, port = environment(explicit)
    forwarded = ["-x", "MASTER_ADDR", "-x", "MASTER_PORT"] if explicit else []
    result = launch([*MPIRUN, *forwarded, *TRAIN, str(tmp_path), "3"], env)
    assert result.returncode == 0, result.stdout[-4000:]
    reports = read_reports(tmp_path, 2)
    assert_trained_in_step(reports, "openmpi")
    assert_port(reports[0], port)
    assert reports[0]["master_port"] != 29500  # no longer torchrun's default port


@pytest.mark.parametrize("explicit", [False, True], ids=["derived-port", "master-port"])
def test_srun_two_tasks_train_in_step(explicit: bool, tmp_path: Path) -> None:
    env, port = environment(explicit)
    result = launch(["srun", "-n2", *SLURM_LIMIT, *TRAIN, str(tmp_path), "3"], env)
    assert result.returncode == 0, result.stdout[-4000:]
    reports = read_reports(tmp_path, 2)
    assert_trained_in_step(reports, "slurm")
    assert_port(reports[0], port)


@pytest.mark.parametrize("explicit", [False, True], ids=["derived-port", "master-port"])
def test_sbatch_with_srun_inside_trains_in_step(explicit: bool, tmp_path: Path) -> None:
    env, port = environment(explicit)
    reports_dir = tmp_path / "reports"
    sbatch(f"srun {' '.join(TRAIN)} {reports_dir} 3", env, tmp_path, "-n2")
    reports = read_reports(reports_dir, 2)
    assert_trained_in_step(reports, "slurm")
    assert_port(reports[0], port)
    assert {r["launch_env"]["SLURM_STEP_ID"] for r in reports} == {"0"}


@pytest.mark.parametrize("explicit", [False, True], ids=["derived-port", "master-port"])
def test_mpirun_inside_sbatch_is_an_open_mpi_job(explicit: bool, tmp_path: Path) -> None:
    # The ranks inherit the batch shell's SLURM_PROCID=0: before the fix both were rank 0.
    env, port = environment(explicit)
    reports_dir = tmp_path / "reports"
    forwarded = "-x MASTER_ADDR -x MASTER_PORT " if explicit else ""
    sbatch(f"{' '.join(MPIRUN)} {forwarded}{' '.join(TRAIN)} {reports_dir} 3", env, tmp_path, "-n2")
    reports = read_reports(reports_dir, 2)
    assert_trained_in_step(reports, "openmpi")
    assert_port(reports[0], port)
    assert {r["launch_env"]["SLURM_PROCID"] for r in reports} == {"0"}  # inherited, ignored


def test_batch_shell_of_several_tasks_is_refused_at_once(tmp_path: Path) -> None:
    reports_dir = tmp_path / "reports"
    output = tmp_path / "job.out"
    script = f"{' '.join(TRAIN)} {reports_dir} 3"  # no srun: the batch shell itself
    started = time.monotonic()
    result = launch(
        ["sbatch", "--wait", "-n2", *SLURM_LIMIT, f"--output={output}", "--wrap", script],
        worker_env(),
    )
    elapsed = time.monotonic() - started
    job_output = output.read_text()
    assert result.returncode != 0, job_output[-4000:]
    assert "DistributedSetupError" in job_output
    assert "is the batch shell of SLURM job" in job_output
    assert "SLURM_STEP_ID is not" in job_output and "srun python" in job_output
    assert elapsed < 45, f"refused only after {elapsed:.0f} s (the rendezvous timeout is 60 s)"
    assert not reports_dir.exists()


def test_batch_shell_of_one_task_runs_alone(tmp_path: Path) -> None:
    reports_dir = tmp_path / "reports"
    sbatch(f"{' '.join(TRAIN)} {reports_dir} 2", worker_env(), tmp_path, "-n1")
    [report] = read_reports(reports_dir, 1)
    assert (report["rank"], report["world_size"], report["launched"]) == (0, 1, False)
    assert report["launcher"] is None and report["tied"] and report["trained"]
    assert report["launch_env"]["SLURM_PROCID"] == "0"


def test_two_concurrent_steps_of_one_job_get_ports_of_their_own(tmp_path: Path) -> None:
    # Both steps hold their rendezvous stores for a while, so they surely overlap; with a
    # port derived from the job id alone, the second step's rank 0 got EADDRINUSE.
    env = worker_env(TRAIN_TIED_HOLD_S="4")
    steps = [tmp_path / "step-a", tmp_path / "step-b"]
    # --overlap: both steps share the job's 2 CPUs (this machine has 2 cores; with
    # --exact the second step would wait for the first to end, and never meet it).
    srun = "srun --overlap -n2"
    a, b = (f"{srun} {' '.join(TRAIN)} {step} 3" for step in steps)
    # A bare `wait` always succeeds: wait for each step, so that the job fails with one.
    script = f"{a} & a=$!; {b} & b=$!; wait $a && wait $b"
    sbatch(script, env, tmp_path, "-n2")
    by_step = [read_reports(step, 2) for step in steps]
    for reports in by_step:
        assert_trained_in_step(reports, "slurm")
        assert_port(reports[0], None)
    step_ids = {reports[0]["launch_env"]["SLURM_STEP_ID"] for reports in by_step}
    assert step_ids == {"0", "1"}
    assert (
        by_step[0][0]["launch_env"]["SLURM_JOB_ID"] == by_step[1][0]["launch_env"]["SLURM_JOB_ID"]
    )
    assert by_step[0][0]["master_port"] != by_step[1][0]["master_port"]
    (a_start, a_end), (b_start, b_end) = (
        (min(r["started_at"] for r in reports), max(r["finished_at"] for r in reports))
        for reports in by_step
    )
    assert a_start < b_end and b_start < a_end, "the two steps did not run at the same time"


#: The page whose SLURM batch script the preemption tests run, as it is written there.
TRAINING_DOC = REPO / "docs" / "training.md"
#: The steps of the preempted run: at SLOW_STEP_S a step, longer than the job's minute.
PREEMPTED_STEPS = "150"


def docs_batch_script(train: list[str]) -> str:
    """docs/training.md's SLURM batch script, ``train`` in place of ``python train.py``.

    Its ``#SBATCH`` lines stay: the options a test passes to sbatch take precedence
    over them (a shorter limit, two tasks on this machine's two cores). It resumes
    from ``ckpt`` and finishes with ``ckpt/final.pt``, as resumable_ranks.py does when
    given ``ckpt``, run from the job's directory (``--chdir``).
    """
    block = slurm_batch_script(TRAINING_DOC)
    assert block.code.count("srun python train.py") == 1, block.code
    return block.code.replace("srun python train.py", f"srun {' '.join(train)}")


def run_docs_batch_script(
    train: list[str], directory: Path, env: dict[str, str], *options: str
) -> subprocess.Popen[str]:
    """Submit the docs' script from ``directory`` (``--wait``); returns the sbatch."""
    directory.mkdir(parents=True)
    script = directory / "job.sh"
    script.write_text(docs_batch_script(train))
    command = ["sbatch", "--wait", *options, f"--chdir={directory}"]
    return subprocess.Popen(
        [*command, f"--output={directory / 'job.out'}", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finished(sbatch: subprocess.Popen[str], directory: Path, timeout: float) -> str:
    """Wait for the job, and return its output (the runs' outputs, appended)."""
    try:
        output, _ = sbatch.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(sbatch.pid, 9)
        output, _ = sbatch.communicate()
    job_output = (directory / "job.out").read_text() if (directory / "job.out").exists() else ""
    assert sbatch.returncode == 0, (output + job_output)[-4000:]
    return job_output


def reference_run(resumable: list[str], directory: Path, steps: str) -> None:
    """The uninterrupted run the resumed one must equal."""
    result = launch(
        ["srun", "-n2", *SLURM_LIMIT, *resumable, str(directory), steps],
        worker_env(SEED_PER_RANK="1"),
    )
    assert result.returncode == 0, result.stdout[-4000:]


def assert_resumed_exactly(run: Path, reference: Path) -> None:
    """The final parameters and every rank's generators equal the uninterrupted run's."""
    cpu = accel.get_accelerator("cpu")
    resumed, uninterrupted = cpu.load(run / "final.pt"), cpu.load(reference / "final.pt")
    assert resumed["model"].keys() == uninterrupted["model"].keys()
    for name, value in uninterrupted["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    for rank in (0, 1):  # every rank's own generators came back
        mine = torch.load(run / f"final-rank{rank}.pt", weights_only=True)
        expected = torch.load(reference / f"final-rank{rank}.pt", weights_only=True)
        for name, value in expected["rng"].items():
            assert torch.equal(mine["rng"][name], value), (rank, name)


def test_the_time_limits_signal_saves_requeues_and_the_job_resumes_exactly(
    tmp_path: Path,
) -> None:
    resumable = [sys.executable, str(SCRIPTS / "resumable_ranks.py"), "ddp"]
    reference = tmp_path / "reference"
    reference_run(resumable, reference, PREEMPTED_STEPS)

    job = tmp_path / "job"
    # A minute's limit; SIGUSR1 to the job's steps 10 s before it, which SLURM sends at
    # its next 30-second check once within 40 s of the end (20-50 s after the start).
    # The first run sleeps 0.4 s a step (60 s in all), so the signal finds it training;
    # the requeued one waits cred_expire (15 s, the stage's slurm.conf) and runs at
    # full speed. --requeue and --open-mode=append are the script's own.
    sbatch = run_docs_batch_script(
        [*resumable, "ckpt", PREEMPTED_STEPS],
        job,
        worker_env(SEED_PER_RANK="1", SLOW_STEP_S="0.4"),
        "--time=1",
        "--signal=USR1@10",
        "-n2",
    )
    job_output = finished(sbatch, job, timeout=300)

    runs = re.findall(r"^job \d+ run (\d+)$", job_output, flags=re.MULTILINE)
    assert runs == ["0", "1"], job_output[-4000:]  # requeued once, by the script
    assert job_output.count("stopped early: requeueing") == 1
    # Both ranks, from SLURM's --signal: while they train, or (on a busy machine, whose
    # start-up outlasts the signal's 20 s) while they start up, then also "before the
    # loop", and they save at step 1. Either way the run saves, leaves and resumes.
    noted = re.findall(r"^rank (\d) noted SIGUSR1$", job_output, flags=re.MULTILINE)
    assert sorted(noted) == ["0", "1"], job_output[-4000:]
    saved = re.findall(r"rank (\d) preempted: saved step (\d+)", job_output)
    assert sorted(rank for rank, _ in saved) == ["0", "1"]
    [step] = {int(step) for _, step in saved}  # the same step on both ranks
    assert 0 < step < int(PREEMPTED_STEPS)
    assert job_output.count(f"resumed from step-{step:09d}.pt at step {step}") == 2
    assert_resumed_exactly(job / "ckpt", reference)


#: The steps of the run signalled during its start-up.
START_UP_STEPS = "30"
#: How long that run stays in its start-up (selected, DDP built, before the loop).
START_UP_HOLD_S = "15"


def test_a_signal_during_start_up_is_noted_and_the_run_saves_at_its_first_step(
    tmp_path: Path,
) -> None:
    # The signal arrives after the accelerator is selected and the process group and
    # DDP are up, before the guard is entered: it used to end both tasks by its
    # default action, and the script, seeing a failure, did not requeue the job.
    resumable = [sys.executable, str(SCRIPTS / "resumable_ranks.py"), "ddp"]
    reference = tmp_path / "reference"
    reference_run(resumable, reference, START_UP_STEPS)

    job = tmp_path / "job"
    # A long limit and a late --signal: the only signal is the one sent below.
    sbatch = run_docs_batch_script(
        [*resumable, "ckpt", START_UP_STEPS],
        job,
        worker_env(SEED_PER_RANK="1", HOLD_AT_START_UP_S=START_UP_HOLD_S),
        "--time=5",
        "--signal=USR1@10",
        "-n2",
    )
    started = [job / "ckpt" / f"started-rank{rank}" for rank in (0, 1)]
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not all(path.exists() for path in started) and sbatch.poll() is None:
        assert time.monotonic() < deadline, "the first run did not start up"
        time.sleep(0.2)
    [job_id] = re.findall(r"^job (\d+) run 0$", (job / "job.out").read_text(), re.MULTILINE)
    # SIGUSR1 to every task of the job's steps (not the batch shell), as --signal sends it.
    signalled = subprocess.run(
        ["scancel", "--signal=USR1", job_id], capture_output=True, text=True, timeout=30
    )
    assert signalled.returncode == 0, signalled.stderr
    job_output = finished(sbatch, job, timeout=300)

    runs = re.findall(r"^job \d+ run (\d+)$", job_output, flags=re.MULTILINE)
    assert runs == ["0", "1"], job_output[-4000:]  # requeued by the script
    assert job_output.count("stopped early: requeueing") == 1
    for rank in (0, 1):  # noted during start-up on each rank, taken over by the guard
        assert job_output.count(f"rank {rank} noted SIGUSR1 before the loop") == 1
    saved = re.findall(r"rank (\d) preempted: saved step (\d+)", job_output)
    assert sorted(saved) == [("0", "1"), ("1", "1")]  # at the first step, on both
    assert job_output.count("resumed from step-000000001.pt at step 1") == 2
    assert_resumed_exactly(job / "ckpt", reference)
