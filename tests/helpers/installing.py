"""Installing the fixture distributions in tests/dists/ for real, but privately."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DISTS = Path(__file__).resolve().parents[1] / "dists"


def pip_install_into(target: Path, *projects: str) -> Path:
    """pip-install the named tests/dists/ projects into ``target`` (for PYTHONPATH)."""
    subprocess.run(
        [
            sys.executable,
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
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target
