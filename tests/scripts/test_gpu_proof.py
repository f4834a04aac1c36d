"""scripts/gpu-proof where there is no GPU: it says so on one line and exits 2, passing no
GPU check; and its checks themselves run (on the CPU), so a GPU's time is not spent on a
broken script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.processes import run_command, run_python

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
GPU_CHECKS = ("probe", "conformance", "tied-model", "pinned-batches", "nanogpt-step", "save-resume")
EXIT_NO_GPU = 2

needs_no_gpu = pytest.mark.skipif(
    bool(torch.backends.cuda.is_built()) and torch.cuda.device_count() > 0,  # type: ignore[no-untyped-call]
    reason="this machine has a CUDA GPU: run `bash scripts/gpu-proof` itself",
)


def verdicts(stdout: str) -> dict[str, str]:
    """Each check's summary line, by check name, from the script's output."""
    found = {}
    for line in stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL"):
            found[rest.partition(":")[0]] = verdict
    return found


def assert_no_gpu_exit(done: subprocess.CompletedProcess[str]) -> str:
    """The exit status and the one line saying why; no GPU check passed. The line."""
    stdout, stderr = done.stdout, done.stderr
    assert done.returncode == EXIT_NO_GPU, stdout + stderr
    said = [line for line in stdout.splitlines() if line.startswith("no CUDA device: ")]
    assert len(said) == 1, stdout + stderr
    assert not {n for n, v in verdicts(stdout).items() if v == "PASS"} & set(GPU_CHECKS)
    return said[0]


@needs_no_gpu
def test_the_python_part_says_there_is_no_cuda_device_and_exits_2() -> None:
    said = assert_no_gpu_exit(run_python([SCRIPTS / "gpu_proof.py"]))
    # accel's own view of `cuda` was checked against torch's before it gave up.
    assert "accel agrees (cuda unavailable: " in said


@needs_no_gpu
def test_the_script_on_a_given_python_says_there_is_no_cuda_device_and_exits_2() -> None:
    done = run_command(["bash", SCRIPTS / "gpu-proof"], env={"ACCEL_GPU_PYTHON": sys.executable})
    assert "gpu-proof: accel " in done.stdout  # accel imported before the verdict
    assert_no_gpu_exit(done)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="nvidia-smi is here")
def test_without_a_driver_the_script_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = run_command(["bash", SCRIPTS / "gpu-proof"], env={"ACCEL_GPU_VENV": str(venv)})
    assert "nothing was installed" in assert_no_gpu_exit(done)
    assert not venv.exists()


def test_every_check_but_the_kit_passes_on_the_cpu() -> None:
    # The kit has tests of its own (tests/testing); the rest is this script's code.
    checks = [arg for name in GPU_CHECKS if name != "conformance" for arg in ("--check", name)]
    command = [SCRIPTS / "gpu_proof.py", "--accelerator", "cpu", "--quick", *checks]
    done = run_python(command, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert verdicts(done.stdout) == {n: "PASS" for n in GPU_CHECKS if n != "conformance"}


def test_the_one_gpu_limits_load_and_declare_only_the_distributed_promises(
    tmp_path: Path,
) -> None:
    # What the conformance check passes on one GPU (the kit's two NCCL ranks need two).
    limits = ["--limits", "gpu_proof:ONE_GPU", "--json", str(tmp_path / "kit.json")]
    promises = ["--promise", "distributed", "--promise", "moves"]
    done = run_python(["-m", "accel", "conformance", "cpu", *limits, *promises], cwd=SCRIPTS)
    assert done.returncode == 0, done.stdout + done.stderr
    outcomes = {r["promise"]: r["outcome"] for r in json.loads((tmp_path / "kit.json").read_text())}
    distributed = {p for p in outcomes if p.startswith("distributed.")}
    assert distributed, outcomes
    assert {p for p, outcome in outcomes.items() if outcome == "skipped"} == distributed
    assert len(outcomes) > len(distributed), "no move promise ran"
