"""accel.integrations.lightning: the accelerator's answers, the strategies' checks."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from lightning.fabric.accelerators import Accelerator as FabricAccelerator
from lightning.pytorch.accelerators import Accelerator as TrainerAccelerator

import accel
from accel.integrations.lightning import AccelAccelerator, AccelFabricStrategy, AccelStrategy
from helpers.fakes import FakeAccelerator
from helpers.integration_plugins import VendorPlugin
from helpers.processes import run_python
from helpers.registries import isolated_registry


@pytest.fixture
def vendor_registry() -> accel.AcceleratorRegistry:
    return isolated_registry(VendorPlugin(count=3))


@pytest.fixture
def vendor(vendor_registry: accel.AcceleratorRegistry) -> type[AccelAccelerator]:
    return type(AccelAccelerator("vendornpu", registry=vendor_registry))


def test_is_both_kinds_of_lightning_accelerator(registry: accel.AcceleratorRegistry) -> None:
    lightning_accelerator = AccelAccelerator("cpu", registry=registry)
    assert isinstance(lightning_accelerator, TrainerAccelerator)
    assert isinstance(lightning_accelerator, FabricAccelerator)
    assert isinstance(lightning_accelerator, AccelAccelerator)
    assert lightning_accelerator.handle().name == "cpu"
    assert repr(lightning_accelerator) == "AccelAccelerator(name='cpu', device='cpu')"


def test_class_answers_come_from_the_plugin(vendor: type[AccelAccelerator]) -> None:
    # Lightning asks the class, not the instance (type(accelerator).parse_devices(...)).
    assert vendor.is_available() is True
    assert vendor.name() == "vendornpu"
    assert vendor.auto_device_count() == 3
    assert vendor.get_parallel_devices(2) == [torch.device("cpu")] * 2


@pytest.mark.parametrize(
    ("devices", "indices"),
    [
        (1, [0]),
        (3, [0, 1, 2]),
        (-1, [0, 1, 2]),
        ("2", [0, 1]),
        ("-1", [0, 1, 2]),
        (" 1 ", [0]),
        ([2], [2]),
        ((0, 2), [0, 2]),
        ("0,2", [0, 2]),
        ("1,", [1]),
    ],
)
def test_parse_devices(vendor: type[AccelAccelerator], devices: object, indices: list[int]) -> None:
    assert vendor.parse_devices(devices) == indices


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        (4, "has 3 usable device"),
        (0, "has 3 usable device"),
        (-2, "has 3 usable device"),
        ([3], "usable device indices are [0, 1, 2]"),
        ([1, 1], "no repeats"),
        ([], "non-empty list"),
        ([True], "non-empty list"),
        ("two", "comma-separated"),
        (True, "not a device count"),
        (1.5, "not a device count"),
    ],
)
def test_bad_devices_say_what_the_plugin_has(
    vendor: type[AccelAccelerator], devices: object, problem: str
) -> None:
    with pytest.raises(ValueError, match="vendornpu") as raised:
        vendor.parse_devices(devices)
    assert problem in str(raised.value)
    assert "devices=1" in str(raised.value)


def test_an_indexed_accelerator_offers_its_one_device(
    vendor_registry: accel.AcceleratorRegistry,
) -> None:
    indexed = type(AccelAccelerator("vendornpu:2", registry=vendor_registry))
    assert indexed.auto_device_count() == 1
    assert indexed.parse_devices(1) == [2]
    assert indexed.parse_devices([2]) == [2]
    with pytest.raises(ValueError, match=r"usable device indices are \[2\]"):
        indexed.parse_devices([0])


def test_selection_errors_are_accels(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(accel.AcceleratorNotFoundError, match="npu"):
        AccelAccelerator("npu", registry=registry)
    registry.register(FakeAccelerator("offline", available=False))
    with pytest.raises(accel.AcceleratorUnavailableError, match="fake says no"):
        AccelAccelerator("offline", registry=registry)


def test_bad_arguments(registry: accel.AcceleratorRegistry) -> None:
    handle = registry.get_accelerator("cpu")
    assert AccelAccelerator(handle).handle() is handle
    # A handle and its own registry agree (the registry's one rule for "a handle or a
    # name"); another registry's handle is refused.
    assert AccelAccelerator(handle, registry=registry).handle() is handle
    with pytest.raises(accel.AcceleratorValueError, match="belongs to another registry"):
        AccelAccelerator(handle, registry=isolated_registry())
    with pytest.raises(TypeError, match="got int"):
        AccelAccelerator(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="need an instance's class"):
        AccelAccelerator.auto_device_count()


def test_setup_device_refuses_a_device_of_another_type(
    registry: accel.AcceleratorRegistry,
) -> None:
    registry.register(FakeAccelerator("metanpu", device="meta"))
    lightning_accelerator = AccelAccelerator("metanpu", registry=registry)
    lightning_accelerator.setup_device(torch.device("meta"))
    with pytest.raises(ValueError, match=r"strategy=AccelStrategy\('metanpu'\)"):
        lightning_accelerator.setup_device(torch.device("cpu"))


def test_alone_lightning_would_put_an_unknown_accelerator_on_the_cpu(
    registry: accel.AcceleratorRegistry,
) -> None:
    # Lightning's own choice for an accelerator it does not know is a CPU strategy;
    # the accelerator says so and names the fix instead of running on the wrong device.
    from lightning.fabric import Fabric

    registry.register(FakeAccelerator("metanpu", device="meta"))
    fabric = Fabric(accelerator=AccelAccelerator("metanpu", registry=registry), devices=1)
    assert fabric.device == torch.device("cpu")
    with pytest.raises(ValueError, match="AccelFabricStrategy"):
        fabric.to_device(torch.nn.Linear(2, 2))


def test_strategy_takes_the_device_from_the_accelerator() -> None:
    from lightning.fabric import Fabric

    registry = isolated_registry(FakeAccelerator("metanpu", device="meta"))
    fabric = Fabric(strategy=AccelFabricStrategy("metanpu", registry=registry), devices=1)
    assert fabric.device == torch.device("meta")
    assert isinstance(fabric.accelerator, AccelAccelerator)


def test_strategy_refuses_a_lightning_accelerator() -> None:
    from lightning.pytorch import Trainer

    trainer = Trainer(
        accelerator="cpu", strategy=AccelStrategy(), logger=False, enable_checkpointing=False
    )
    with pytest.raises(TypeError, match=r"accelerator is CPUAccelerator.*AccelAccelerator"):
        trainer.strategy.setup_environment()


def test_strategy_refuses_several_devices(vendor_registry: accel.AcceleratorRegistry) -> None:
    from lightning.fabric import Fabric

    fabric = Fabric(strategy=AccelFabricStrategy("vendornpu", registry=vendor_registry), devices=2)
    with pytest.raises(ValueError, match=r"one device per process.*asked for 2"):
        fabric.setup(torch.nn.Linear(2, 2))


def test_strategy_registry_needs_a_name(registry: accel.AcceleratorRegistry) -> None:
    with pytest.raises(TypeError, match="pass a name"):
        AccelStrategy(AccelAccelerator("cpu", registry=registry), registry=registry)


def test_import_accel_imports_no_integration() -> None:
    # A fresh interpreter: what `import accel` imports shows only in a new sys.modules.
    result = run_python(
        "import sys, accel\n"
        "accel.get_accelerator('cpu')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'accelerate') or m.startswith('accel.integrations')))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_missing_lightning_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning uninstalled for this test (None in sys.modules fails its import), and
    # accel's integration imported anew.
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.delitem(sys.modules, "accel.integrations.lightning", raising=False)
    with pytest.raises(ImportError) as raised:
        importlib.import_module("accel.integrations.lightning")
    assert "accel.integrations.lightning needs the 'lightning' package" in str(raised.value)
    assert "pip install 'lightning>=2.5'" in str(raised.value)
