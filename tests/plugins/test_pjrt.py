"""XLA on GPUs and other PJRT devices: every device type torch_xla cannot start here is
an AcceleratorUnavailableError that names the device type, the missing piece and what
to install or set (accel.plugins._pjrt), from get_accelerator, `accel list` and
`accel info` alike, with no traceback from torch_xla.

The main tier fakes torch_xla (its runtime failing to start as the real one does); the
XLA tier runs the real torch_xla 2.9 from PyPI, which has no CUDA plugin, in fresh
interpreters (a PJRT runtime starts once per process).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from typing import Any

import pytest

import accel
from accel.plugins import _pjrt
from accel.plugins import tpu as tpu_plugin
from accel.plugins._pjrt import PjrtDevice
from accel.tools.cli import main
from helpers.registries import isolated_registry

CUDA_REFUSAL = "No PjRtPlugin registered for: CUDA. Make sure the environment variable ..."


def _fake_torch_xla(monkeypatch: pytest.MonkeyPatch, start_error: Exception | None) -> list[str]:
    """A torch_xla whose runtime raises ``start_error`` when it starts; returns the log
    of runtime starts."""
    starts: list[str] = []
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "torch_xla":
            return importlib.machinery.ModuleSpec("torch_xla", None)
        return real_find_spec(name, *args)

    def start() -> int:
        starts.append(os.environ["PJRT_DEVICE"])
        if start_error is not None:
            raise start_error
        return 1

    runtime = types.ModuleType("torch_xla.runtime")
    runtime.device_type = lambda: os.environ["PJRT_DEVICE"].split("_")[0]  # type: ignore[attr-defined]
    runtime.addressable_runtime_device_count = start  # type: ignore[attr-defined]
    package = types.ModuleType("torch_xla")
    package.runtime = runtime  # type: ignore[attr-defined]
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setitem(sys.modules, "torch_xla", package)
    monkeypatch.setitem(sys.modules, "torch_xla.runtime", runtime)
    monkeypatch.setattr(tpu_plugin._xla_versions, "find_torch_xla_mismatch", lambda: None)
    monkeypatch.setattr(tpu_plugin, "tpu_hardware_present", lambda: False)
    monkeypatch.setattr(tpu_plugin, "_runtime_failures", {})
    return starts


def _refusal(registry: accel.AcceleratorRegistry) -> str:
    with pytest.raises(accel.AcceleratorUnavailableError) as info:
        registry.get_accelerator("tpu")
    assert info.value.accelerator == "tpu"
    return str(info.value)


# -- reading PJRT_DEVICE -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "device_type", "is_gpu"),
    [
        ("cuda", "CUDA", True),
        (" GPU ", "GPU", True),
        ("TPU_LEGACY", "TPU", False),
        ("CPU", "CPU", False),
    ],
)
def test_pjrt_device_is_read_as_torch_xla_reads_it(
    value: str, device_type: str, is_gpu: bool
) -> None:
    device = PjrtDevice.parse(value)
    assert (device.value, device.device_type, device.is_gpu) == (value.strip(), device_type, is_gpu)


def test_installed_pjrt_plugins_are_known_device_types(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = importlib.metadata.EntryPoint("quasar", "quasar_pjrt:Plugin", _pjrt.PLUGIN_GROUP)
    monkeypatch.setattr(
        _pjrt, "entry_points", lambda group: [plugin] if group == _pjrt.PLUGIN_GROUP else []
    )
    assert _pjrt.known_device_types()[-1] == "QUASAR"
    reason, remedy = _pjrt.runtime_start_failure(PjrtDevice.parse("QUASAR"), OSError("no chip"))
    assert "PJRT_DEVICE=QUASAR asks for the PJRT device type QUASAR" in reason
    assert "OSError: no chip" in reason
    assert "the installed PJRT plugin for QUASAR failed to start" in remedy


# -- main tier: torch_xla faked --------------------------------------------------------


def test_cuda_without_a_cuda_runtime_is_unavailable_with_the_remedy(
    monkeypatch: pytest.MonkeyPatch, registry: accel.AcceleratorRegistry
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    starts = _fake_torch_xla(monkeypatch, RuntimeError(CUDA_REFUSAL))
    message = _refusal(registry)
    assert "PJRT_DEVICE=CUDA asks for XLA on CUDA GPUs" in message
    assert "RuntimeError: No PjRtPlugin registered for: CUDA)" in message
    assert "install a CUDA build of torch_xla, or a PJRT GPU plugin package" in message
    assert "accel.get_accelerator('cuda') for CUDA without XLA" in message
    assert "Make sure the environment variable" not in message  # torch_xla's own advice
    # Listing and selecting again never start the runtime a second time.
    info = {row.name: row for row in registry.list_accelerators()}["tpu"]
    assert not info.available and "asks for XLA on CUDA GPUs" in info.reason
    assert starts == ["CUDA"]
    assert os.environ["PJRT_DEVICE"] == "CUDA"


def test_cuda_without_torch_xla_says_both_what_to_install(
    monkeypatch: pytest.MonkeyPatch, registry: accel.AcceleratorRegistry
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "cuda")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch_xla" else real_find_spec(name, *a),
    )
    imported_before = "torch_xla" in sys.modules
    message = _refusal(registry)
    assert "torch_xla is not installed" in message
    assert "'torch_xla==2.9.*'" in message  # torch too, where another torch is installed
    assert (
        "for XLA on CUDA GPUs, then: the torch_xla wheels on PyPI run CPU and TPU only" in message
    )
    assert ("torch_xla" in sys.modules) == imported_before  # the probe imported nothing


def test_neuron_without_its_sdk_is_refused_before_the_runtime_starts(
    monkeypatch: pytest.MonkeyPatch, registry: accel.AcceleratorRegistry
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "NEURON")
    starts = _fake_torch_xla(monkeypatch, None)
    message = _refusal(registry)
    assert "PJRT_DEVICE=NEURON needs the 'libneuronxla' package, which is not installed" in message
    assert "install the AWS Neuron SDK for PyTorch" in message
    assert starts == []  # a failed Neuron start aborts torch_xla 2.9 when tried twice


def test_an_unknown_device_type_gets_the_list_torch_xla_knows(
    monkeypatch: pytest.MonkeyPatch, registry: accel.AcceleratorRegistry
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "QUANTUM")
    starts = _fake_torch_xla(monkeypatch, None)
    message = _refusal(registry)
    assert "PJRT_DEVICE='QUANTUM' is not a PJRT device type torch_xla knows" in message
    assert "set PJRT_DEVICE to one of CPU, TPU, CUDA, GPU, NEURON, XPU" in message
    assert starts == []


@pytest.mark.parametrize(
    ("value", "upper"), [("cpu", "CPU"), ("Cuda", "CUDA"), ("tpu_legacy", "TPU_LEGACY")]
)
def test_a_device_type_not_in_upper_case_is_told_to_be(
    monkeypatch: pytest.MonkeyPatch, registry: accel.AcceleratorRegistry, value: str, upper: str
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", value)
    starts = _fake_torch_xla(monkeypatch, None)
    message = _refusal(registry)
    assert f"PJRT_DEVICE={value!r} is not in upper case" in message
    assert f"To use it: set PJRT_DEVICE={upper} (upper case)" in message
    assert "reinstall" not in message  # the old, wrong remedy
    assert starts == []  # refused before torch_xla's runtime would fail on it
    assert not PjrtDevice.parse(value).in_upper_case and PjrtDevice.parse(upper).in_upper_case


def test_a_runtime_that_starts_is_available_but_not_chosen_by_auto_off_tpu(
    monkeypatch: pytest.MonkeyPatch, registry: accel.AcceleratorRegistry
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    _fake_torch_xla(monkeypatch, None)
    availability = tpu_plugin.probe_xla()
    assert availability.available and availability.reason == "PJRT device type CUDA"
    assert availability.auto is False  # "auto" picks XLA on real TPUs only


def test_accel_list_and_info_show_the_reason_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    _fake_torch_xla(monkeypatch, RuntimeError(CUDA_REFUSAL))
    monkeypatch.setattr(accel, "_default_registry", isolated_registry())
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    tpu_line = next(line for line in listed.splitlines() if line.startswith("tpu "))
    assert "PJRT_DEVICE=CUDA asks for XLA on CUDA GPUs" in tpu_line
    assert main(["info", "tpu"]) == 2
    _, err = capsys.readouterr()
    assert "AcceleratorUnavailableError" in err and "install a CUDA build of torch_xla" in err
    assert "Traceback" not in err


# -- XLA tier: the real torch_xla, which has no CUDA plugin on PyPI ------------------------

_PROBE = """
    import json, os, subprocess, sys
    import accel
    try:
        accel.get_accelerator("tpu")
        error = None
    except accel.AcceleratorUnavailableError as exc:
        error = str(exc)
    listed = {i.name: i for i in accel.list_accelerators()}["tpu"]
    print(json.dumps({
        "error": error,
        "listed_available": listed.available,
        "listed_reason": listed.reason,
        "auto": accel.get_accelerator("auto").name,
        "pjrt_after": os.environ.get("PJRT_DEVICE"),
    }))
