"""Test fixture: an accelerator 'arc' whose alias 'intel-gpu' the example plugin also claims.

Its entry point names a class, which accel instantiates with no arguments.
"""

import accel


class ArcPlugin:
    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("arc", aliases=("intel-gpu",), priority=95)]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> object:
        import torch

        return torch.device("cpu")  # a stand-in: the fixture has no device of its own
