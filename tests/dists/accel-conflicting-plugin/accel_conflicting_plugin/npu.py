"""Test fixture: a plugin published under an embedding library's own entry-point group."""

import accel


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [accel.AcceleratorSpec("npu", description="only for the embedding-test group")]


@accel.hookimpl
def is_available() -> accel.Availability:
    return accel.Availability(True)
