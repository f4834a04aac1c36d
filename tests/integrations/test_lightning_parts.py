"""The parts of accel's multi-process Lightning support, in one process: pickling for
``spawn``, ``devices=`` on a shared device, AccelCheckpointIO, the strategies' checks,
and integrations that use accel's public API only."""

from __future__ import annotations

import ast
import datetime
import pickle
from pathlib import Path

import pytest
import torch

import accel
import accel.distributed
from accel.integrations.lightning import (
    AccelAccelerator,
    AccelCheckpointIO,
    AccelDDPStrategy,
    AccelFabricDDPStrategy,
    AccelFabricStrategy,
    AccelStrategy,
)
from helpers.distributed import free_port, no_launcher_and_no_group  # noqa: F401
from helpers.fakes import FakeAccelerator
from helpers.integration_plugins import IndexedVendorPlugin, VendorPlugin
from helpers.models import TiedLM
from helpers.registries import isolated_registry
from helpers.replacing import ReplacingAccelerator

INTEGRATIONS = Path(accel.__file__).resolve().parent / "integrations"


# -- pickling, for Lightning's spawn launcher ----------------------------------------


def test_accelerator_pickles_by_name_and_keeps_its_tie_check() -> None:
    original = AccelAccelerator(accel.get_accelerator("cpu:0", tie_check="warn"))
    copy = pickle.loads(pickle.dumps(original))
    assert copy is not original
    assert isinstance(copy, AccelAccelerator)
    assert type(copy).__name__ == "AccelAccelerator[cpu]"
    assert copy.handle().name == "cpu"
    assert copy.handle().index == 0
    assert copy.handle().tie_check == "warn"
    assert type(copy).parse_devices(2) == [0, 0]  # class questions reach the new handle


def test_accelerator_of_a_registry_of_ones_own_refuses_to_pickle() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(VendorPlugin())
    with pytest.raises(TypeError, match=r"cannot pickle AccelAccelerator\('vendornpu'\)"):
        pickle.dumps(AccelAccelerator("vendornpu", registry=registry))


@pytest.mark.parametrize("strategy_class", [AccelDDPStrategy, AccelFabricDDPStrategy])
def test_multi_process_strategies_pickle(strategy_class: type) -> None:
    strategy = strategy_class("cpu", start_method="spawn", timeout=datetime.timedelta(seconds=5))
    copy = pickle.loads(pickle.dumps(strategy))
    assert type(copy) is strategy_class
    assert copy.lightning_accelerator().handle().name == "cpu"
    assert isinstance(copy.checkpoint_io, AccelCheckpointIO)
    assert copy.checkpoint_io.handle().name == "cpu"
    assert copy._start_method == "spawn"


# -- devices= ----------------------------------------------------------------------


def test_processes_share_the_one_gloo_device() -> None:
    cpu = type(AccelAccelerator("cpu"))
    assert cpu.parse_devices(3) == [0, 0, 0]
    assert cpu.get_parallel_devices(2) == [torch.device("cpu")] * 2
    assert cpu.get_parallel_devices([0, 0]) == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="usable device indices are"):
        cpu.parse_devices([1])


def test_an_accelerator_with_devices_gives_each_process_its_own() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(VendorPlugin(count=2))
    vendor = type(AccelAccelerator("vendornpu", registry=registry))
    assert vendor.parse_devices(2) == [0, 1]
    with pytest.raises(ValueError, match="has 2 usable device"):
        vendor.parse_devices(3)
    with pytest.raises(ValueError, match="no repeats"):
        vendor.parse_devices([1, 1])


@pytest.mark.parametrize(
    ("strategy", "suggested"),
    [(AccelStrategy, "AccelDDPStrategy"), (AccelFabricStrategy, "AccelFabricDDPStrategy")],
)
def test_single_device_strategies_point_to_the_multi_process_ones(
    strategy: type, suggested: str
) -> None:
    single = strategy("cpu")
    single.parallel_devices = [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match=rf"one device per process.*use {suggested} for one"):
        single.accel_handle()


