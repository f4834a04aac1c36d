"""XLA SPMD checkpoints through save_sharded / load_sharded: a run over two XLA:CPU
devices (one weight sharded over them, the batch too) is killed after a checkpoint,
resumed in a new process, and ends where an uninterrupted run ends.

Fresh interpreters, as in test_spmd.py: torch_xla reads CPU_NUM_DEVICES once, when
its runtime starts."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from accel.training.checkpoint._atomic import TEMPORARY_MARK
from accel.training.checkpoint._retention import list_checkpoints
from helpers.distributed import SCRIPTS, no_launcher_and_no_group  # noqa: F401
from helpers.processes import run_python

#: Resume is exact on XLA:CPU (measured: equal bit for bit); the tolerance allows for
#: a compiler that reorders float sums between the two processes' graphs.
TOLERANCE = 1e-6


def _run(directory: Path, **env: str) -> int:
    result = run_python(
        [SCRIPTS / "spmd_resume.py", str(directory)],
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2", **env},
        timeout=300,
    )
    if result.returncode not in (0, -signal.SIGKILL):
        # A run that failed rather than being killed: its output is the only clue.
        print(f"spmd_resume.py {directory.name} {env} exited {result.returncode}:")
        print(result.stdout)
        print(result.stderr[-8000:])
    return result.returncode


def _final(directory: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((directory / "final.json").read_text())
    return loaded


@pytest.mark.xla
def test_spmd_killed_after_a_checkpoint_resumes_equal_to_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    assert _run(tmp_path / "reference") == 0
    reference = _final(tmp_path / "reference")

    run = tmp_path / "run"
    assert _run(run, KILL_AFTER_STEP="4") != 0  # SIGKILL-ed after step 4
    assert [p.name for p in list_checkpoints(run)] == ["step-000000003.pt"]
    checkpoint = run / "step-000000003.pt"
    assert (checkpoint / ".metadata").is_file()  # a DCP directory, written whole
    assert not [p for p in run.iterdir() if TEMPORARY_MARK in p.name]
    assert not (run / "final.json").exists()

    assert _run(run) == 0
    resumed = _final(run)
    assert resumed["resumed_from"] == "step-000000003.pt"
    assert resumed["num_devices"] == 2
    # The sharded weight is loaded back into its shards; the tie is the same object.
    assert resumed["body_sharding_after_load"] == "{devices=[2,1]0,1}"
    assert resumed["tied_after_load"] and resumed["tied"]
    assert resumed["devices_after_load"] == ["xla:0"]
    assert resumed["adam_steps"] == reference["adam_steps"] == [6.0, 6.0, 6.0]
    assert resumed["parameters"].keys() == reference["parameters"].keys()
    for name, values in reference["parameters"].items():
        assert resumed["parameters"][name] == pytest.approx(values, abs=TOLERANCE), name


@pytest.mark.xla
def test_under_spmd_an_entry_the_checkpoint_lacks_is_a_key_error_naming_it(
    tmp_path: Path,
) -> None:
    result = run_python(
        [SCRIPTS / "spmd_missing_entry.py", str(tmp_path)],
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout
    errors = json.loads((tmp_path / "errors.json").read_text())
    # torch_xla's load planner found the model's entries missing: accel's error, not DCP's.
    assert errors["model"]["key_error"], errors["model"]
    assert "state['model']" in errors["model"]["message"]
    assert "'model.0.body.weight'" in errors["model"]["message"]
    assert errors["plain"]["key_error"], errors["plain"]
    assert "state['epoch']" in errors["plain"]["message"]
