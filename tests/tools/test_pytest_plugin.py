"""The pytest plugin (accel.tools.pytest_plugin), driven through pytester.

Most runs are in-process and use a conftest that registers fake accelerators in
accel's default registry, so the outcomes do not depend on this machine's hardware:
``fasthw`` (available, highest "auto" priority, alias ``fast``), ``slowhw`` (available,
lowest priority), ``deadhw`` and ``gonehw`` (unavailable, with reasons).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator

import pytest

# In-process pytester runs drop every module first imported during the run; torch cannot
# be imported twice in one process, so import it (and accel's plugins) up front.
import torch  # noqa: F401

import accel
import accel.plugins

pytest_plugins = ["pytester"]

FAKES_CONFTEST = """
import pytest
import torch

import accel


class FakeHardware:
    @accel.hookimpl
    def register_accelerators(self):
        return [
            accel.AcceleratorSpec("fasthw", aliases=("fast",), priority=1000),
            accel.AcceleratorSpec("slowhw", priority=-10),
            accel.AcceleratorSpec("deadhw", priority=500),
            accel.AcceleratorSpec("gonehw", priority=400),
        ]

    @accel.hookimpl
    def is_available(self, accelerator):
        if accelerator == "deadhw":
            return accel.Availability(
                False, reason="the deadhw driver is missing", remedy="install deadhw-driver"
            )
        if accelerator == "gonehw":
            return accel.Availability(False, reason="no gonehw card in this machine")
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self):
        return torch.device("cpu")


FAKES = FakeHardware()


# First, so the plugin's own pytest_configure (which checks --accelerator) sees them.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    accel.default_registry().register(FAKES, name="fake-hardware")


def pytest_unconfigure(config):
    accel.default_registry().unregister(FAKES)
"""


def _autoloaded() -> bool:
    """Whether accel's ``pytest11`` entry point is installed (pytest then loads the plugin)."""
    entry_points = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "accel.tools.pytest_plugin" for ep in entry_points)


def _plugin_args() -> tuple[str, ...]:
    """What a pytest run with autoloading on needs to have the plugin.

    pytest refuses a module registered twice under two names (the entry point's
    ``accel`` and ``-p``'s module name), so ``-p`` only where nothing autoloads it.
    """
    return () if _autoloaded() else ("-p", "accel.tools.pytest_plugin")


@pytest.fixture(autouse=True)
def _no_leaked_fakes() -> Iterator[None]:
    yield
    # The fakes conftest unregisters them at unconfigure; a leak would change "auto"
    # for every later test in this process.
    assert "fasthw" not in accel.default_registry().names()


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester whose runs load only pytest's own plugins and accel's.

    Other installed plugins (hypothesis, ...) are re-imported by every in-process run,
    which costs about a second each; and the plugin is then loaded the same way whether
    or not its entry point is installed.
    """
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester


@pytest.fixture
def fakes(inner: pytest.Pytester) -> pytest.Pytester:
    """:func:`inner`, with the fake accelerators registered in every run."""
    inner.makeconftest(FAKES_CONFTEST)
    return inner


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run pytest in-process with the plugin, showing skip reasons and test output."""
    return pytester.runpytest(
        "-p", "accel.tools.pytest_plugin", "--strict-markers", "-rs", "-s", *args
    )


REPORT_NAME = """
def test_which(accelerator):
    print(f"SELECTED={accelerator.name}")
"""


# -- option, environment, auto -----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param((), None, "fasthw", id="auto-picks-highest-priority"),
        pytest.param((), "slowhw", "slowhw", id="env-beats-auto"),
        pytest.param(("--accelerator", "cpu"), "slowhw", "cpu", id="option-beats-env"),
        pytest.param(("--accelerator", " FAST "), None, "fasthw", id="option-alias-any-case"),
    ],
)
def test_fixture_precedence(
    fakes: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    env: str | None,
    expected: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("ACCEL_ACCELERATOR", env)
    fakes.makepyfile(REPORT_NAME)
    result = run(fakes, *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*SELECTED={expected}*"])


def test_fixture_gives_a_usable_handle(fakes: pytest.Pytester) -> None:
    fakes.makepyfile(
        """
        import torch

        def test_move(accelerator):
            assert accelerator.name == "cpu"
            assert accelerator.batch_to_device({"x": torch.ones(2)})["x"].device.type == "cpu"
        """
    )
    run(fakes, "--accelerator", "cpu").assert_outcomes(passed=1)


def test_option_naming_unavailable_accelerator_fails_tests_using_it(
    fakes: pytest.Pytester,
) -> None:
    fakes.makepyfile(
        """
        def test_uses_it(accelerator):
            pass

        def test_does_not():
            pass
        """
    )
    result = run(fakes, "--accelerator", "deadhw")
    # Not a skip: a run that targets deadhw on a machine without it must not look green.
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*accelerator fixture: 'deadhw' (from --accelerator)*the deadhw driver is missing*"]
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "fsathw",
            "*--accelerator 'fsathw': no accelerator is called 'fsathw'. Did you mean "
            "'fasthw'?*Known names: *fasthw*",
        ),
        ("cpu:x", "*--accelerator: bad device index in accelerator name 'cpu:x'*"),
    ],
)
def test_bad_option_is_a_usage_error(fakes: pytest.Pytester, name: str, expected: str) -> None:
    fakes.makepyfile("def test_nothing():\n    pass\n")
    result = run(fakes, "--accelerator", name)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])
    result.stdout.no_fnmatch_line("*passed*")


