"""The `accel` command: every subcommand and option, its output and its exit status.

Most tests call ``accel.tools.cli.main`` in-process (fast); a few run the real thing, once
each through ``python -m accel`` and through the ``accel`` console script, from the
repository root so that ``tests.helpers.cli_factories`` is importable by ``accel check``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
import accel.tools._demo
from accel.tools.cli import main
from helpers.installing import install_fixture_distributions, write_distribution
from helpers.processes import ACCEL_SCRIPT, last_json_line, run_command, run_python
from helpers.replacing import ReplacingAccelerator

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_PROVIDER = "accel-example-plugin 0.1.0"
FACTORIES = "tests.helpers.cli_factories"
INFO_FIELDS = {field.name for field in dataclasses.fields(accel.AcceleratorInfo)}

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def _fresh_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees a default registry of its own: built-ins plus installed plugins.

    sys.path is restored too: `accel check` puts the current directory on it.
    """
    monkeypatch.setattr(accel, "_default_registry", None)
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``accel ARGS`` in-process: (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help and usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


#: The real `accel` runs from the repository root, so that `accel check` can import
#: tests.helpers.cli_factories, with neither accel's variables nor a PJRT device.
NOT_INHERITED = ("ACCEL_", "PJRT_")


def python(code_or_args: str | list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` or ``python ARGS`` in a fresh process (see NOT_INHERITED)."""
    return run_python(code_or_args, env=env, drop_prefixes=NOT_INHERITED, cwd=REPO, timeout=180)


def accel_script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The `accel` console script pip installed, the same way."""
    return run_command(
        [ACCEL_SCRIPT, *args], env=env, drop_prefixes=NOT_INHERITED, cwd=REPO, timeout=180
    )


def assert_one_error_line(err: str, *fragments: str) -> str:
    """stderr is exactly one ``accel: error:`` line, without a traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("accel: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], err
    return lines[0]


def table(out: str) -> tuple[list[str], dict[str, str]]:
    """The header's column names and each row's line, keyed by the row's name."""
    lines = out.strip().splitlines()
    header, *rows = lines[: lines.index("")] if "" in lines else lines  # the table, no footer
    return header.split(), {row.split()[0]: row for row in rows}


# -- --help and start-up cost ------------------------------------------------------


def test_top_level_help(cli: Run) -> None:
    code, out, err = cli("--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: accel [-h] [--debug] [--version] COMMAND ...")
    for command in ("list", "info", "demo", "check", "--debug"):
        assert command in out
    assert "exit status: 0 ok, 1 ties came apart, 2 error, 130 interrupted" in out


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("list", ["usage: accel list", "--json", "--debug"]),
        ("info", ["usage: accel info", "[NAME]", "--json", "ACCEL_ACCELERATOR"]),
        ("demo", ["usage: accel demo", "-a", "--steps", "(20)", "$ACCEL_ACCELERATOR, else auto"]),
        ("check", ["usage: accel check", "MODULE:FACTORY", "$ACCEL_ACCELERATOR, else auto"]),
    ],
)
def test_subcommand_help(cli: Run, command: str, expected: list[str]) -> None:
    code, out, err = cli(command, "--help")
    assert code == 0 and err == ""
    for fragment in expected:
        assert fragment in out


def test_no_command_or_an_unknown_one_is_a_usage_error(cli: Run) -> None:
    code, out, err = cli()
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("accel: error: ")
    assert "COMMAND" in err
    code, _, err = cli("frobnicate")
    assert code == 2
    assert "invalid choice: 'frobnicate'" in err


def test_version_prints_the_version(cli: Run) -> None:
    code, out, err = cli("--version")
    assert code == 0 and err == ""
    assert out == f"accel {accel.__version__}\n"


def test_version_does_not_import_torch() -> None:
    code = """
import json, sys
from accel.tools.cli import main
try:
    main(["--version"])
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "torch": "torch" in sys.modules}))
"""
    result = python(code)
    assert result.stdout.startswith("accel ")
    assert last_json_line(result) == {"status": 0, "torch": False}


def test_help_does_not_import_torch_nor_list_and_info_torch_xla() -> None:
    code = """
import json, sys
from accel.tools.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
after_help = "torch" in sys.modules
main(["list"])
main(["info", "cpu"])
print(json.dumps({"torch_after_help": after_help, "torch_xla": "torch_xla" in sys.modules}))
"""
    report = last_json_line(python(code))  # PJRT_DEVICE is unset
    assert report == {"torch_after_help": False, "torch_xla": False}


def test_the_console_script_help_imports_no_torch() -> None:
    result = accel_script("--help", PYTHONPROFILEIMPORTTIME="1")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: accel")
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
    assert "accel.tools.cli" in imported  # the import profile really was recorded
    assert not [name for name in imported if name.split(".")[0] in {"torch", "torch_xla"}]


# -- list ------------------------------------------------------------------------------


def test_list_prints_a_row_per_accelerator(cli: Run) -> None:
    code, out, err = cli("list")
    assert code == 0 and err == ""
    header, rows = table(out)
    assert header == ["NAME", "ALIASES", "AVAILABLE", "DEVICES", "PRIORITY", "PROVIDER", "NOTES"]
    infos = accel.AcceleratorRegistry().list_accelerators()
    assert list(rows) == [info.name for info in infos]  # highest priority first
    for info in infos:
        cells = rows[info.name].split()
        assert cells[1] == (",".join(info.aliases) or "-")
        assert cells[2] == ("yes" if info.available else "no")
        assert cells[3:5] == [str(info.device_count), str(info.priority)]
        assert info.provider in rows[info.name]
        if not info.available:
            assert info.reason in rows[info.name]
            assert f"to enable: {info.remedy}" in rows[info.name]
    cpu = next(info for info in infos if info.name == "cpu")
    assert rows["cpu"].split()[1:6] == ["-", "yes", str(cpu.device_count), "0", "built-in"]


def test_list_shows_the_installed_example_plugin(cli: Run) -> None:
    _, out, _ = cli("list")
    xpu = table(out)[1]["xpu"]
    assert xpu.split()[:5] == ["xpu", "intel-gpu", "no", "0", "90"]
    assert EXAMPLE_PROVIDER in xpu
    assert "no Intel GPU visible" in xpu


def test_list_marks_an_available_accelerator_auto_passes_over(cli: Run) -> None:
    from helpers.fakes import FakeAccelerator

    accel.default_registry().register(FakeAccelerator("manual", priority=7, auto=False))
    _, out, _ = cli("list")
    row = table(out)[1]["manual"]
    assert row.split()[:5] == ["manual", "-", "yes", "1", "7"]
    assert "not chosen by auto (fake says no)" in row


def test_list_says_which_accelerator_auto_picks_and_why(cli: Run) -> None:
    from helpers.fakes import FakeAccelerator

    # Equal priorities: the name decides, whatever the registration order.
    accel.default_registry().register(FakeAccelerator("zeta", priority=5))
    accel.default_registry().register(FakeAccelerator("beta", priority=5))
    _, out, _ = cli("list")
    rows = table(out)[1]
    assert "chosen by auto" in rows["beta"]
    assert "chosen by auto" not in rows["zeta"] and "chosen by auto" not in rows["cpu"]
    assert out.strip().splitlines()[-1] == (
        "auto picks the available accelerator with the highest priority, ties broken by "
        "name (never by install order): here 'beta'."
    )
    assert accel.get_accelerator("auto").name == "beta"


def test_list_json_has_the_accelerator_info_fields(cli: Run) -> None:
    code, out, err = cli("list", "--json")
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert [row["name"] for row in rows] == [
        info.name for info in accel.AcceleratorRegistry().list_accelerators()
    ]
    assert all(set(row) == INFO_FIELDS for row in rows)
    by_name = {row["name"]: row for row in rows}
    assert by_name["cpu"]["available"] is True and by_name["cpu"]["device_count"] >= 1
    assert by_name["cpu"]["provider"] == "built-in" and by_name["cpu"]["aliases"] == []
    assert by_name["xpu"]["provider"] == EXAMPLE_PROVIDER
    assert by_name["xpu"]["aliases"] == ["intel-gpu"]


@pytest.fixture(scope="session")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """accel-broken-plugin (fails on import), installed into a private directory."""
    return install_fixture_distributions(
        tmp_path_factory.mktemp("broken-site"), "accel-broken-plugin"
    )


def test_list_shows_a_failed_plugin_through_python_m(broken_site: Path) -> None:
    result = python(["-m", "accel", "list"], PYTHONPATH=str(broken_site))
    assert result.returncode == 0, result.stderr
    row = table(result.stdout)[1]["broken"]
    assert row.split()[:5] == ["broken", "-", "no", "0", "0"]
    assert "accel-broken-plugin 0.0.1" in row
    assert "plugin failed to load: ImportError: libfancyaccel.so.3" in row
    assert "fix or uninstall" in row
    assert "cpu" in table(result.stdout)[1]  # the others still work
    # The plugin warning is one line, without the source line Python would show.
    (warning,) = result.stderr.strip().splitlines()
    assert warning.startswith("accel: warning: PluginWarning: accel plugin 'broken'")


def test_list_json_shows_a_failed_plugin(
    cli: Run, broken_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(broken_site))
    code, out, err = cli("list", "--json")
    assert code == 0
    broken = {row["name"]: row for row in json.loads(out)}["broken"]
    assert set(broken) == INFO_FIELDS
    assert broken["available"] is False
    assert broken["provider"] == "accel-broken-plugin 0.0.1"
    assert broken["reason"].startswith("plugin failed to load: ImportError: libfancyaccel")
    assert err.startswith("accel: warning: PluginWarning: ")
    # ...and asking for it by name is one error line that points at `accel list`.
    code, _, err = cli("info", "broken")
    assert code == 2
    assert_one_error_line(err, "failed to load; see accel list")


# -- info ------------------------------------------------------------------------------


def _info_lines(out: str) -> dict[str, str]:
    return dict(line.strip().split(": ", 1) for line in out.splitlines() if ": " in line)


def test_info_cpu_has_what_a_bug_report_needs(cli: Run) -> None:
    code, out, err = cli("info", "cpu")
    assert code == 0 and err == ""
    fields = _info_lines(out)
    assert fields["accelerator"] == "cpu"
    assert fields["description"] == "the host CPU"
    assert fields["device"] == "cpu"
    assert fields["device_count"] == str(accel.get_accelerator("cpu").device_count())
    assert fields["distributed_backend"] == "gloo"
    # The CPU's memory_stats hook: the process's resident memory and the machine's RAM.
    assert "memory:" in out.splitlines()
    assert int(fields["allocated_bytes"]) > 0 and int(fields["total_bytes"]) > 0
    assert "versions:" in out.splitlines()
    assert fields["python"] == sys.version.split()[0]
    assert fields["torch"] == importlib.metadata.version("torch")
    assert fields["pluggy"] == importlib.metadata.version("pluggy")
    assert fields["accel"] == accel.__version__  # the running code's, installed or not
    assert "torch_xla" in fields  # a version, or "not installed"


def test_info_without_a_name_is_the_auto_choice(cli: Run) -> None:
    code, out, _ = cli("info")
    assert code == 0
    expected = accel.AcceleratorRegistry().get_accelerator()
    assert _info_lines(out)["accelerator"] == expected.name
    assert _info_lines(out)["device"] == str(expected.device)


def test_info_without_a_name_reads_the_environment(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "cpu")
    code, out, _ = cli("info")
    assert code == 0 and _info_lines(out)["accelerator"] == "cpu"
    monkeypatch.setenv("ACCEL_ACCELERATOR", "nonsense")
    code, _, err = cli("info")
    assert code == 2
    assert_one_error_line(err, "'nonsense'", "$ACCEL_ACCELERATOR")


def test_info_json(cli: Run) -> None:
    code, out, err = cli("info", "cpu", "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert set(report) == {
        "accelerator",
        "provider",
        "description",
        "device",
        "device_count",
        "distributed_backend",
        "memory",
        "versions",
        "problems",
    }
    assert (report["accelerator"], report["device"]) == ("cpu", "cpu")
    assert set(report["memory"]) == {"allocated_bytes", "peak_allocated_bytes", "total_bytes"}
    assert isinstance(report["device_count"], int) and report["device_count"] >= 1
    assert set(report["versions"]) == {"python", "accel", "torch", "torch_xla", "pluggy"}
    assert report["versions"]["torch"] == importlib.metadata.version("torch")
    assert report["problems"] == []  # torch_xla absent (main tier) or matching (2.9.1)


def test_info_through_the_console_script_with_the_environment() -> None:
    result = accel_script("info", "--json", ACCEL_ACCELERATOR="cpu")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["accelerator"], report["distributed_backend"]) == ("cpu", "gloo")


class _MemoryReportingNpu:
    """An accelerator plugin with memory figures of its own, or failing to give them."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("npu", description="memory test")]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("cpu")

    @accel.hookimpl
    def memory_stats(self) -> dict[str, int | None]:
        if self.fail:
            raise RuntimeError("UNIMPLEMENTED: GetAllocatorStats is not supported\nmore detail")
        return {"allocated_bytes": 7, "peak_allocated_bytes": 11, "total_bytes": 13}


def test_info_reports_memory_through_the_memory_stats_hook(cli: Run) -> None:
    accel.default_registry().register(_MemoryReportingNpu())
    code, out, _ = cli("info", "npu", "--json")
    assert code == 0
    assert json.loads(out)["memory"] == {
        "allocated_bytes": 7,
        "peak_allocated_bytes": 11,
        "total_bytes": 13,
    }


def test_memory_figures_that_fail_are_reported_not_fatal(cli: Run) -> None:
    accel.default_registry().register(_MemoryReportingNpu(fail=True))
    code, out, _ = cli("info", "npu")
    assert code == 0
    assert _info_lines(out)["memory"] == (
        "not reported (RuntimeError: UNIMPLEMENTED: GetAllocatorStats is not supported)"
    )


def test_info_unknown_name_is_one_error_line(cli: Run) -> None:
    code, out, err = cli("info", "nonsense")
    assert code == 2 and out == ""
    assert_one_error_line(
        err, "AcceleratorNotFoundError: unknown accelerator 'nonsense'", "Known names:"
    )


def test_info_a_close_name_gets_a_suggestion(cli: Run) -> None:
    code, _, err = cli("info", "cpx")
    assert code == 2
    assert_one_error_line(err, "Did you mean 'cpu'?")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_info_unavailable_accelerator_is_one_error_line(cli: Run) -> None:
    code, out, err = cli("info", "cuda")
    assert code == 2 and out == ""
    assert_one_error_line(err, "AcceleratorUnavailableError: accelerator 'cuda'", "accel list")


def test_info_bad_device_index_is_one_error_line(cli: Run) -> None:
    code, _, err = cli("info", "cpu:7")
    assert code == 2
    assert_one_error_line(err, "AcceleratorUnavailableError: device index 7")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_lets_the_exception_through(where: str) -> None:
    args = ["--debug", "info", "nonsense"] if where == "before" else ["info", "nonsense", "--debug"]
    with pytest.raises(accel.AcceleratorNotFoundError, match="unknown accelerator 'nonsense'"):
        main(args)


def test_debug_shows_the_traceback_in_a_process() -> None:
    result = python(["-m", "accel", "--debug", "info", "nonsense"])
    assert result.returncode == 1  # Python's status for an uncaught exception
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert "accel.errors.AcceleratorNotFoundError: unknown accelerator" in result.stderr
    assert "accel: error:" not in result.stderr


# -- errors in general -----------------------------------------------------------------


def test_an_error_message_is_cut_to_its_first_line(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise ValueError("first line\nsecond line\nthird line")

    monkeypatch.setattr(accel, "list_accelerators", fail)
    code, out, err = cli("list")
    assert code == 2 and out == ""
    assert assert_one_error_line(err) == "accel: error: ValueError: first line"


def test_an_error_without_a_message_shows_its_type(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise RuntimeError

    monkeypatch.setattr(accel, "list_accelerators", fail)
    code, _, err = cli("list", "--json")
    assert code == 2
    assert assert_one_error_line(err) == "accel: error: RuntimeError"


def test_interrupted_exits_130(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(accel, "list_accelerators", interrupt)
    code, out, err = cli("list")
    assert (code, out, err) == (130, "", "accel: interrupted\n")
    with pytest.raises(KeyboardInterrupt):
        main(["--debug", "list"])


def test_a_reader_that_goes_away_is_not_an_error(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    def gone() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(accel, "list_accelerators", gone)
    assert cli("list") == (141, "", "")  # `accel list | head -1`: 128 + SIGPIPE, quietly


def test_main_leaves_the_warning_display_as_it_found_it(cli: Run) -> None:
    before = warnings.showwarning
    cli("info", "cpu")
    cli("info", "nonsense")
    assert warnings.showwarning is before


# -- demo ------------------------------------------------------------------------------


def test_demo_moves_and_trains_on_the_cpu(cli: Run) -> None:
    code, out, err = cli("demo", "--steps", "3", "--accelerator", "cpu")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "accelerator: cpu (the host CPU)"
    assert lines[1] == "device: cpu"
    before, after = (int(word.rstrip(",")) for word in lines[2].split()[-4::3])
    assert lines[2] == f"unique parameters: before move {before}, after move {after}"
    assert before == after
    assert "tied group: embed.weight, head.weight: held" in lines
    assert "every tie held: yes" in lines
    losses = [float(line.split()[-1]) for line in lines if line.startswith("step")]
    assert [line.split()[1] for line in lines if line.startswith("step")] == ["1", "3"]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert lines[-1] == "ties still held after training: yes"


def test_demo_takes_the_short_option_and_the_environment(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = cli("demo", "-a", "cpu", "--steps", "1")
    assert code == 0 and "device: cpu" in out
    monkeypatch.setenv("ACCEL_ACCELERATOR", "cpu")
    code, out, _ = cli("demo", "--steps", "1")
    assert code == 0 and out.startswith("accelerator: cpu")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "expected a positive integer, got 0"),
        ("-2", "expected a positive integer, got -2"),
        ("x", "expected a positive integer, got 'x'"),
    ],
)
def test_demo_steps_must_be_a_positive_integer(cli: Run, value: str, message: str) -> None:
    code, out, err = cli("demo", "--steps", value)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == f"accel demo: error: argument --steps: {message}"


def test_demo_unknown_accelerator_is_one_error_line(cli: Run) -> None:
    code, _, err = cli("demo", "--accelerator", "nonsense", "--steps", "1")
    assert code == 2
    assert_one_error_line(err, "unknown accelerator 'nonsense'")


def test_demo_exit_1_when_ties_break(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    def untied(accelerator: str | None, *, steps: int) -> accel.tools._demo.DemoReport:
        return accel.tools._demo.DemoReport("cpu", "cpu", 5, 6, [("a", "b")], ties_held=False)

    monkeypatch.setattr(accel.tools._demo, "run_demo", untied)
    assert cli("demo", "--steps", "1")[0] == 1

    def raises(accelerator: str | None, *, steps: int) -> accel.tools._demo.DemoReport:
        raise accel.WeightTyingError(
            "Layer count: [Before: 3 After: 4]\nbroken: a, b",
            count_before=3,
            count_after=4,
            broken_groups=[("a", "b")],
        )

    monkeypatch.setattr(accel.tools._demo, "run_demo", raises)
    code, out, _ = cli("demo", "--steps", "1")
    assert code == 1
    assert out.startswith("validation FAILED:\nLayer count: [Before: 3 After: 4]")


def test_demo_through_the_console_script() -> None:
    result = accel_script("demo", "--steps", "2", "-a", "cpu")
    assert result.returncode == 0, result.stderr
    assert "every tie held: yes" in result.stdout
    assert "step   2  loss" in result.stdout


# -- check -----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [f"{FACTORIES}:tied_model", f"{FACTORIES}:Factories.tied"])
def test_check_a_tied_model_on_the_cpu(cli: Run, spec: str) -> None:
    code, out, err = cli("check", spec, "--accelerator", "cpu")
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "model: TiedLM, 3 unique parameters",
        "tied groups: 1",
        "  parameters: embed.weight, head.weight",
        "moving to cpu (cpu)",
        "unique parameters: before move 3, after move 3",
        "tied group: embed.weight, head.weight: held",
        "every tie held: yes",
    ]


def test_check_a_model_without_ties(cli: Run) -> None:
    code, out, _ = cli("check", f"{FACTORIES}:untied_model", "-a", "cpu")
    assert code == 0
    assert "tied groups: 0" in out
    assert out.splitlines()[-1] == "every tie held: yes"


def test_check_uses_the_environment_for_the_accelerator(
    cli: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "cpu")
    code, out, _ = cli("check", "helpers.cli_factories:own_tie_weights")  # tests/ is on sys.path
    assert code == 0
    assert "model: OwnTieWeights" in out and "moving to cpu (cpu)" in out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected MODULE:FACTORY such as 'mypkg.models:build', got 'no_colon'"),
        (":tied_model", "expected MODULE:FACTORY"),
        (f"{FACTORIES}:", "expected MODULE:FACTORY"),
        ("tests.no_such_module:build", "cannot import module 'tests.no_such_module'"),
        (f"{FACTORIES}:no_such_factory", f"module '{FACTORIES}' has no attribute"),
        (f"{FACTORIES}:NOT_CALLABLE", "is not callable (found int)"),
        (f"{FACTORIES}:not_a_module", "not_a_module returned dict, not a torch.nn.Module"),
        (
            f"{FACTORIES}:raising",
            f"{FACTORIES}:raising() raised RuntimeError: cannot build the model",
        ),
    ],
)
def test_check_bad_factories_are_one_error_line(cli: Run, spec: str, message: str) -> None:
    code, out, err = cli("check", spec, "-a", "cpu")
    assert code == 2 and out == ""
    line = assert_one_error_line(err, message)
    assert not line.startswith("accel: error: CliError")  # the CLI's own errors: no type


def test_check_debug_raises_with_the_cause() -> None:
    with pytest.raises(Exception, match="raised RuntimeError") as info:
        main(["check", f"{FACTORIES}:raising", "--debug"])
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(Exception, match="cannot import module") as info:
        main(["--debug", "check", "tests.no_such_module:build"])
    assert isinstance(info.value.__cause__, ImportError)


def test_check_unknown_accelerator_is_one_error_line(cli: Run) -> None:
    code, _, err = cli("check", f"{FACTORIES}:tied_model", "-a", "nonsense")
    assert code == 2
    assert_one_error_line(err, "unknown accelerator 'nonsense'")


@pytest.fixture
def default_is_meta_tpu(meta_tpu: accel.Accelerator, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`accel check` gets the TPU plugin's hooks moving to `meta`, which unties like XLA."""

    def get_accelerator(name: str | None = None, **kwargs: Any) -> accel.Accelerator:
        assert name == "tpu"
        return meta_tpu

    monkeypatch.setattr(accel, "get_accelerator", get_accelerator)
    return meta_tpu


def test_check_on_meta_tpu_reties_a_tied_model(cli: Run, default_is_meta_tpu: Any) -> None:
    code, out, _ = cli("check", f"{FACTORIES}:tied_model", "-a", "tpu")
    assert code == 0
    assert "moving to meta (tpu)" in out
    assert "tied group: embed.weight, head.weight: held" in out
    assert "unique parameters: before move 3, after move 3" in out


def test_check_on_meta_tpu_fails_validation_when_tie_weights_unties(
    cli: Run, default_is_meta_tpu: Any
) -> None:
    code, out, err = cli("check", f"{FACTORIES}:untying_model", "-a", "tpu")
    assert code == 1 and err == ""
    assert "tied groups: 1" in out
    assert "validation FAILED:" in out
    assert "Layer count: [Before: 3 After: 4]" in out
    assert "every tie held: yes" not in out


def test_check_keeps_the_ties_tie_weights_would_break_when_validation_is_off(
    cli: Run, default_is_meta_tpu: accel.Accelerator
) -> None:
    default_is_meta_tpu.tie_check = "off"
    code, out, _ = cli("check", f"{FACTORIES}:untying_model", "-a", "tpu")
    assert code == 0  # a move never changes which tensors are tied, in any mode
    assert "tied group: embed.weight, head.weight: held" in out
    assert "unique parameters: before move 3, after move 3" in out
    assert out.splitlines()[-1] == "every tie held: yes"


def test_check_shows_a_tying_warning_as_one_line(
    cli: Run, default_is_meta_tpu: accel.Accelerator
) -> None:
    default_is_meta_tpu.tie_check = "warn"
    code, out, err = cli("check", f"{FACTORIES}:untying_model", "-a", "tpu")
    assert code == 0  # warned, and the ties the model had are kept
    assert out.splitlines()[-1] == "every tie held: yes"
    (warning,) = err.strip().splitlines()
    assert warning.startswith("accel: warning: TyingWarning: ")


def test_check_through_python_m_and_the_console_script() -> None:
    result = python(["-m", "accel", "check", f"{FACTORIES}:tied_model", "-a", "cpu"])
    assert result.returncode == 0, result.stderr
    assert "every tie held: yes" in result.stdout
    result = accel_script("check", f"{FACTORIES}:not_a_module")
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "returned dict, not a torch.nn.Module")


def test_check_debug_traceback_through_the_console_script() -> None:
    result = accel_script("--debug", "check", f"{FACTORIES}:raising")
    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr
    assert "RuntimeError: cannot build the model: config.json missing" in result.stderr
    assert "CliError: tests.helpers.cli_factories:raising() raised RuntimeError" in result.stderr


def test_commands_are_quiet_about_a_missing_numpy(tmp_path: Path) -> None:
    """torch warns "Failed to initialize NumPy" at import where NumPy is missing (the
    README's venv has none); accel's commands never use NumPy, so they do not pass it on."""
    # None in sys.modules: `import numpy` raises ModuleNotFoundError, as if not installed.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['numpy'] = None\n")
    site = os.pathsep.join([str(tmp_path), str(REPO)])
    plain = python(["-c", "import torch"], PYTHONPATH=site)
    assert "Failed to initialize NumPy" in plain.stderr  # the situation is real
    result = python(["-m", "accel", "demo", "-a", "cpu", "--steps", "1"], PYTHONPATH=site)
    assert result.returncode == 0, result.stderr
    assert "NumPy" not in result.stderr
    assert "every tie held: yes" in result.stdout


def test_list_shows_why_auto_passes_over_a_plugin_whose_get_device_fails(cli: Run) -> None:
    from helpers.fakes import FakeAccelerator

    class NonsenseDevice(FakeAccelerator):
        @accel.hookimpl
        def get_device(self, index: int | None) -> Any:
            return "npu:0"

    accel.default_registry().register(NonsenseDevice("npu", priority=500))
    accel.default_registry().register(FakeAccelerator("second", priority=400))
    code, out, _ = cli("list")  # in a fresh registry: nothing selected before
    assert code == 0
    rows = table(out)[1]
    assert rows["npu"].split()[:3] == ["npu", "-", "no"]
    assert "get_device failed: PluginError: hook 'get_device'" in rows["npu"]
    assert "chosen by auto" in rows["second"]
    assert out.strip().splitlines()[-1].endswith(": here 'second'.")


def test_check_judges_the_module_the_move_returned(cli: Run) -> None:
    # The plugin's move returns a tied copy and leaves the model it was given untied.
    accel.default_registry().register(ReplacingAccelerator("replacer"))
    code, out, _ = cli("check", f"{FACTORIES}:tied_model", "-a", "replacer")
    assert code == 0, out
    assert "tied group: embed.weight, head.weight: held" in out.splitlines()
    assert "unique parameters: before move 3, after move 3" in out.splitlines()
    assert out.splitlines()[-1] == "every tie held: yes"


_VENDOR_PLUGIN = """
import accel

@accel.hookimpl
def register_accelerators():
    return [accel.AcceleratorSpec("vendorq")]

@accel.hookimpl
def is_available():
    return accel.Availability(True, auto=False)

@accel.hookimpl
def device_count():
    return 1

@accel.hookimpl
def get_device(index):
    import torch
    return torch.device("cpu")
"""


def test_info_names_the_plugins_distribution_and_version(
    cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # For a bug report: who shipped the accelerator's plugin.
    write_distribution(
        tmp_path,
        "accel-vendorq",
        group="accel",
        entry_points={"vendorq": "accel_cli_test_vendorq"},
        modules={"accel_cli_test_vendorq": _VENDOR_PLUGIN},
        version="2.3.1",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = cli("info", "vendorq")
    assert (code, err) == (0, "")
    assert _info_lines(out)["provider"] == "accel-vendorq 2.3.1"
    code, out, _ = cli("info", "cpu", "--json")
    assert json.loads(out)["provider"] == "built-in"


def test_help_names_arguments_as_the_docs_do(cli: Run) -> None:
    code, out, _ = cli("info", "--help")
    assert code == 0
    assert "accel info [-h] [--debug] [--json] [NAME]" in " ".join(out.split())
    for command in ("demo", "check"):
        _, out, _ = cli(command, "--help")
        assert "--accelerator NAME, -a NAME" in out
