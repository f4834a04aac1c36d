"""What the `accel` command tells a user about their setup: a bad $ACCEL_ACCELERATOR,
a torch/torch_xla mismatch, and exception types a user can look up and catch.
"""

from __future__ import annotations

import importlib.metadata
import json
import warnings

import pytest

import accel
from accel.plugins import _xla_versions
from accel.tools.cli import main

Run = tuple[int, str, str]


@pytest.fixture(autouse=True)
def _fresh_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "_default_registry", None)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# -- $ACCEL_ACCELERATOR in `accel list` ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ("tpuu", ["AcceleratorNotFoundError: unknown accelerator 'tpuu'", "Did you mean 'tpu'?"]),
        ("cpu:x", ["ValueError: ", "'cpu:x'"]),
        ("cpu:3", ["AcceleratorUnavailableError: "]),
    ],
)
@pytest.mark.parametrize("json_output", [False, True])
def test_list_warns_when_the_default_accelerator_cannot_be_used(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    fragments: list[str],
    json_output: bool,
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", value)
    code, out, err = cli(capsys, "list", *(["--json"] if json_output else []))
    assert code == 0  # listing still works: the table is what the user needs to fix it
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"accel: warning: $ACCEL_ACCELERATOR={value!r} cannot be used, so "
        "accel.get_accelerator() without a name fails: "
    )
    for fragment in fragments:
        assert fragment in lines[0]
    if json_output:
        assert {row["name"] for row in json.loads(out)} >= {"cpu", "tpu"}  # stdout stays JSON
    else:
        assert out.startswith("NAME ")


@pytest.mark.parametrize("value", ["cpu", " CPU ", "auto", ""])
def test_list_is_quiet_about_a_usable_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", value)
    code, _, err = cli(capsys, "list")
    assert (code, err) == (0, "")


# -- public exception types only -------------------------------------------------------


class _PrivateConflict(accel.PluginError):
    """Stands in for a private subclass such as the registry's name-conflict error."""


class _PrivatePluginWarning(accel.PluginWarning):
    pass


def test_an_error_of_a_private_class_shows_its_public_base(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail() -> None:
        raise _PrivateConflict("name 'xpu' is claimed by two distributions")

    monkeypatch.setattr(accel, "list_accelerators", fail)
    code, _, err = cli(capsys, "list")
    assert code == 2
    assert err == "accel: error: PluginError: name 'xpu' is claimed by two distributions\n"


def test_a_warning_of_a_private_class_shows_its_public_base(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_list = accel.list_accelerators

    def warn_then_list() -> list[accel.AcceleratorInfo]:
        warnings.warn("plugin 'x' was skipped", _PrivatePluginWarning, stacklevel=1)
        return real_list()

    monkeypatch.setattr(accel, "list_accelerators", warn_then_list)
    code, _, err = cli(capsys, "list")
    assert code == 0
    assert err == "accel: warning: PluginWarning: plugin 'x' was skipped\n"


# -- torch/torch_xla mismatch in `accel info` --------------------------------------------


@pytest.fixture
def mismatched_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata says torch_xla 2.9.0 sits next to torch 2.13.0 (nothing is imported)."""
    fake = {"torch": "2.13.0", "torch_xla": "2.9.0"}

    def version(distribution: str) -> str:
        if distribution in fake:
            return fake[distribution]
        return importlib.metadata.version(distribution)

    monkeypatch.setattr(_xla_versions, "version", version)


def test_info_names_a_mismatched_pair_and_the_command_that_fixes_it(
    capsys: pytest.CaptureFixture[str], mismatched_pair: None
) -> None:
    code, out, err = cli(capsys, "info", "cpu")
    assert code == 0 and err == ""
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problems == [
        "problem: torch_xla 2.9.0 needs torch 2.9.x, but torch 2.13.0 is installed; "
        "to fix: pip install 'torch==2.9.*' 'torch_xla==2.9.*'"
    ]
    assert "  torch_xla: 2.9.0" in out.splitlines()


def test_info_json_lists_the_mismatch(
    capsys: pytest.CaptureFixture[str], mismatched_pair: None
) -> None:
    code, out, _ = cli(capsys, "info", "cpu", "--json")
    assert code == 0
    assert json.loads(out)["problems"] == [
        "torch_xla 2.9.0 needs torch 2.9.x, but torch 2.13.0 is installed; "
        "to fix: pip install 'torch==2.9.*' 'torch_xla==2.9.*'"
    ]


# -- every variable accel reads, checked by `accel list` ---------------------------------


@pytest.mark.parametrize("json_output", [False, True])
def test_list_reports_an_unrecognised_early_signals_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, json_output: bool
) -> None:
    monkeypatch.setenv("ACCEL_EARLY_SIGNALS", "maybe")
    code, out, err = cli(capsys, "list", *(["--json"] if json_output else []))
    assert code == 0
    (line,) = err.strip().splitlines()  # said once, though selection warns too
    assert line.startswith(
        "accel: warning: $ACCEL_EARLY_SIGNALS='maybe' is not a value accel recognises"
    )
    assert "'1', 'true', 'yes', 'on'" in line
    if json_output:
        assert {row["name"] for row in json.loads(out)} >= {"cpu"}


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("ACCEL_ACCELERATR", "ACCEL_ACCELERATOR"),
        ("ACCEL_PLUGIN", "ACCEL_PLUGINS"),
        ("accel_plugins", "ACCEL_PLUGINS"),
        ("ACCEL_EARLY_SIGNAL", "ACCEL_EARLY_SIGNALS"),
        ("ACCEL_DISABLE_AUTOLOAD", "ACCEL_DISABLE_PLUGIN_AUTOLOAD"),
    ],
)
def test_list_reports_a_misspelt_variable_name(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, meant: str
) -> None:
    monkeypatch.setenv(name, "1")
    code, _, err = cli(capsys, "list")
    assert code == 0
    (line,) = err.strip().splitlines()
    assert line.startswith(f"accel: warning: ${name} is set, but accel reads no such variable")
    assert f"did you mean ${meant}?" in line


def test_list_leaves_other_accel_prefixed_variables_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A project's own variables (this suite's ACCEL_TIER) are not misspellings.
    monkeypatch.setenv("ACCEL_TIER", "main")
    monkeypatch.setenv("ACCEL_HEARTBEAT_S", "5")
    code, _, err = cli(capsys, "list")
    assert (code, err) == (0, "")
