from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

import accel
from helpers.fakes import MetaTpuPlugin
from helpers.registries import isolated_registry

XLA_TIER = os.environ.get("ACCEL_TIER") == "xla"
DEVICES_TIER = os.environ.get("ACCEL_TIER") == "devices"

# The Ray Train tests import Ray, which only the environments of `bash scripts/test ray`
# have; elsewhere they are not collected (the stage fails if it collects none).
collect_ignore_glob = [] if importlib.util.find_spec("ray") else ["integrations/test_ray*.py"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_xla = importlib.util.find_spec("torch_xla") is not None
    for item in items:
        device = item.get_closest_marker("devices")
        if device is not None:
            _need_device_backend(item, *device.args)
        if item.get_closest_marker("xla") is None or has_xla:
            continue
        if XLA_TIER:
            raise pytest.UsageError("the XLA tier runs without torch_xla installed")
        item.add_marker(pytest.mark.skip(reason="needs torch_xla: run `bash scripts/test xla`"))


def _need_device_backend(item: pytest.Item, name: str) -> None:
    """A test of a real third-party backend runs where its env has it (the `devices`
    stage, which must never skip one) and is skipped, saying where it runs, elsewhere."""
    if importlib.util.find_spec(f"torch_{name}") is not None:
        return
    if DEVICES_TIER:
        raise pytest.UsageError(f"the devices stage runs {item.nodeid} without torch-{name}")
    item.add_marker(pytest.mark.skip(reason=f"needs torch-{name}: run `bash scripts/test devices`"))


@pytest.fixture(autouse=True)
def _clean_accel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ACCEL_ACCELERATOR", "ACCEL_PLUGINS", "ACCEL_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(name, raising=False)
    # Importing torch_xla sets PJRT_DEVICE=CPU for the whole process (Lightning's "auto"
    # imports it wherever it is installed), and every later test would find XLA:CPU
    # configured: put it back as it was after each test. setenv records the value to
    # restore, unset included; delenv of an unset variable would record nothing.
    pjrt_device = os.environ.get("PJRT_DEVICE")
    monkeypatch.setenv("PJRT_DEVICE", pjrt_device or "")
    if pjrt_device is None:
        monkeypatch.delenv("PJRT_DEVICE")


@pytest.fixture
def registry() -> accel.AcceleratorRegistry:
    """A registry of the built-ins only, isolated from installed plugins."""
    return isolated_registry()


@pytest.fixture
def acc(registry: accel.AcceleratorRegistry) -> accel.Accelerator:
    """The CPU accelerator of an isolated registry of the built-ins."""
    return registry.get_accelerator("cpu")


@pytest.fixture
def meta_tpu() -> accel.Accelerator:
    """The TPU plugin's hooks, moving to the `meta` device (which unties like XLA)."""
    reg = isolated_registry(MetaTpuPlugin(), builtins=False)
    return reg.get_accelerator("tpu")


@pytest.fixture
def overwrite_mode() -> Iterator[None]:
    """Make every conversion build new Parameters, as XLA moves do; restored after."""
    import torch

    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)
