"""``pytest --pyargs accel.testing.conformance``, as a vendor's CI runs it: a run that
cannot check anything says so once, and a passing run is quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.processes import run_kit_under_pytest


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("--accelerator", "tpu"), {}, "--accelerator 'tpu': accelerator 'tpu'"),
        ((), {"ACCEL_ACCELERATOR": "npux"}, "$ACCEL_ACCELERATOR 'npux': unknown accelerator"),
        ((), {}, "no accelerator named: the kit checks one; pass --accelerator NAME"),
        (
            ("--accelerator", "cpu", "--accel-limits", "no_such_module:LIMITS"),
            {},
            "--accel-limits 'no_such_module:LIMITS': limits: cannot import 'no_such_module'",
        ),
    ],
    ids=["unavailable", "unknown-from-the-environment", "none-named", "bad-limits"],
)
def test_a_run_that_cannot_check_is_one_usage_error(
    args: tuple[str, ...], env: dict[str, str], says: str, tmp_path: Path
) -> None:
    result = run_kit_under_pytest(*args, cwd=tmp_path, **env)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"ERROR: accel conformance kit, {says}")
    assert errors[0].endswith("No promise was checked.")
    assert "error" not in result.stdout  # no test ran, none errored


def test_listing_the_promises_needs_no_device(tmp_path: Path) -> None:
    result = run_kit_under_pytest("--accelerator", "tpu", "--collect-only", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_promise[moves.rollback]" in result.stdout


def test_the_kit_shows_none_of_torchs_own_deprecation_warnings(tmp_path: Path) -> None:
    # The first compile imports inductor, whose passes call torch.jit.script_method.
    result = run_kit_under_pytest(
        "--accelerator", "cpu", "-k", "compile", "-W", "default", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert "warning" not in result.stdout
