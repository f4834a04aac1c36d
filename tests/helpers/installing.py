"""Installing the fixture distributions in tests/dists/ for real, but privately."""

from __future__ import annotations

from pathlib import Path

from helpers.processes import run_python

DISTS = Path(__file__).resolve().parents[1] / "dists"


def pip_install_into(target: Path, *projects: str) -> Path:
    """pip-install the named tests/dists/ projects into ``target`` (for PYTHONPATH)."""
    run_python(
        [
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            *(str(DISTS / project) for project in projects),
        ],
        timeout=300,
        check=True,
    )
    return target
