"""Fixtures the two-rank tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.distributed import SCRIPTS, Uninterrupted, made_once, run_torchrun, worker_env


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Uninterrupted:
    """The directory of an uninterrupted two-rank run of scripts/resumable_ranks.py
    (``final.pt``, ``final-rank{0,1}.pt``): what a killed and resumed run must equal.

    The run is deterministic, so each (mode, environment) runs once a test run and the
    tests that compare against it share it; they only read it. Under pytest-xdist the
    workers share it too: the first to need it runs it, under a lock the others wait on.
    """

    def run(mode: str, **env: str) -> Path:
        def launch(directory: Path) -> None:
            done = run_torchrun(
                [str(SCRIPTS / "resumable_ranks.py"), mode, str(directory)],
                env=worker_env(**env),
            )
            assert done.returncode == 0, done.stdout

        name = "-".join(["uninterrupted", mode, *(f"{k}={v}" for k, v in sorted(env.items()))])
        return made_once(tmp_path_factory, name, launch)

    return run
