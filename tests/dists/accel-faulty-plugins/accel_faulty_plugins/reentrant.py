"""Uses accel while accel is loading it: selects an accelerator at import."""

import accel

DEFAULT = accel.get_accelerator("cpu")


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [accel.AcceleratorSpec("reentrant")]
