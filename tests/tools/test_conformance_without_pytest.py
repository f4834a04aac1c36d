"""``accel conformance`` is the kit's form for an environment without pytest: it runs
where pytest cannot be imported and no ``pytest`` is on ``PATH`` (a vendor's system
pytest, in another environment, answers "unrecognized arguments: --accelerator")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel.tools.cli import main


def test_the_cli_runs_the_kit_with_no_pytest_anywhere(tmp_path: Path) -> None:
    blocked = tmp_path / "no_pytest"
    blocked.mkdir()
    for name in ("pytest", "_pytest"):
        (blocked / f"{name}.py").write_text(
            "raise ImportError('pytest is not installed in this environment')\n"
        )
    environment = {k: v for k, v in os.environ.items() if k not in {"PJRT_DEVICE", "PYTHONPATH"}}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "accel",
            "conformance",
            "cpu",
            "--promise",
            "selection",
            "--promise",
            "moves",
            "--promise",
            "distributed.all_reduce",
        ],
        cwd=tmp_path,
        # The distributed promise's workers are fresh interpreters: they inherit both.
        env={**environment, "PYTHONPATH": str(blocked), "PATH": str(blocked)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 passed, 0 failed, 0 skipped" in result.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import pytest"],
        env={**environment, "PYTHONPATH": str(blocked)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert "pytest is not installed" in probe.stderr  # the block itself works


def test_the_cli_help_says_the_pytest_form_needs_pytest_in_this_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["conformance", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "which needs pytest installed in this environment" in help_text
    assert "this command does not" in help_text
