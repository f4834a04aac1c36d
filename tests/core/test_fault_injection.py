"""Plugins that misbehave while loading or probing, installed (laid out as pip would,
without pip): accel contains the fault, says which plugin it was, and keeps working.
A fault that needs a process of its own (an interrupt, a write to file descriptor 1)
gets a fresh interpreter; the others are tried in this one.

The fixture distribution tests/dists/accel-faulty-plugins has one entry point per fault;
each test loads only its own with ``ACCEL_PLUGINS=NAME``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

import accel
from accel.tools.cli import main as cli_main
from helpers.installing import install_fixture_distributions

PROVIDER = "accel-faulty-plugins 0.0.1"
TIMEOUT_S = 120


@pytest.fixture(scope="session")
def faulty_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_fixture_distributions(
        tmp_path_factory.mktemp("faulty-site"), "accel-faulty-plugins"
    )


def _environment(site: Path, plugin: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "PJRT_"))}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    environment["ACCEL_PLUGINS"] = plugin
    return environment


class InProcess:
    """A fault tried in this process, as a fresh program would meet it: the faulty
    distribution importable first, only ``plugin`` loaded (``ACCEL_PLUGINS``) and a
    default registry of its own. For the faults that neither kill, signal nor write to
    file descriptor 1: a child would only add an import of torch."""

    def __init__(
        self, site: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        self._site, self._monkeypatch, self._capsys = site, monkeypatch, capsys

    def _load_only(self, plugin: str) -> None:
        for name in [k for k in os.environ if k.startswith(("ACCEL_", "PJRT_"))]:
            self._monkeypatch.delenv(name)
        self._monkeypatch.setenv("ACCEL_PLUGINS", plugin)
        self._monkeypatch.syspath_prepend(str(self._site))
        self._monkeypatch.setattr(accel, "_default_registry", None)

    def report(self, plugin: str, code: str) -> dict[str, Any]:
        """Run ``code`` with only ``plugin``; the JSON it printed last."""
        self._load_only(plugin)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a child's stderr; the code records its own
            exec(textwrap.dedent(code), {"__name__": "__main__"})
        report: dict[str, Any] = json.loads(out.getvalue().strip().splitlines()[-1])
        return report

    def accel(self, plugin: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``accel ARGS`` through its main, with only ``plugin``."""
        self._load_only(plugin)
        self._capsys.readouterr()
        code = cli_main(list(args))
        out, err = self._capsys.readouterr()
        return subprocess.CompletedProcess(["accel", *args], code, out, err)


