"""The ``accel`` pytest plugin: pick the accelerator tests run on, skip what cannot run here.

Installed with accel and loaded by pytest through the ``pytest11`` entry point, it adds:

* ``--accelerator NAME``: the accelerator the run targets (any name ``accel`` accepts:
  ``cpu``, ``cuda:1``, ``gpu``, ``tpu``, ``auto``, a third-party accelerator, ...).
* the ``accelerator`` fixture: an :class:`accel.Accelerator` chosen by ``--accelerator``,
  else ``$ACCEL_ACCELERATOR``, else ``"auto"``.
* the ``@pytest.mark.accelerator("cuda", "tpu")`` marker: run the test if any of the named
  accelerators is available here, skip it (saying why each is not) otherwise; but fail it
  where the run asked for one of them (``--accelerator``, ``$ACCEL_ACCELERATOR``) and it
  is missing, so that a run targeting it never turns green by skipping.

Loading the plugin is free: neither torch nor torch_xla (nor accel's plugins) is
imported until a test uses the fixture or carries the marker, because pytest loads
this module in every run of every project installed next to accel.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn

import pytest

from accel._util.names import ACCELERATOR_ENV as _ACCELERATOR_ENV
from accel._util.names import AUTO as _AUTO
from accel._util.names import closest_name, name_from_environment, normalize_name

if TYPE_CHECKING:
    from accel.accelerator import Accelerator
    from accel.registry import AcceleratorRegistry
    from accel.testing.conformance import Limits

__all__ = ["accelerator"]

#: The marker naming the accelerators a test can run on.
MARKER_NAME: Final = "accelerator"
#: Where ``--accelerator`` is stored: ``config.getoption(OPTION_DEST)``.
OPTION_DEST: Final = "accel_accelerator"
#: Where ``--accel-limits`` is stored (read by accel.testing.conformance's tests).
LIMITS_DEST: Final = "accel_conformance_limits"
#: What the conformance kit's test ids start with, after the module path.
_CONFORMANCE_TEST: Final = "test_conformance.py::test_promise["
# The accelerator the conformance kit checks and its declared limits, checked once
# when the kit's tests are collected.
_CONFORMANCE_TARGET_KEY: Final = pytest.StashKey[tuple[str, "Limits"]]()


@dataclass(frozen=True)
class _Probe:
    """What asking for one marker name found: the accelerator it means, and why not."""

    #: The name as the marker spelled it.
    requested: str
    #: The canonical accelerator it resolved to (``"cuda"`` for ``"gpu"``).
    canonical: str
    available: bool
    #: Why it is unavailable, with the remedy where the plugin gave one.
    reason: str


@dataclass(frozen=True)
class _MarkerChoice:
    """The outcome of a test's ``accelerator`` marker, kept for the fixture."""

    #: Every canonical accelerator the marker names, available or not.
    canonical: frozenset[str]
    #: The first marker name that is available here.
    first_available: str


