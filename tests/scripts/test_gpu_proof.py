"""scripts/gpu-proof where there is no GPU: it says so on one line and exits 2, passing no
GPU check; and its checks themselves run (on the CPU), so a GPU's time is not spent on a
broken script.

The Python part runs in this process (imported, its ``main`` called) where nothing needs a
fresh interpreter; the shell script, and the probe's fork, still get their own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


@pytest.fixture
def gpu_proof(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/gpu_proof.py imported as a module; the sys.path entry it adds (the
    benchmarks' nanoGPT) and the sizes it chooses are undone after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("gpu_proof", SCRIPTS / "gpu_proof.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_proof", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def run_main(gpu_proof: ModuleType, *args: str) -> subprocess.CompletedProcess[str]:
    """The script's ``main(args)`` in this process, its exit status and output as a
    finished process would report them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = gpu_proof.main(list(args))
    return subprocess.CompletedProcess(
        ["gpu_proof.py", *args], status, out.getvalue(), err.getvalue()
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
def test_the_python_part_says_there_is_no_cuda_device_and_exits_2(gpu_proof: ModuleType) -> None:
    said = assert_no_gpu_exit(run_main(gpu_proof))
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


def test_every_check_but_the_kit_passes_on_the_cpu(
    gpu_proof: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kit has tests of its own (tests/testing); the rest is this script's code.
    # save-resume's training children run here: a fresh interpreter (torch imported
    # three times over) proves nothing of their code that this process does not; the
    # probe's child stays a process of its own, as it forks and watches CUDA's state.
    run_child = gpu_proof.run_child

    def train_here(*args: str, timeout: float = 300) -> str:
        if args[0] != "train":
            return str(run_child(*args, timeout=timeout))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            gpu_proof.CHILDREN["train"](*args[1:])
        return out.getvalue().strip()

    monkeypatch.setattr(gpu_proof, "run_child", train_here)
    checks = [arg for name in GPU_CHECKS if name != "conformance" for arg in ("--check", name)]
    done = run_main(gpu_proof, "--accelerator", "cpu", "--quick", *checks)
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
