"""Probing leaves the process as it was, and explains every "unavailable"."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
import torch

import accel
from accel.plugins import tpu
from helpers.fake_torch_xla import pretend_torch_xla
from helpers.processes import run_python
from helpers.registries import isolated_registry


def _run(code: str, **env: str) -> str:
    """``code``'s stdout in a fresh process, with no PJRT device configured."""
    return run_python(code, env={"PJRT_DEVICE": None, **env}, check=True).stdout.strip()


def test_import_accel_loads_nothing_heavy() -> None:
    # A fresh interpreter: what `import accel` imports shows only in a new sys.modules.
    # No plugin either: the default registry, which loads them, is built at first use.
    out = _run(
        """
        import sys, accel
        heavy = ("torch", "torch_xla", "accel.plugins", "accel_example_plugin")
        print(sorted(m for m in heavy if m in sys.modules))
        print(accel.default_registry.__module__)
        """
    )
    assert out.splitlines()[0] == "[]"


def test_probing_never_initialises_cuda(registry: accel.AcceleratorRegistry) -> None:
    registry.list_accelerators()
    registry.get_accelerator("auto")
    for name in ("cuda", "gpu"):
        try:
            registry.get_accelerator(name)
        except accel.AcceleratorUnavailableError:
            pass
    assert not torch.cuda.is_initialized()


def test_a_process_forked_after_probing_can_still_use_cuda() -> None:
    # A fresh interpreter that forks (never pytest's own process), whose first CUDA
    # contact is the probe: only there shows what probing leaves to a forked child.
    # On a CUDA build of torch this is the real check (see test_xla.py for the
    # CUDA-build-without-driver case); on a CPU build it guards the probe's path.
    out = _run(
        """
        import os, accel, torch
        accel.list_accelerators(); accel.get_accelerator("auto")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(torch.cuda._is_in_bad_fork()).encode()); os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(read, 16).decode(), torch.cuda.is_initialized())
        """
    )
    assert out == "False False"


def test_tpu_without_torch_xla_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "torch_xla" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    availability = tpu.probe_xla()
    assert not availability.available
    assert availability.reason == "torch_xla is not installed"
    assert "'torch_xla==2.9.*'" in availability.remedy
    registry = isolated_registry()
    with pytest.raises(accel.AcceleratorUnavailableError, match=r"'torch_xla==2\.9\.\*'"):
        registry.get_accelerator("xla")


@pytest.fixture
def torch_xla_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend torch_xla is installed, but make importing it fail loudly."""
    pretend_torch_xla(monkeypatch, pjrt=os.environ.get("PJRT_DEVICE"))


def test_tpu_without_pjrt_device_says_to_set_it(
    torch_xla_installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    availability = tpu.probe_xla()
    assert not availability.available
    assert "PJRT_DEVICE is not set" in availability.reason
    assert "PJRT_DEVICE=CPU" in availability.remedy


def test_tpu_with_unknown_pjrt_device_names_the_valid_ones(
    torch_xla_installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "QUANTUM")
    availability = tpu.probe_xla()
    assert not availability.available
    assert "'QUANTUM'" in availability.reason
    assert "CPU" in availability.remedy and "TPU" in availability.remedy


def test_tpu_requested_without_hardware_does_not_touch_the_runtime(
    torch_xla_installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    availability = tpu.probe_xla()  # would raise ImportError if it imported torch_xla
    assert not availability.available
    assert "no TPU hardware" in availability.reason


def test_tpu_whose_import_fails_reports_the_error(
    torch_xla_installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    availability = tpu.probe_xla()
    assert not availability.available
    assert availability.reason.startswith("importing torch_xla failed: ImportError")
    assert "undefined symbol" in availability.reason
    registry = isolated_registry()
    info = {i.name: i for i in registry.list_accelerators()}["tpu"]
    assert not info.available and "importing torch_xla failed" in info.reason


def test_a_plugin_whose_probe_raises_is_reported_unavailable() -> None:
    class Exploding:
        @accel.hookimpl
        def register_accelerators(self) -> list[accel.AcceleratorSpec]:
            return [accel.AcceleratorSpec("boom")]

        @accel.hookimpl
        def is_available(self) -> accel.Availability:
            raise OSError("driver on fire")

    registry = isolated_registry(Exploding())
    info = {i.name: i for i in registry.list_accelerators()}["boom"]
    assert not info.available
    assert "OSError: driver on fire" in info.reason
    # What to do, naming who provides the plugin (here: its class, registered in code).
    assert info.provider.endswith("Exploding")
    assert info.remedy == f"fix the plugin, or report this to its authors ({info.provider})"
    assert registry.get_accelerator("auto").name == "cpu"
    with pytest.raises(accel.AcceleratorUnavailableError, match="driver on fire") as raised:
        registry.get_accelerator("boom")
    assert f"To use it: {info.remedy}." in str(raised.value)