_CHOICE_KEY: Final = pytest.StashKey[_MarkerChoice]()
# Probing every marked test again would ask every plugin again; availability does not
# change within a session, so each name is probed once per session.
_PROBES_KEY: Final = pytest.StashKey[dict[str, _Probe]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--accelerator NAME``."""
    group = parser.getgroup("accel", "accel accelerator selection")
    group.addoption(
        "--accelerator",
        dest=OPTION_DEST,
        metavar="NAME",
        default=None,
        help=(
            "accelerator the `accelerator` fixture gives tests, e.g. cpu, cuda, cuda:1, tpu "
            f"or auto (default: ${_ACCELERATOR_ENV}, else auto). Tests marked "
            "@pytest.mark.accelerator(...) use it when it is one of the names they list."
        ),
    )
    group.addoption(
        "--accel-limits",
        dest=LIMITS_DEST,
        metavar="MODULE:OBJECT",
        default=None,
        help=(
            "for `pytest --pyargs accel.testing.conformance`: the "
            "accel.testing.conformance.Limits object declaring what the device cannot do; "
            "the promises that need it are skipped with its reason"
        ),
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before the conformance kit's first test runs, check the accelerator it is to
    check: a missing, unknown or unavailable one (or a bad ``--accel-limits``) is one
    usage error for the whole run, not the same error once per promise."""
    config = session.config
    if config.option.collectonly or not any(
        _CONFORMANCE_TEST in item.nodeid for item in session.items
    ):
        return
    config.stash[_CONFORMANCE_TARGET_KEY] = _conformance_target(config)


def _conformance_target(config: pytest.Config) -> tuple[str, Limits]:
    """The accelerator the kit checks (usable here) and the device's declared limits."""
    from accel.errors import AcceleratorError
    from accel.testing.conformance import Limits
    from accel.testing.conformance._limits import load_limits

    requested = _requested(config)
    if requested is None:  # "auto" would check whatever this machine has: say which instead
        raise pytest.UsageError(
            "accel conformance kit, no accelerator named: the kit checks one; pass "
            f"--accelerator NAME (or set ${_ACCELERATOR_ENV}), e.g. --accelerator npu. No "
            "promise was checked."
        )
    name, source = requested
    spec = config.getoption(LIMITS_DEST)
    where = f"{source} {name!r}"
    try:
        _registry().get_accelerator(name)
        where = f"--accel-limits {spec!r}"
        limits = load_limits(spec) if isinstance(spec, str) else Limits()
    except (AcceleratorError, ValueError, TypeError) as exc:
        why = str(exc).rstrip()
        raise pytest.UsageError(
            f"accel conformance kit, {where}: {why}{'' if why.endswith('.') else '.'} "
            f"No promise was checked."
        ) from None
    return name, limits


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After a conformance kit run, name every promise skipped by a declared limit, so
    that a green run still shows what it did not check."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if _CONFORMANCE_TEST in getattr(report, "nodeid", "")
    ]
    if not skipped:
        return
    terminalreporter.section("accel conformance: promises skipped by declared limits")
    for report in skipped:
        promise = report.nodeid.partition(_CONFORMANCE_TEST)[2].rstrip("]")
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        terminalreporter.line(f"{promise}: {reason.removeprefix('Skipped: ')}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the ``accelerator`` marker and check the ``--accelerator`` name.

    Last, so that conftests registering accelerators in accel's default registry from
    their own ``pytest_configure`` have done so before the name is checked.
    """
    config.addinivalue_line(
        "markers",
        f"{MARKER_NAME}(*names): run only if one of the named accelerators (e.g. 'cuda', "
        "'tpu', 'cuda:1') is available here, else skip saying why; the `accelerator` "
        "fixture then gives the first available one, or --accelerator if it is listed.",
    )
    config.stash[_PROBES_KEY] = {}
    _validate_option(config)


def _option_value(config: pytest.Config) -> str | None:
    value = config.getoption(OPTION_DEST)
    return value if isinstance(value, str) else None


def _validate_option(config: pytest.Config) -> None:
    """Reject an ``--accelerator`` name no plugin provides, before any test runs.

    Only the name is checked, which loads accel's plugins but probes no hardware (and
    imports no torch); whether the accelerator is available is for the tests that use
    it to find out, so a run whose tests need no accelerator still works.
    """
    requested = _option_value(config)
    if requested is None:
        return
    from accel._util.names import parse_accelerator_name

    try:
        base, _index = parse_accelerator_name(requested)
    except ValueError as exc:
        raise pytest.UsageError(f"--accelerator: {exc}") from None
    known = sorted({*_registry().names(), _AUTO})
    if base in known:
        return
    close = closest_name(base, known)
    hint = f" Did you mean {close!r}?" if close else ""
    raise pytest.UsageError(
        f"--accelerator {requested!r}: no accelerator is called {base!r}.{hint} Known "
        f"names: {', '.join(known)}. Pass one of them, or install the plugin that "
        f"provides {base!r} (`accel list` shows what is installed)."
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Probe the accelerators a marked test names; skip it when none is available (fail
    it when the run asked for one of them).

    A wrapper, so that the skip marker added here is seen by pytest's own skip
    handling (which reports the skip at the test's location, not this file's).
    Unmarked tests are not touched, so a session without marked tests probes nothing.
    """
    marker = item.get_closest_marker(MARKER_NAME)
    if marker is not None:
        _apply_marker(item, marker)
    return (yield)


def _apply_marker(item: pytest.Item, marker: pytest.Mark) -> None:
    names = _marker_names(item, marker)
    probes = [_probe(item, name) for name in names]
    available = [probe for probe in probes if probe.available]
    if available:
        item.stash[_CHOICE_KEY] = _MarkerChoice(
            canonical=frozenset(probe.canonical for probe in probes),
            first_available=available[0].requested,
        )
        return
    requested = _requested(item.config)
    if requested is not None and normalize_name(requested[0]) != _AUTO:
        # The run asked for one of this test's accelerators, and it is missing: a run
        # that targets it must not turn green by skipping its tests.
        asked = _probe(item, *requested)
        if asked.canonical in {probe.canonical for probe in probes}:
            _fail(
                f"accelerator {requested[0]!r} (from {requested[1]}) is not available here: "
                f"{asked.reason}. This test is marked for it, so it fails instead of "
                f"skipping; run on a machine that has it, or ask for another accelerator."
            )
    if len(probes) == 1:
        reason = f"needs accelerator {names[0]!r}, which is not available here: {probes[0].reason}"
    else:
        why = "; ".join(f"{probe.requested!r}: {probe.reason}" for probe in probes)
        reason = (
            f"needs one of the accelerators {', '.join(map(repr, names))}; none is "
            f"available here ({why})"
        )
    item.add_marker(pytest.mark.skip(reason=reason))


