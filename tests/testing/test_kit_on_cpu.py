"""accel's own suite runs the kit on the built-in CPU: every promise holds there.

This is where the kit's checks run in the main tier, once each; tests elsewhere that
check only what a promise checks are not repeated here (see the kit's promises).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel.testing.conformance import Limits, Outcome, all_promises, run
from accel.tools.cli import main
from helpers.processes import run_kit_under_pytest
from helpers.registries import isolated_registry


def test_every_promise_holds_on_the_cpu() -> None:
    outcomes = run("cpu", registry=isolated_registry())
    assert outcomes == [Outcome(promise.name, "passed") for promise in all_promises()]


def test_a_declared_limit_skips_exactly_the_promises_that_need_it() -> None:
    limits = Limits(forward="no kernels for matmul yet")
    outcomes = run("cpu", registry=isolated_registry(), limits=limits, promises=["step"])
    assert [(o.promise, o.outcome) for o in outcomes] == [
        ("step.optimizer_step", "passed"),
        ("step.optimizer_step_closure", "passed"),
        ("step.clip_grad_norm_", "passed"),
        ("step.accumulation_and_no_sync", "skipped"),
        ("step.grad_scaler", "skipped"),
        ("step.grad_scaler_options", "passed"),
        ("step.autocast", "skipped"),
        ("step.autocast_dtype", "skipped"),
        ("step.compile", "skipped"),
    ]
    assert outcomes[3].reason == "declared: no forward (no kernels for matmul yet)"


def test_an_unknown_promise_name_is_an_error_listing_the_promises() -> None:
    with pytest.raises(ValueError, match=r"no promise is called 'moves.teleport'.*moves.rollback"):
        run("cpu", promises=["moves.teleport"])


def test_the_distributed_workers_run_the_kit_module_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Started as `python -m` on the kit's module, a worker ran it a second time beside the
    # package's copy, and runpy warned so; the workers inherit this filter, which makes
    # that warning kill them before they start the group.
    monkeypatch.setenv("PYTHONWARNINGS", "error::RuntimeWarning:runpy")
    outcomes = run("cpu", registry=isolated_registry(), promises=["distributed.all_reduce"])
    assert outcomes == [Outcome("distributed.all_reduce", "passed")]


LIMITS_MODULE = """
from accel.testing.conformance import Limits

LIMITS = Limits(compile="the kit's own test declares it", random="and this one")
"""


def test_the_cli_prints_a_row_per_promise_and_names_each_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "kit_limits.py").write_text(LIMITS_MODULE)
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report.json"
    status = main(
        [
            "conformance",
            "cpu",
            "--limits",
            "kit_limits:LIMITS",
            "--promise",
            "step.compile",
            "--promise",
            "generators",
            "--json",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    rows = [line.split() for line in out.splitlines()[:2]]
    assert rows[0][:4] == ["skipped", "step.compile", "declared:", "no"]
    assert rows[1] == ["passed", "generators.manual_seed_host"]
    assert "5 passed, 0 failed, 2 skipped" in out
    assert "  skipped generators.manual_seed_device: declared: no random (and this one)" in out
    stored = json.loads(report.read_text())
    assert stored[0] == {
        "promise": "step.compile",
        "outcome": "skipped",
        "reason": "declared: no compile (the kit's own test declares it)",
    }
    assert {row["outcome"] for row in stored[1:]} == {"passed", "skipped"}


def test_the_cli_exits_1_when_a_promise_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import accel.testing.conformance._runner as runner

    monkeypatch.setattr(
        runner,
        "check_promise",
        lambda promise, subject: (_ for _ in ()).throw(AssertionError("planted")),
    )
    assert main(["conformance", "cpu", "--promise", "runtime.synchronize"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == "failed  runtime.synchronize  planted"


@pytest.mark.parametrize(
    ("name", "says"),
    [("npu", "unknown accelerator 'npu'"), ("tpu:7", "not available")],
)
def test_an_unknown_or_unavailable_accelerator_is_an_error_never_a_skip(
    name: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["conformance", name]) == 2
    assert says in capsys.readouterr().err


def test_pytest_runs_the_kit_with_declared_skips_named_in_the_summary(tmp_path: Path) -> None:
    (tmp_path / "kit_limits.py").write_text(LIMITS_MODULE)
    result = run_kit_under_pytest(
        "--accelerator",
        "cpu",
        "--accel-limits",
        "kit_limits:LIMITS",
        "-k",
        "selection or moves or compile or manual_seed",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "9 passed, 2 skipped" in result.stdout
    summary = result.stdout.partition("promises skipped by declared limits")[2]
    assert "step.compile: declared: no compile (the kit's own test declares it)" in summary
    assert "generators.manual_seed_device: declared: no random (and this one)" in summary


def test_pytest_on_an_unavailable_accelerator_is_one_usage_error(tmp_path: Path) -> None:
    result = run_kit_under_pytest("--accelerator", "tpu", "-k", "selection", cwd=tmp_path)
    assert result.returncode == 4, (result.stdout, result.stderr)
    errors = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("ERROR: accel conformance kit, --accelerator 'tpu': ")
    ]
    assert len(errors) == 1, result.stderr
    assert "is not available" in errors[0], errors[0]
    assert "error" not in result.stdout.lower(), result.stdout
