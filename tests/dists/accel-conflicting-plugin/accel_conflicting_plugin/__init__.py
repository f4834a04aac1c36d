"""Test fixture: a second distribution claiming the accelerator name 'xpu'."""

import accel


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [accel.AcceleratorSpec("xpu", description="another vendor's xpu")]


@accel.hookimpl
def is_available() -> accel.Availability:
    return accel.Availability(True)