def _marker_names(item: pytest.Item, marker: pytest.Mark) -> list[str]:
    """The marker's arguments, checked: a mistake must fail the test, never skip it."""
    usage = f'write @pytest.mark.{MARKER_NAME}("cuda", "tpu"): one or more accelerator names'
    if marker.kwargs:
        _fail(
            f"@pytest.mark.{MARKER_NAME} takes no keyword arguments, got "
            f"{', '.join(sorted(marker.kwargs))}; {usage}"
        )
    if not marker.args:
        _fail(f"@pytest.mark.{MARKER_NAME}() names no accelerator; {usage}")
    for name in marker.args:
        if not isinstance(name, str):
            _fail(
                f"@pytest.mark.{MARKER_NAME} got {type(name).__name__} "
                f"{name!r} where an accelerator name was expected; {usage}"
            )
    return list(marker.args)


def _probe(item: pytest.Item, name: str, source: str = "") -> _Probe:
    """Ask the default registry for ``name``; an unknown or malformed name fails the test.

    :param source: where the name came from (``"--accelerator"``), for that message;
        ``""``: the test's marker.
    """
    from accel.errors import AcceleratorNotFoundError, AcceleratorUnavailableError

    probes = item.config.stash.setdefault(_PROBES_KEY, {})
    if name in probes:
        return probes[name]
    registry = _registry()
    try:
        probe = _Probe(name, registry.get_accelerator(name).name, True, "")
    except AcceleratorUnavailableError as exc:
        reason = exc.reason or str(exc)
        remedy = next(
            (row.remedy for row in registry.list_accelerators() if row.name == exc.accelerator),
            "",
        )
        if remedy:
            reason = f"{reason}, to use it: {remedy}"
        probe = _Probe(name, exc.accelerator, False, reason)
    except (AcceleratorNotFoundError, ValueError) as exc:
        where = f"{name!r} (from {source})" if source else f"@pytest.mark.{MARKER_NAME}({name!r})"
        _fail(f"{where}: {exc}")
    probes[name] = probe
    return probe


def _fail(message: str) -> NoReturn:
    """Fail the current test with ``message`` alone: no traceback, no chained error."""
    raise pytest.fail.Exception(message, pytrace=False) from None


def _registry() -> AcceleratorRegistry:
    import accel

    return accel.default_registry()


def _requested(config: pytest.Config) -> tuple[str, str] | None:
    """The accelerator the run asks for and where that came from; ``None`` means auto."""
    option = _option_value(config)
    if option is not None:
        return option, "--accelerator"
    name, source = name_from_environment(None)
    return (name, source.removeprefix(" in ")) if source else None


@pytest.fixture(scope="session")
def _accel_conformance_target(request: pytest.FixtureRequest) -> tuple[str, Limits]:
    """For accel.testing.conformance's tests (which do not import accel's tools): the
    accelerator name and limits checked when the kit was collected."""
    return request.config.stash[_CONFORMANCE_TARGET_KEY]


@pytest.fixture
def accelerator(request: pytest.FixtureRequest) -> Accelerator:
    """The :class:`accel.Accelerator` this test runs on.

    Chosen by ``--accelerator``, else ``$ACCEL_ACCELERATOR``, else ``"auto"``. In a test
    marked ``@pytest.mark.accelerator(...)``, that choice is used if it is one of the
    listed accelerators, and otherwise the first listed one that is available here.
    An accelerator that was asked for but cannot be used fails the test, saying why.
    """
    from accel.errors import AcceleratorError, AcceleratorUnavailableError

    registry = _registry()
    requested = _requested(request.config)
    name, source = requested if requested is not None else (_AUTO, "the default, auto")
    choice = request.node.stash.get(_CHOICE_KEY, None)
    try:
        if choice is None:
            return registry.get_accelerator(name)
        fallback = (
            choice.first_available,
            f"the first available accelerator of @pytest.mark.{MARKER_NAME}",
        )
        if normalize_name(name) == _AUTO:
            name, source = fallback
            return registry.get_accelerator(name)
        try:
            selected = registry.get_accelerator(name)
        except AcceleratorUnavailableError as exc:
            # Asked for one of the test's accelerators explicitly: not having it is an
            # error, never a silent switch to another one.
            if exc.accelerator in choice.canonical:
                raise
        else:
            if selected.name in choice.canonical:
                return selected
        # The run targets an accelerator this test is not for: use the test's own.
        name, source = fallback
        return registry.get_accelerator(name)
    except (AcceleratorError, ValueError) as exc:
        _fail(f"accelerator fixture: {name!r} (from {source}): {exc}")
