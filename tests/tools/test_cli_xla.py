"""The `accel` command with real torch_xla on XLA:CPU (the XLA tier, PJRT_DEVICE=CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import accel
from accel.tools.cli import main
from helpers.processes import ACCEL_SCRIPT, last_json_line, run_command, run_python

pytestmark = pytest.mark.xla

REPO = Path(__file__).resolve().parents[2]
FACTORIES = "tests.helpers.cli_factories"


@pytest.fixture(autouse=True)
def _xla_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setattr(accel, "_default_registry", None)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _fields(out: str) -> dict[str, str]:
    return dict(line.strip().split(": ", 1) for line in out.splitlines() if ": " in line)


def test_info_tpu(capsys: pytest.CaptureFixture[str]) -> None:
    import torch_xla

    code, out, err = _run(capsys, "info", "tpu")
    assert code == 0, err
    fields = _fields(out)
    assert fields["accelerator"] == "tpu"
    assert fields["device"] == "xla:0"
    assert int(fields["device_count"]) >= 1
    assert fields["distributed_backend"] == "xla"
    assert fields["torch_xla"] == torch_xla.__version__.split("+")[0]
    assert not [line for line in out.splitlines() if line.startswith("problem: ")]
    # Figures where the runtime has them; XLA:CPU keeps none and that is said, not fatal.
    assert "memory:" in out.splitlines() or fields["memory"].startswith("not reported (")


def test_info_xla_alias_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "info", "xla", "--json")
    assert code == 0
    report = json.loads(out)
    assert (report["accelerator"], report["device"]) == ("tpu", "xla:0")
    assert report["versions"]["torch_xla"] != "not installed"
    assert report["problems"] == []  # the real pair: torch 2.9.1 with torch_xla 2.9.0


def test_list_shows_tpu_available_but_not_for_auto(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "list")
    assert code == 0
    table = out.strip().split("\n\n")[0]  # the footer states auto's rule
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert rows["tpu"].split()[:3] == ["tpu", "xla", "yes"]
    assert "not chosen by auto (PJRT device type CPU)" in rows["tpu"]


def test_check_a_tied_model_on_tpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "check", f"{FACTORIES}:tied_model", "--accelerator", "tpu")
    assert code == 0, err
    assert "tied groups: 1" in out
    assert "moving to xla:0 (tpu)" in out
    assert "tied group: embed.weight, head.weight: held" in out
    assert "unique parameters: before move 3, after move 3" in out
    assert out.splitlines()[-1] == "every tie held: yes"


def test_check_a_model_whose_tie_weights_unties(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", f"{FACTORIES}:untying_model", "--accelerator", "tpu")
    assert code == 1
    assert "validation FAILED:" in out
    assert "Layer count: [Before: 3 After: 4]" in out
    assert "embed.weight, head.weight" in out


def test_demo_on_tpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "demo", "--accelerator", "tpu", "--steps", "3")
    assert code == 0, err
    assert out.startswith("accelerator: tpu (Google TPUs via torch_xla (PJRT))")
    assert "device: xla:0" in out
    assert "every tie held: yes" in out
    assert "ties still held after training: yes" in out
    assert len([line for line in out.splitlines() if line.startswith("step")]) == 2


def test_check_through_the_console_script_on_tpu() -> None:
    result = run_command(
        [ACCEL_SCRIPT, "check", f"{FACTORIES}:untying_model", "-a", "tpu"],
        env={"PJRT_DEVICE": "CPU"},
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert "validation FAILED:" in result.stdout
    assert "Traceback" not in result.stderr


def test_nothing_imports_torch_xla_unless_tpu_is_asked_about() -> None:
    code = """
import json, sys
from accel.tools.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
torch_after_help = "torch" in sys.modules
main(["list"])
main(["info", "cpu"])
main(["demo", "-a", "cpu", "--steps", "1"])
print(json.dumps({"torch": torch_after_help, "torch_xla": "torch_xla" in sys.modules}))
"""
    result = run_python(code, drop_prefixes=("ACCEL_", "PJRT_"), cwd=REPO, timeout=300)
    report = last_json_line(result)
    assert "tpu" in result.stdout  # listed, as unavailable without PJRT_DEVICE
    assert report == {"torch": False, "torch_xla": False}