"""


def _fresh(code: str, pjrt: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "PJRT_"))}
    return subprocess.run(
        [sys.executable, *args] if args else [sys.executable, "-c", textwrap.dedent(code)],
        env={**env, "PJRT_DEVICE": pjrt},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.xla
@pytest.mark.parametrize(
    ("pjrt", "says"),
    [
        ("CUDA", "PJRT_DEVICE=CUDA asks for XLA on CUDA GPUs, but torch_xla's runtime could not"),
        ("GPU", "PJRT_DEVICE=GPU asks for XLA on CUDA GPUs"),
        ("NEURON", "PJRT_DEVICE=NEURON needs the 'libneuronxla' package"),
        ("QUANTUM", "PJRT_DEVICE='QUANTUM' is not a PJRT device type torch_xla knows"),
        ("cpu", "PJRT_DEVICE='cpu' is not in upper case"),
    ],
)
def test_real_torch_xla_refuses_device_types_it_cannot_start(pjrt: str, says: str) -> None:
    result = _fresh(_PROBE, pjrt)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert says in report["error"]
    assert report["listed_available"] is False and says in report["listed_reason"]
    assert report["auto"] == "cpu"
    assert report["pjrt_after"] == pjrt  # the probe leaves the variable as it was
    assert "Traceback" not in result.stderr


@pytest.mark.xla
def test_real_accel_info_on_cuda_exits_2_with_the_remedy_and_no_traceback() -> None:
    result = _fresh("", "CUDA", "-m", "accel", "info", "tpu")
    assert result.returncode == 2
    assert "install a CUDA build of torch_xla" in result.stderr
    assert "Traceback" not in result.stderr
    listed = _fresh("", "CUDA", "-m", "accel", "list")
    assert listed.returncode == 0
    assert "asks for XLA on CUDA GPUs" in listed.stdout
