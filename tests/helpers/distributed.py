"""Shared by the accel.distributed tests: a clean launch environment, and workers
run on loopback (127.0.0.1, a port the OS just handed out), bounded by a timeout
after which the whole process group of the launcher is killed."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import accel
import accel.distributed as adist
import accel.distributed._launchers as launchers
from helpers.fakes import FakeAccelerator
from helpers.processes import clean_environment

SCRIPTS = Path(__file__).resolve().parents[1] / "distributed" / "scripts"
TORCHRUN_TIMEOUT_S = 180

#: ``uninterrupted(mode, **env)`` (tests/distributed/conftest.py): the directory of an
#: uninterrupted run of scripts/resumable_ranks.py, shared by the tests that compare.
Uninterrupted = Callable[..., Path]
#: Every variable a launcher (or a device partition) sets that accel reads.
LAUNCH_VARIABLES = (
    *launchers.TORCHRUN_VARIABLES,
    "LOCAL_WORLD_SIZE",
    *launchers.SLURM_VARIABLES,
    "SLURM_STEP_ID",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NODELIST",
    "SLURM_NODELIST",
    *launchers.OPENMPI_VARIABLES,
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
)


@pytest.fixture(autouse=True)
def no_launcher_and_no_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts outside any launcher with no group, and leaves none behind."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    adist.destroy_process_group()
    yield
    adist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_overrides(**extra: str) -> dict[str, str | None]:
    """What a worker's environment changes (for `helpers.processes`): no launcher
    variables, on loopback, one OpenMP thread, then ``extra``."""
    env: dict[str, str | None] = dict.fromkeys(LAUNCH_VARIABLES)
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only, whatever the hostname resolves to
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher variables (nor accel's), on
    loopback, plus ``extra``: a whole environment, for `subprocess.Popen`."""
    return clean_environment(worker_overrides(**extra))


torchrun_env = worker_env


def _communicate(process: subprocess.Popen[str], what: str) -> str:
    try:
        output, _ = process.communicate(timeout=TORCHRUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{what} did not finish in {TORCHRUN_TIMEOUT_S} s:\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return output


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # one process group per launch: killed as a whole
    )


def run_torchrun(
    args: list[str], *, nproc: int = 2, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `torchrun --nproc-per-node nproc ARGS` on loopback; kill it all on timeout.

    A port picked free can be taken before torchrun binds it, so a launch that
    failed on "address already in use" is retried once on a new port.
    """
    for _attempt in range(2):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            *args,
        ]
        process = _start(command, env or worker_env())
        output = _communicate(process, "torchrun")
        if process.returncode == 0 or "address already in use" not in output.lower():
            break
    return subprocess.CompletedProcess(command, process.returncode, output, "")


def run_workers(
    args: list[str], envs: list[dict[str, str]]
) -> list[subprocess.CompletedProcess[str]]:
    """Start one plain ``python ARGS`` per environment, all at once, as a launcher
    such as srun or mpirun would; wait for all, bounded by the timeout."""
    command = [sys.executable, *args]
    processes = [_start(command, env) for env in envs]
    results = []
    try:
        for rank, process in enumerate(processes):
            output = _communicate(process, f"worker {rank}")
            results.append(subprocess.CompletedProcess(command, process.returncode, output, ""))
    finally:
        for process in processes:  # a worker that failed leaves its peer waiting
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return results


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The directory ``make`` fills, made once a test run; the tests only read it.

    Under pytest-xdist the workers share it: the first to need it makes it, under a
    lock the others wait on, aside, renamed once complete, so a failed launch leaves no
    directory that another test would take for a finished one.
    """
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the one base directory of this run's workers
    directory = root / name
    with (root / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not directory.exists():
            partial = factory.mktemp(f"{name}-partial")
            make(partial)
            partial.rename(directory)
    return directory


def read_reports(report_dir: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((report_dir / f"rank{rank}.json").read_text()) for rank in range(world_size)]


def full_environment(**overrides: str) -> dict[str, str]:
    """All five torchrun variables, for a world of one, with ``overrides``."""
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    env.update(overrides)
    return env


class SingleGpu(FakeAccelerator):
    """One device and the nccl backend: NCCL cannot put two ranks on one GPU."""

    @accel.hookimpl
    def distributed_backend(self) -> str:
        return "nccl"