@pytest.fixture
def here(
    faulty_site: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> InProcess:
    return InProcess(faulty_site, monkeypatch, capsys)


def _accel(site: Path, plugin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accel", *args],
        capture_output=True,
        text=True,
        env=_environment(site, plugin),
        timeout=TIMEOUT_S,
        check=False,
    )


_FAILURES = """
    import json, warnings, accel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu = accel.get_accelerator("cpu").name
    print(json.dumps({
        "cpu": cpu,
        "auto": accel.get_accelerator("auto").name,
        "failures": [f.__dict__ for f in accel.default_registry().plugin_failures()],
        "warnings": [str(w.message) for w in caught],
    }, default=list))
"""


def test_a_plugin_calling_sys_exit_at_import_is_a_failed_plugin(here: InProcess) -> None:
    report = here.report("exits", _FAILURES)
    assert (report["cpu"], report["auto"]) == ("cpu", "cpu")  # the program goes on
    (failure,) = report["failures"]
    assert (failure["name"], failure["provider"]) == ("exits", PROVIDER)
    assert failure["error"] == "SystemExit: 3"
    (warning,) = report["warnings"]
    assert f"accel plugin 'exits' from {PROVIDER} failed to load" in warning


def test_a_plugin_using_accel_while_it_loads_gets_a_true_error(here: InProcess) -> None:
    report = here.report("reentrant", _FAILURES)
    assert (report["cpu"], report["auto"]) == ("cpu", "cpu")
    (failure,) = report["failures"]
    assert failure["name"] == "reentrant"
    assert failure["error"].startswith(
        f"PluginError: accel plugin 'reentrant' from {PROVIDER} used accel"
    )
    assert "while accel was still loading it" in failure["error"]
    assert "claimed twice" not in " ".join(report["warnings"])  # the old, false message


@pytest.mark.parametrize("command", [["list", "--json"], ["info", "cpu", "--json"]])
def test_a_plugin_printing_while_it_loads_and_probes_leaves_json_intact(
    faulty_site: Path, command: list[str]
) -> None:
    result = _accel(faulty_site, "chatty", *command)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # nothing but the JSON on stdout
    assert "chatty plugin: hello from import" in result.stderr
    assert "chatty plugin: straight to fd 1" in result.stderr
    if command[0] == "list":
        assert "chatty plugin: probed" in result.stderr
        assert {row["name"] for row in report} >= {"cpu", "chatty"}
    else:
        assert report["accelerator"] == "cpu"


def test_a_plugin_printing_while_it_loads_still_prints_for_the_table(faulty_site: Path) -> None:
    result = _accel(faulty_site, "chatty", "list")
    assert result.returncode == 0, result.stderr
    assert "chatty plugin: hello from import" in result.stdout  # no JSON to protect here


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupt_while_a_plugin_hangs_at_import_names_that_plugin(
    faulty_site: Path,
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "accel", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(faulty_site, "hangs"),
        # A shell starts background jobs with SIGINT ignored, and a child inherits that:
        # Python then installs no KeyboardInterrupt handler and the interrupt is lost.
        preexec_fn=_interruptible,
    )
    try:
        assert process.stderr is not None
        assert process.stderr.readline().strip() == "hangs plugin: importing"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=TIMEOUT_S)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == (
        f"accel: interrupted while loading accel plugin 'hangs' from {PROVIDER}; if it "
        f"hangs, set ACCEL_DISABLE_PLUGIN_AUTOLOAD=1 or ACCEL_PLUGINS=... to skip "
        f"third-party plugins"
    )


def test_auto_passes_over_an_accelerator_whose_device_count_raises(here: InProcess) -> None:
    report = here.report(
        "count-raises",
        """
        import json, accel
        rows = {row.name: row for row in accel.list_accelerators()}
        try:
            accel.get_accelerator("flaky")
            named = None
        except OSError as exc:
            named = str(exc)
        print(json.dumps({
            "auto": accel.get_accelerator("auto").name,
            "flaky": rows["flaky"].__dict__,
            "named": named,
        }, default=list))
        """,
    )
    assert report["auto"] == "cpu"  # flaky has priority 99, but cannot count its devices
    assert report["flaky"]["available"] is False
    assert report["flaky"]["reason"] == "device_count failed: OSError: management library gone"
    assert report["named"] == "management library gone"  # asked for by name: its own error
    table = here.accel("count-raises", "list")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.split("\n\n")[0].splitlines()[1:]}
    assert "device_count failed: OSError: management library gone" in rows["flaky"]
    assert "chosen by auto" in rows["cpu"]
    assert table.stdout.rstrip().endswith("here 'cpu'.")


def test_a_slow_probe_never_holds_up_registering_or_selecting(here: InProcess) -> None:
    report = here.report(
        "slow-probe",
        """
        import json, threading, accel
        from accel_faulty_plugins import slow_probe

        registry = accel.default_registry()
        registry.names()  # loaded: the probe runs only when asked
        listing = threading.Thread(target=accel.list_accelerators)
        listing.start()
        assert slow_probe.probing.wait(timeout=60)
        done = {}

        class Npu:
            @accel.hookimpl
            def register_accelerators(self):
                return [accel.AcceleratorSpec("npu")]

        def meanwhile():
            plugin = Npu()
            registry.register(plugin)
            done["names"] = registry.names()
            done["cpu"] = accel.get_accelerator("cpu").name
            registry.unregister(plugin)

        other = threading.Thread(target=meanwhile)
        other.start()
        other.join(timeout=30)
        done["finished_while_probing"] = not other.is_alive() and not slow_probe.release.is_set()
        slow_probe.release.set()
        listing.join(timeout=60)
        print(json.dumps(done))
        """,
    )
    assert report["finished_while_probing"] is True
    assert report["cpu"] == "cpu"
    assert "npu" in report["names"]