def test_multi_process_strategy_refuses_a_device_accel_would_not_choose() -> None:
    """Lightning's devices=[1] for local rank 0, where accel.distributed takes device 0."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    registry = accel.AcceleratorRegistry(entry_points=None)
    registry.register(IndexedVendorPlugin(count=2))
    strategy = AccelFabricDDPStrategy(
        "vendornpu",
        registry=registry,
        cluster_environment=LightningEnvironment(),
        timeout=datetime.timedelta(seconds=30),
    )
    strategy.parallel_devices = [torch.device("cpu", 1)]
    strategy.cluster_environment.main_port  # noqa: B018 - picks a free port, as Lightning does
    with pytest.raises(accel.distributed.DistributedSetupError, match="gives this worker cpu:0"):
        strategy.setup_environment()
    assert accel.distributed.current_context() is None  # the group it started is gone
    assert not torch.distributed.is_initialized()


# -- a move that returns a new module ----------------------------------------------


def _replacing_registry() -> accel.AcceleratorRegistry:
    """``replacing`` and ``cpu`` move by returning a copy; ``remote`` is on ``meta``, so
    that a strategy on it moves back to the CPU at teardown."""
    registry = isolated_registry(ReplacingAccelerator("replacing"))
    registry.register(ReplacingAccelerator("cpu"), override=True)
    registry.register(FakeAccelerator("remote", device="meta"))
    return registry


def test_trainer_strategy_refuses_a_move_into_a_new_module() -> None:
    strategy = AccelStrategy("replacing", registry=_replacing_registry())
    model = TiedLM()
    strategy.model = model
    with pytest.raises(RuntimeError, match="'replacing' moved the model by returning a new"):
        strategy.model_to_device()


def test_fabric_strategy_refuses_a_move_into_a_new_module() -> None:
    strategy = AccelFabricStrategy("replacing", registry=_replacing_registry())
    with pytest.raises(RuntimeError, match="'replacing' moved the model by returning a new"):
        strategy.module_to_device(TiedLM())


def test_teardown_refuses_a_move_back_into_a_new_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The way back takes the default registry's ``cpu``: Lightning keeps ``model``, so a
    copy returned by the move would leave it where it was, with nothing said."""
    monkeypatch.setattr(accel, "_default_registry", _replacing_registry())
    strategy = AccelStrategy("remote")
    assert strategy.root_device.type == "meta"
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held = list(optimizer.param_groups[0]["params"])
    with pytest.raises(accel.errors.AcceleratorRuntimeError, match="'cpu' moved the model by"):
        strategy.return_to_cpu(model, [optimizer])
    # Refused before the optimizer followed: it still trains the parameters it held.
    assert optimizer.param_groups[0]["params"] == held


def test_teardown_moves_back_through_the_strategys_own_registry() -> None:
    # Its registry's `cpu` moves by returning a copy, so taking it shows in the refusal;
    # accel's default registry (whose `cpu` moves in place) is not the one asked.
    strategy = AccelStrategy("remote", registry=_replacing_registry())
    with pytest.raises(accel.errors.AcceleratorRuntimeError, match="'cpu' moved the model by"):
        strategy.return_to_cpu(TiedLM(), [])


def test_teardown_takes_the_default_cpu_where_the_strategys_registry_has_none() -> None:
    registry = accel.AcceleratorRegistry(entry_points=None, builtins=False)
    registry.register(FakeAccelerator("remote", device="meta"))
    strategy = AccelStrategy("remote", registry=registry)
    model = TiedLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.return_to_cpu(model, [optimizer])
    assert model.head.weight is model.embed.weight
    assert optimizer.param_groups[0]["params"][0] is model.embed.weight


# -- AccelCheckpointIO ---------------------------------------------------------------


