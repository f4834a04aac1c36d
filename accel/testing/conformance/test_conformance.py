"""The kit as pytest tests: one test per promise, collected by
``pytest --pyargs accel.testing.conformance --accelerator NAME``.

The accelerator is the one ``--accelerator`` (else ``$ACCEL_ACCELERATOR``) names, looked
up in accel's default registry; ``--accel-limits MODULE:OBJECT`` names the device's
:class:`~accel.testing.conformance.Limits`. accel's pytest plugin checks both once, when
these tests are collected. The checks are the same functions
``accel conformance`` and :func:`~accel.testing.conformance.run` call.
"""

from __future__ import annotations

import pytest

from accel.testing.conformance._catalog import Promise, Subject
from accel.testing.conformance._limits import Limits
from accel.testing.conformance._runner import all_promises, check_promise, skip_reason, subject_for

__all__: list[str] = []


@pytest.fixture(scope="session")
def conformance_subject(
    _accel_conformance_target: tuple[str, Limits], tmp_path_factory: pytest.TempPathFactory
) -> Subject:
    """The accelerator under test, checked once by accel's pytest plugin when the kit was
    collected (a missing, unknown or unavailable one is a usage error there: a run never
    passes by skipping)."""
    name, limits = _accel_conformance_target
    return subject_for(name, tmp_path_factory.mktemp("conformance"), limits=limits)


# torch imports inductor's passes on the first compile, and they call torch's own
# deprecated torch.jit.script_method: torch's doing, nothing a vendor can fix.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit._script")
@pytest.mark.parametrize("promise", all_promises(), ids=lambda promise: promise.name)
def test_promise(promise: Promise, conformance_subject: Subject) -> None:
    reason = skip_reason(promise, conformance_subject.limits)
    if reason is not None:
        pytest.skip(reason)
    check_promise(promise, conformance_subject)