def test_unknown_name_in_environment_fails_the_fixture(
    fakes: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "fsathw")
    fakes.makepyfile(REPORT_NAME)
    result = run(fakes)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*accelerator fixture: 'fsathw' (from $ACCEL_ACCELERATOR)*Did you mean 'fasthw'?*"]
    )


# -- the marker -----------------------------------------------------------------------


def test_marker_skips_naming_each_accelerator_and_why(fakes: pytest.Pytester) -> None:
    fakes.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("deadhw", "gonehw")
        def test_needs_hardware(accelerator):
            raise AssertionError("must not run")

        @pytest.mark.accelerator("deadhw")
        def test_needs_one():
            raise AssertionError("must not run")
        """
    )
    result = run(fakes)
    result.assert_outcomes(skipped=2)
    # Reported at the test's own line, with every accelerator, its reason and its remedy.
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_marker_skips_naming_each_accelerator_and_why.py:3: needs one "
            "of the accelerators 'deadhw', 'gonehw'; none is available here ('deadhw': the "
            "deadhw driver is missing, to use it: install deadhw-driver; 'gonehw': no gonehw "
            "card in this machine)",
            "SKIPPED [[]1[]] *.py:7: needs accelerator 'deadhw', which is not available here: "
            "the deadhw driver is missing, to use it: install deadhw-driver",
        ]
    )


def test_marker_with_builtin_names_explains_real_reasons(inner: pytest.Pytester) -> None:
    rows = {row.name: row for row in accel.list_accelerators()}
    cuda, tpu = rows["cuda"], rows["tpu"]
    if cuda.available or tpu.available:
        pytest.skip("this machine has CUDA or a TPU configured; the skip cannot be shown")
    inner.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("cuda", "tpu")
        def test_on_device():
            raise AssertionError("must not run")
        """
    )
    result = run(inner)
    result.assert_outcomes(skipped=1)
    skip_line = next(line for line in result.stdout.lines if line.startswith("SKIPPED"))
    assert "needs one of the accelerators 'cuda', 'tpu'" in skip_line
    assert f"'cuda': {cuda.reason}, to use it: {cuda.remedy}" in skip_line
    assert f"'tpu': {tpu.reason}, to use it: {tpu.remedy}" in skip_line


def test_marker_runs_when_one_is_available_and_fixture_gives_first_listed(
    fakes: pytest.Pytester,
) -> None:
    fakes.makepyfile(
        """
        import pytest

        # slowhw is listed before fasthw, so it wins although "auto" would prefer fasthw.
        @pytest.mark.accelerator("deadhw", "slowhw", "fasthw")
        def test_which(accelerator):
            print(f"SELECTED={accelerator.name}")

        @pytest.mark.accelerator("gonehw", "cpu")
        def test_without_fixture():
            pass
        """
    )
    result = run(fakes)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*SELECTED=slowhw*"])


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param(("--accelerator", "fasthw"), None, "fasthw", id="option-listed"),
        pytest.param(("--accelerator", "fast"), None, "fasthw", id="option-alias-listed"),
        pytest.param((), "fasthw", "fasthw", id="env-listed"),
        pytest.param(("--accelerator", "cpu"), None, "slowhw", id="option-not-listed"),
        pytest.param(("--accelerator", "auto"), "fasthw", "slowhw", id="option-auto"),
    ],
)
def test_marker_uses_the_requested_accelerator_only_when_listed(
    fakes: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    env: str | None,
    expected: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("ACCEL_ACCELERATOR", env)
    fakes.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("slowhw", "fasthw")
        def test_which(accelerator):
            print(f"SELECTED={accelerator.name}")
        """
    )
    result = run(fakes, *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*SELECTED={expected}*"])


def test_marker_with_requested_but_unavailable_listed_accelerator_fails(
    fakes: pytest.Pytester,
) -> None:
    fakes.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("deadhw", "slowhw")
        def test_which(accelerator):
            raise AssertionError("must not run on a substitute")
        """
    )
    result = run(fakes, "--accelerator", "deadhw")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*'deadhw' (from --accelerator)*the deadhw driver is missing*"])


