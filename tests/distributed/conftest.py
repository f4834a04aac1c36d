"""Fixtures the two-rank tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.distributed import SCRIPTS, Uninterrupted, run_torchrun, worker_env


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Uninterrupted:
    """The directory of an uninterrupted two-rank run of scripts/resumable_ranks.py
    (``final.pt``, ``final-rank{0,1}.pt``): what a killed and resumed run must equal.

    The run is deterministic, so each (mode, environment) runs once a session and the
    tests that compare against it share it; they only read it.
    """
    runs: dict[tuple[str, tuple[tuple[str, str], ...]], Path] = {}

    def run(mode: str, **env: str) -> Path:
        key = (mode, tuple(sorted(env.items())))
        if key not in runs:
            directory = tmp_path_factory.mktemp(f"uninterrupted-{mode}")
            done = run_torchrun(
                [str(SCRIPTS / "resumable_ranks.py"), mode, str(directory)],
                env=worker_env(**env),
            )
            assert done.returncode == 0, done.stdout
            runs[key] = directory
        return runs[key]

    return run
