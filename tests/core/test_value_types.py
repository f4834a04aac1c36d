"""accel.types' value checks: every bad field is named with the value found."""

from __future__ import annotations

from typing import Any

import pytest

import accel


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: accel.AcceleratorSpec("npu", description=5),
            "description of 'npu' must be a str, got 5",
        ),
        (
            lambda: accel.AcceleratorSpec("npu", priority=True),
            "priority of 'npu' must be an int, got True",
        ),
        (
            lambda: accel.Availability(True, reason=None),
            "Availability.reason must be a str, got None",
        ),
        (
            lambda: accel.Availability(True, remedy=b"pip"),
            "Availability.remedy must be a str, got b'pip'",
        ),
        (lambda: accel.Availability(1), "Availability.available must be a bool, got 1"),
    ],
)
def test_a_bad_field_is_named_with_what_was_found(make: Any, message: str) -> None:
    with pytest.raises(accel.AcceleratorTypeError) as caught:
        make()
    assert str(caught.value) == message


def test_good_values_pass_and_names_are_normalised() -> None:
    spec = accel.AcceleratorSpec(" NPU ", priority=3, description="d", unties_weights=True)
    assert (spec.name, spec.priority, spec.unties_weights) == ("npu", 3, True)
    assert accel.Availability(False, reason="r", remedy="m", auto=False).auto is False
