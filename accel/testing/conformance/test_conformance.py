"""The kit as pytest tests: one test per promise, collected by
``pytest --pyargs accel.testing.conformance --accelerator NAME``.

The accelerator is the one ``--accelerator`` (else ``$ACCEL_ACCELERATOR``) names, looked
up in accel's default registry; ``--accel-limits MODULE:OBJECT`` names the device's
:class:`~accel.testing.conformance.Limits`. The checks are the same functions
``accel conformance`` and :func:`~accel.testing.conformance.run` call.
"""

from __future__ import annotations

import pytest

from accel._util.names import name_from_environment
from accel.errors import AcceleratorError
from accel.testing.conformance._catalog import Promise, Subject
from accel.testing.conformance._limits import Limits, load_limits
from accel.testing.conformance._runner import all_promises, check_promise, skip_reason, subject_for

__all__: list[str] = []


@pytest.fixture(scope="session")
def conformance_subject(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Subject:
    """The accelerator under test. A missing, unknown or unavailable one fails every
    promise with the registry's message: a run must never pass by skipping."""
    name = request.config.getoption("--accelerator")
    if not isinstance(name, str):
        name, source = name_from_environment(None)
        if not source:  # "auto" would check whatever this machine has: say which instead
            pytest.fail(
                "the conformance kit checks one accelerator: pass --accelerator NAME (or "
                "set $ACCEL_ACCELERATOR)",
                pytrace=False,
            )
    spec = request.config.getoption("--accel-limits", default=None)
    try:
        limits = load_limits(spec) if isinstance(spec, str) else Limits()
        return subject_for(name, tmp_path_factory.mktemp("conformance"), limits=limits)
    except (AcceleratorError, ValueError, TypeError) as exc:
        pytest.fail(f"accelerator {name!r}: {exc}", pytrace=False)


@pytest.mark.parametrize("promise", all_promises(), ids=lambda promise: promise.name)
def test_promise(promise: Promise, conformance_subject: Subject) -> None:
    reason = skip_reason(promise, conformance_subject.limits)
    if reason is not None:
        pytest.skip(reason)
    check_promise(promise, conformance_subject)
