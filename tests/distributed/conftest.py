"""Fixtures the two-rank tests share."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from helpers.distributed import SCRIPTS, Uninterrupted, run_torchrun, worker_env


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Uninterrupted:
    """The directory of an uninterrupted two-rank run of scripts/resumable_ranks.py
    (``final.pt``, ``final-rank{0,1}.pt``): what a killed and resumed run must equal.

    The run is deterministic, so each (mode, environment) runs once a test run and the
    tests that compare against it share it; they only read it. Under pytest-xdist the
    workers share it too: the first to need it runs it, under a lock the others wait on.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the one base directory of this run's workers

    def run(mode: str, **env: str) -> Path:
        name = "-".join(["uninterrupted", mode, *(f"{k}={v}" for k, v in sorted(env.items()))])
        directory = root / name
        with (root / ".uninterrupted.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not directory.exists():
                # Written aside and renamed once complete: a failed run leaves no
                # directory that another test would take for a finished one.
                partial = tmp_path_factory.mktemp(f"{name}-partial")
                done = run_torchrun(
                    [str(SCRIPTS / "resumable_ranks.py"), mode, str(partial)],
                    env=worker_env(**env),
                )
                assert done.returncode == 0, done.stdout
                partial.rename(directory)
        return directory

    return run
