"""Available, high priority, but its device count raises: "auto" must pass it over."""

import accel


@accel.hookimpl
def register_accelerators() -> list[accel.AcceleratorSpec]:
    return [accel.AcceleratorSpec("flaky", priority=99, description="device_count raises")]


@accel.hookimpl
def is_available() -> accel.Availability:
    return accel.Availability(True)


@accel.hookimpl
def device_count() -> int:
    raise OSError("management library gone")


@accel.hookimpl
def get_device() -> object:
    import torch

    return torch.device("cpu")