@pytest.mark.parametrize("source", ["option", "environment"])
def test_a_marked_test_for_an_accelerator_asked_for_but_unavailable_fails_not_skips(
    fakes: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    fakes.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("deadhw")
        def test_with_fixture(accelerator):
            raise AssertionError("must not run")

        @pytest.mark.accelerator("deadhw", "gonehw")
        def test_without_fixture():
            raise AssertionError("must not run")

        @pytest.mark.accelerator("gonehw")
        def test_for_another_accelerator():
            raise AssertionError("must not run")
        """
    )
    args: tuple[str, ...] = ()
    if source == "option":
        args = ("--accelerator", "deadhw")
    else:
        monkeypatch.setenv("ACCEL_ACCELERATOR", "deadhw")
    result = run(fakes, *args)
    # Asked for deadhw, which is missing: its tests fail; another accelerator's skips.
    result.assert_outcomes(errors=2, skipped=1)
    where = "--accelerator" if source == "option" else "$ACCEL_ACCELERATOR"
    result.stdout.fnmatch_lines(
        [f"*accelerator 'deadhw' (from {where}) is not available here: the deadhw driver*"]
    )
    result.stdout.fnmatch_lines(["*needs accelerator 'gonehw', which is not available here*"])


def test_a_typo_in_the_environment_fails_a_marked_test_instead_of_skipping_it(
    fakes: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCEL_ACCELERATOR", "dedhw")
    fakes.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("deadhw")
        def test_marked():
            raise AssertionError("must not run")
        """
    )
    result = run(fakes)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*'dedhw' (from $ACCEL_ACCELERATOR): unknown accelerator*"])


def test_marker_device_index_is_checked_against_device_count(fakes: pytest.Pytester) -> None:
    fakes.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator("fasthw:0")
        def test_first(accelerator):
            assert accelerator.index == 0

        @pytest.mark.accelerator("fasthw:1")
        def test_second():
            raise AssertionError("must not run")
        """
    )
    result = run(fakes)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["*needs accelerator 'fasthw:1', which is not available here: index 1 >= device count 1"]
    )


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        pytest.param(
            '"slowhw", "fsathw"',
            "*@pytest.mark.accelerator('fsathw'): unknown accelerator 'fsathw'*"
            "Did you mean 'fasthw'?*",
            id="typo",
        ),
        pytest.param("", "*@pytest.mark.accelerator() names no accelerator*", id="empty"),
        pytest.param(
            '"cpu", 3', "*@pytest.mark.accelerator got int 3 where an accelerator name*", id="int"
        ),
        pytest.param('names=["cpu"]', "*takes no keyword arguments, got names*", id="keyword"),
        pytest.param('"cpu:first"', "*accelerator('cpu:first'): bad device index*", id="bad-index"),
    ],
)
def test_bad_marker_fails_the_test_instead_of_skipping(
    fakes: pytest.Pytester, marker: str, expected: str
) -> None:
    fakes.makepyfile(
        f"""
        import pytest

        @pytest.mark.accelerator({marker})
        def test_marked():
            pass
        """
    )
    result = run(fakes)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([expected])


def test_closest_marker_wins(fakes: pytest.Pytester) -> None:
    fakes.makepyfile(
        """
        import pytest

        pytestmark = pytest.mark.accelerator("deadhw")

        @pytest.mark.accelerator("slowhw")
        def test_overridden(accelerator):
            print(f"SELECTED={accelerator.name}")

        def test_module_level():
            raise AssertionError("must not run")
        """
    )
    result = run(fakes)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SELECTED=slowhw*"])


# -- loading ---------------------------------------------------------------------------


def test_help_shows_option_and_marker(inner: pytest.Pytester) -> None:
    result = inner.runpytest("-p", "accel.tools.pytest_plugin", "--help")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["accel accelerator selection:", "*--accelerator=NAME*"])
    markers = inner.runpytest("-p", "accel.tools.pytest_plugin", "--markers")
    markers.stdout.fnmatch_lines(["@pytest.mark.accelerator(*names): run only if one of*"])


def test_loading_the_plugin_imports_neither_torch_nor_plugins(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh process, loading the plugin as users get it: through the entry point
    # where it is installed.
    monkeypatch.delenv("ACCEL_ACCELERATOR", raising=False)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(
        """
        import sys

        import pytest

        HEAVY = ("torch", "torch_xla", "accel.plugins")

        def test_first(request):
            # The plugin is loaded (its option exists) and the whole file is collected,
            # the marked test below included, yet nothing heavy was imported.
            assert request.config.getoption("accel_accelerator") is None
            assert [name for name in HEAVY if name in sys.modules] == []

        @pytest.mark.accelerator("cpu")
        def test_marked(accelerator):
            pass
        """
    )
    # Only collected, not run: running it probes, and importing torch takes seconds.
    result = pytester.runpytest_subprocess(*_plugin_args(), "--strict-markers", "-k", "first")
    result.assert_outcomes(passed=1, deselected=1)