def test_checkpoint_io_saves_with_accel_and_reads_weights_only(tmp_path: Path) -> None:
    model = TiedLM()
    io = AccelCheckpointIO("cpu")
    path = tmp_path / "nested" / "model.ckpt"
    io.save_checkpoint({"state_dict": model.state_dict(keep_vars=True), "step": 3}, path)
    loaded = io.load_checkpoint(path)
    assert loaded["step"] == 3
    state = loaded["state_dict"]
    assert state["head.weight"] is state["embed.weight"], "the tie was stored twice"
    assert torch.equal(state["head.weight"], model.embed.weight.detach())
    io.remove_checkpoint(path)
    assert not path.exists()
    io.remove_checkpoint(path)  # already gone: nothing to do, as Lightning's own


class _Arbitrary:
    pass


def test_checkpoint_io_loads_arbitrary_objects_only_when_told_to(tmp_path: Path) -> None:
    path = tmp_path / "object.ckpt"
    torch.save({"thing": _Arbitrary()}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"load refused .*nothing in it was run"):
        AccelCheckpointIO().load_checkpoint(path)
    loaded = AccelCheckpointIO().load_checkpoint(path, weights_only=False)
    assert isinstance(loaded["thing"], _Arbitrary)


def test_checkpoint_io_refuses_storage_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="takes no storage_options"):
        AccelCheckpointIO().save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})
    assert not (tmp_path / "x.ckpt").exists()


def test_checkpoint_io_says_which_file_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no checkpoint file at .*missing\.ckpt"):
        AccelCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")


def test_strategies_write_checkpoints_through_accel_by_default() -> None:
    for strategy in (AccelStrategy("cpu"), AccelFabricStrategy("cpu"), AccelDDPStrategy("cpu")):
        assert isinstance(strategy.checkpoint_io, AccelCheckpointIO)
        assert strategy.checkpoint_io is strategy.checkpoint_io  # one, kept


def test_a_wrapping_checkpoint_io_given_alone_wraps_accels() -> None:
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    strategy = AccelStrategy("cpu", checkpoint_io=AsyncCheckpointIO())
    wrapper = strategy.checkpoint_io
    assert isinstance(wrapper, AsyncCheckpointIO)
    assert isinstance(wrapper.checkpoint_io, AccelCheckpointIO)
    given = AccelStrategy("cpu", checkpoint_io=AsyncCheckpointIO(AccelCheckpointIO("cpu")))
    inner = given.checkpoint_io.checkpoint_io  # type: ignore[attr-defined]
    assert isinstance(inner, AccelCheckpointIO)
    assert given.checkpoint_io is given.checkpoint_io


# -- public API only ---------------------------------------------------------------


def _is_private(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "accel" or parts[:2] == ["accel", "integrations"]:
        return False  # not accel, or the integrations package's own modules
    return any(part.startswith("_") for part in parts[1:])


def _imported_modules(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def test_integrations_import_only_public_accel_modules() -> None:
    assert _is_private("accel._core.transaction")  # the check can see what it looks for
    assert _is_private("accel.distributed._devices")
    assert not _is_private("accel.training.step")
    modules = sorted(INTEGRATIONS.glob("*.py"))
    assert len(modules) >= 7, "the integrations package was not found"
    private = [
        f"{module.name}: {name}"
        for module in modules
        for name in _imported_modules(module.read_text(encoding="utf-8"))
        if _is_private(name)
    ]
    assert private == []


@pytest.mark.xla
def test_checkpoint_io_writes_xla_tensors_once_each(tmp_path: Path) -> None:
    tpu = accel.get_accelerator("tpu")  # XLA:CPU in the XLA tier (PJRT_DEVICE=CPU)
    model = tpu.model_to_device(TiedLM())
    assert model.embed.weight.device.type == "xla"
    path = tmp_path / "xla.ckpt"
    AccelCheckpointIO(tpu).save_checkpoint({"state_dict": model.state_dict(keep_vars=True)}, path)
    state = AccelCheckpointIO(tpu).load_checkpoint(path)["state_dict"]
    assert state["head.weight"] is state["embed.weight"], "the tie was stored twice"
    assert state["embed.weight"].device.type == "cpu"
    assert torch.equal(state["embed.weight"], model.embed.weight.detach().cpu())
