"""Third-party plugins installed and found through importlib.metadata.

`bash scripts/test` pip-installs examples/accel-example-plugin into the test environment.
The broken and conflicting fixture distributions (tests/dists/) are installed into a
private directory (laid out as pip would, without pip) and put on sys.path only for the
test that uses them, with a default registry of its own, so they never leak into others.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from helpers.installing import install_fixture_distributions

EXAMPLE_PROVIDER = "accel-example-plugin 0.1.0"


@pytest.fixture(scope="session", autouse=True)
def _example_installed() -> None:
    try:
        importlib.metadata.distribution("accel-example-plugin")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(
            "examples/accel-example-plugin is not installed in this environment; "
            "`bash scripts/test` installs it (pip install -e examples/accel-example-plugin)"
        )


@pytest.fixture(scope="session")
def fixture_dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broken and the conflicting distributions, installed into a private directory."""
    return install_fixture_distributions(
        tmp_path_factory.mktemp("site"), "accel-broken-plugin", "accel-conflicting-plugin"
    )


RunWith = Callable[..., Any]


@pytest.fixture
def run_with(monkeypatch: pytest.MonkeyPatch) -> RunWith:
    """``run_with(site, code, **env)``: run ``code`` in this process as a fresh program
    would see it (a default registry of its own, the distributions in ``site``
    importable first, no accel variables but ``env``); what it printed last, as JSON.
    A child process would cost an import of torch and show nothing more: entry points
    are read from sys.path when a registry is built."""

    def run(site: Path, code: str, **env: str) -> Any:
        for name in [k for k in os.environ if k.startswith("ACCEL_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.setattr(accel, "_default_registry", None)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            # What a child would have printed on its stderr; the tests record their own.
            warnings.simplefilter("ignore")
            exec(textwrap.dedent(code), {"__name__": "__main__"})
        return json.loads(out.getvalue().strip().splitlines()[-1])

    return run


@pytest.fixture
def xpu_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend an Intel GPU is present: the example plugin asks torch.xpu."""
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)


def test_the_installed_example_is_discovered_with_its_distribution() -> None:
    registry = accel.AcceleratorRegistry()
    infos = {info.name: info for info in registry.list_accelerators()}
    xpu = infos["xpu"]
    assert xpu.provider == EXAMPLE_PROVIDER
    assert xpu.aliases == ("intel-gpu",)
    assert xpu.priority == 90
    assert not xpu.available and "no Intel GPU" in xpu.reason  # this machine has none
    assert infos["cpu"].provider == "built-in"


def test_the_example_is_selected_by_name_and_alias(xpu_present: None) -> None:
    registry = accel.AcceleratorRegistry()
    acc = registry.get_accelerator("xpu")
    assert (acc.name, acc.device) == ("xpu", torch.device("xpu", 0))
    assert registry.get_accelerator("Intel-GPU:1").device == torch.device("xpu", 1)
    assert acc.distributed_backend == "xccl"
    with pytest.raises(accel.AcceleratorUnavailableError, match="2 devices"):
        registry.get_accelerator("xpu:2")


def test_the_example_takes_part_in_auto_by_its_priority(xpu_present: None) -> None:
    registry = accel.AcceleratorRegistry()
    assert registry.get_accelerator("auto").name == "xpu"  # 90 beats the CPU's 0
    # ...but it never beats a higher-priority available accelerator.
    from helpers.fakes import FakeAccelerator

    registry.register(FakeAccelerator("bigger", priority=95))
    assert registry.get_accelerator("auto").name == "bigger"


def test_the_default_registry_loads_the_example_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    # As a fresh program starts: no default registry, the plugin not imported, no accel
    # variables. That `import accel` alone imports no plugin is for a fresh interpreter
    # to show (test_probing's import test).
    for name in [k for k in os.environ if k.startswith("ACCEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(accel, "_default_registry", None)
    monkeypatch.delitem(sys.modules, "accel_example_plugin", raising=False)
    accel.list_accelerators()
    assert "accel_example_plugin" in sys.modules


@pytest.mark.parametrize(
    ("environment", "kwargs", "loaded"),
    [
        ({}, {}, True),
        ({"ACCEL_DISABLE_PLUGIN_AUTOLOAD": "1"}, {}, False),
        ({}, {"autoload": False}, False),
        ({}, {"entry_points": None}, False),
        ({"ACCEL_PLUGINS": "xpu"}, {}, True),
        ({"ACCEL_PLUGINS": "someone-else"}, {}, False),
        ({"ACCEL_PLUGINS": " Accel-Example-Plugin , other"}, {}, True),
        ({"ACCEL_PLUGINS": "someone-else"}, {"plugins": ["xpu"]}, True),
        ({}, {"plugins": []}, False),
        ({"ACCEL_DISABLE_PLUGIN_AUTOLOAD": "1"}, {"autoload": True}, True),
    ],
)
def test_autoload_switches_and_allow_list(
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    kwargs: dict[str, Any],
    loaded: bool,
) -> None:
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    registry = accel.AcceleratorRegistry(**kwargs)
    assert ("xpu" in registry.names()) is loaded
    assert "cpu" in registry.names()


def test_a_broken_plugin_warns_is_listed_and_harms_no_one(
    fixture_dists: Path, run_with: RunWith
) -> None:
    report = run_with(
        fixture_dists,
        """
        import json, warnings, accel
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            infos = {i.name: i for i in accel.list_accelerators()}
        failures = accel.default_registry().plugin_failures()
        print(json.dumps({
            "warnings": [(w.category.__name__, str(w.message)) for w in caught],
            "broken": infos["broken"].__dict__ if "broken" in infos else None,
            "failures": [f.__dict__ for f in failures],
            "cpu": accel.get_accelerator("cpu").name,
            "auto": accel.get_accelerator("auto").name,
        }, default=list))
        """,
    )
    broken_warnings = [m for c, m in report["warnings"] if "broken" in m]
    assert len(broken_warnings) == 1
    assert "accel-broken-plugin 0.0.1" in broken_warnings[0]
    assert "libfancyaccel.so.3" in broken_warnings[0]
    assert "PluginWarning" in {c for c, _ in report["warnings"]}
    row = report["broken"]
    assert row["provider"] == "accel-broken-plugin 0.0.1"
    assert row["available"] is False and "ImportError" in row["reason"]
    assert report["cpu"] == "cpu" and report["auto"] == "cpu"


def test_a_name_claimed_by_two_distributions_names_both(
    fixture_dists: Path, run_with: RunWith
) -> None:
    report = run_with(
        fixture_dists,
        """
        import json, warnings, accel
        warnings.simplefilter("ignore")
        try:
            accel.get_accelerator("xpu")
            error = None
        except accel.PluginError as exc:
            error = str(exc)
        failures = accel.default_registry().plugin_failures()
        print(json.dumps({
            "error": error,
            "conflicts": [f.conflicting_names for f in failures],
            "errors": [f.error for f in failures],
            "cpu": accel.get_accelerator("cpu").name,
        }))
        """,
    )
    assert report["error"] is not None
    assert "accel-example-plugin 0.1.0" in report["error"]
    assert "accel-conflicting-plugin 0.0.2" in report["error"]
    assert "the name 'xpu' is claimed by 2 installed plugins" in report["error"]
    # The example plugin, loaded second and kept out, claimed xpu and its alias intel-gpu.
    assert ["xpu", "intel-gpu"] in report["conflicts"]
    # Public exception types only, never a private class name.
    conflict_errors = [e for e in report["errors"] if "claimed twice" in e]
    assert conflict_errors and all(e.startswith("PluginError: ") for e in conflict_errors)
    assert report["cpu"] == "cpu"


def test_the_allow_list_resolves_a_conflict(fixture_dists: Path, run_with: RunWith) -> None:
    report = run_with(
        fixture_dists,
        """
        import json, accel
        infos = {i.name: i for i in accel.list_accelerators()}
        print(json.dumps({"provider": infos["xpu"].provider, "names": sorted(infos)}))
        """,
        ACCEL_PLUGINS="other-xpu",
    )
    assert report["provider"] == "accel-conflicting-plugin 0.0.2"
    assert "broken" not in report["names"]


def test_an_embedding_library_uses_its_own_entry_point_group(
    fixture_dists: Path, run_with: RunWith
) -> None:
    report = run_with(
        fixture_dists,
        """
        import json, accel
        own = accel.AcceleratorRegistry(entry_points="embedding-test", builtins=False)
        print(json.dumps({
            "own": own.names(),
            "default": accel.default_registry().names(),
        }))
        """,
    )
    assert report["own"] == ["npu"]
    assert "npu" not in report["default"]
    assert "xpu" not in report["own"]


@pytest.fixture(scope="session")
def alias_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A distribution disputing the example plugin's alias 'intel-gpu', installed privately."""
    return install_fixture_distributions(
        tmp_path_factory.mktemp("alias-site"), "accel-alias-plugin"
    )


def test_an_alias_claimed_by_two_distributions_selects_neither(
    alias_dist: Path, run_with: RunWith
) -> None:
    report = run_with(
        alias_dist,
        """
        import json, warnings, accel
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accel.default_registry().names()
        try:
            accel.get_accelerator("intel-gpu")
            error = None
        except accel.PluginError as exc:
            error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({
            "error": error,
            "arc": accel.get_accelerator("arc").name,  # its own name is undisputed
            "auto": accel.get_accelerator("auto").name,
            "failures": len(accel.default_registry().plugin_failures()),
            "warnings": [
                str(w.message) for w in caught if issubclass(w.category, accel.PluginWarning)
            ],
        }))
        """,
    )
    assert report["error"] is not None
    assert report["error"].startswith("PluginError: cannot select 'intel-gpu'")
    # Said when the second plugin loads, not only when someone selects the alias.
    (warning,) = [w for w in report["warnings"] if "'intel-gpu'" in w]
    assert "has it too; the alias now selects neither" in warning
    assert "accel-example-plugin 0.1.0" in report["error"]
    assert "accel_Alias.Plugin 0.0.3" in report["error"]
    assert report["arc"] == "arc"
    assert report["auto"] == "arc"  # priority 95, above the CPU
    assert report["failures"] == 0  # both plugins loaded; only the alias is disputed


@pytest.mark.parametrize(
    "spelling", ["accel-alias-plugin", "ACCEL_ALIAS_PLUGIN", "accel.alias_plugin"]
)
def test_the_allow_list_compares_names_as_packaging_does(
    alias_dist: Path, run_with: RunWith, spelling: str
) -> None:
    report = run_with(
        alias_dist,
        """
        import json, accel
        print(json.dumps({"names": accel.default_registry().names()}))
        """,
        ACCEL_PLUGINS=spelling,
    )
    assert "arc" in report["names"]
    assert "xpu" not in report["names"]  # the example plugin is not on the list
    assert report["names"].count("intel-gpu") == 1  # undisputed now: only arc claims it


def test_an_allow_list_entry_that_matches_nothing_warns_once_naming_what_is_there(
    alias_dist: Path,
    run_with: RunWith,
) -> None:
    report = run_with(
        alias_dist,
        """
        import json, warnings, accel
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            accel.default_registry().names()
            accel.get_accelerator("cpu")
        print(json.dumps([(w.category.__name__, str(w.message)) for w in caught]))
        """,
        ACCEL_PLUGINS="accel-alais-plugin",
    )
    assert len(report) == 1
    category, message = report[0]
    assert category == "PluginWarning"
    assert "'accel-alais-plugin'" in message
    assert "arc (from accel_Alias.Plugin 0.0.3)" in message
    assert "xpu (from accel-example-plugin 0.1.0)" in message


def test_a_failed_plugins_error_ending_in_a_period_is_shown_without_it() -> None:
    from accel._registry import loading

    with pytest.warns(accel.PluginWarning) as caught:
        loading._failure("fakedev", "accel-fakedev 0.1.0", accel.PluginError("unknown hook."))
    message = str(caught[0].message)
    assert "(PluginError: unknown hook); the other accelerators still work" in message


def test_a_boolean_variables_warning_quotes_every_value_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCEL_DISABLE_PLUGIN_AUTOLOAD", "maybe")
    with pytest.warns(accel.PluginWarning) as caught:
        accel.AcceleratorRegistry(entry_points="accel-test-empty-group").names()
    message = str(caught[0].message)
    assert "one of '1', 'true', 'yes', 'on' for true" in message
    assert "one of '', '0', 'false', 'no', 'off' for false" in message
