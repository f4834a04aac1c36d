"""Lightning strategies whose model moves go through accel.

Lightning moves models with ``module.to(device)`` (Fabric's XLA strategy too, so a
tied model comes out untied; the Trainer re-ties by name afterwards and checks
nothing). These strategies move with :meth:`accel.Accelerator.model_to_device`
instead, so ties hold wherever accel holds them, the accelerator plugin's own
move hooks run, and a failed move leaves the model as it was.

Single device per process; the step itself stays Lightning's (precision plugins
included), followed by :meth:`accel.Accelerator.mark_step` (XLA: cut the lazy
graph; a no-op elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.precision import Precision as FabricPrecision
from lightning.fabric.strategies.single_device import (
    SingleDeviceStrategy as FabricSingleDeviceStrategy,
)
from lightning.pytorch.plugins.precision import Precision as TrainerPrecision
from lightning.pytorch.strategies import SingleDeviceStrategy as TrainerSingleDeviceStrategy
from typing_extensions import override

import accel
from accel._core.optimizers import retarget_optimizers
from accel._core.transaction import RestorePoint
from accel.integrations._lightning_accelerator import AccelAccelerator, as_lightning_accelerator

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.nn import Module
    from torch.optim import Optimizer

    # Lightning's signature names the old base class.
    from torch.optim.lr_scheduler import _LRScheduler

__all__ = ["AccelFabricStrategy", "AccelStrategy"]

_Accelerator = AccelAccelerator | str | accel.Accelerator | None


class AccelStrategy(TrainerSingleDeviceStrategy):
    """A single-device Trainer strategy that moves the model with accel.

    ``Trainer(strategy=AccelStrategy("npu"))`` brings its accelerator along;
    ``Trainer(accelerator=AccelAccelerator("npu"), strategy=AccelStrategy())`` says
    the same in two parts. The device is the accel accelerator's (or the one
    ``devices=[i]`` names); at teardown the model returns to the CPU through accel
    too, with its optimizers following.

    :param accelerator: an :class:`AccelAccelerator`, an accel accelerator name or
        handle, or ``None`` to take the Trainer's ``accelerator=`` (which must then
        be an :class:`AccelAccelerator`).
    :param registry: the accel registry to select a named accelerator from.
    """

    strategy_name = "accel"

    def __init__(
        self,
        accelerator: _Accelerator = None,
        *,
        registry: accel.AcceleratorRegistry | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: TrainerPrecision | None = None,
    ) -> None:
        lightning_accelerator = as_lightning_accelerator(accelerator, registry)
        super().__init__(
            device=_default_device(lightning_accelerator),
            accelerator=lightning_accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        # Filled by the Trainer from the accelerator's get_parallel_devices().
        self.parallel_devices: list[torch.device] | None = None

    @property
    @override
    def root_device(self) -> torch.device:
        return _root_device(self.parallel_devices, self._accelerator, self._root_device)

    def accel_handle(self) -> accel.Accelerator:
        """The accel accelerator this strategy moves to, checked against the run's setup."""
        return _handle(self, self.parallel_devices, self._accelerator)

    @override
    def setup_environment(self) -> None:
        self.accel_handle()
        super().setup_environment()

    @override
    def model_to_device(self) -> None:
        assert self.model is not None, "the Trainer connects the model before moving it"
        handle = self.accel_handle()
        _require_in_place(self.model, handle.model_to_device(self.model), handle)

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: pl.LightningModule | Module | None = None,
        **kwargs: Any,
    ) -> Any:
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        self.accel_handle().mark_step()
        return result

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None and self.root_device.type != "cpu":
            # Lightning's own teardown calls module.cpu(), which unties on the way
            # back from XLA; accel keeps the ties and re-points the optimizers.
            accel.get_accelerator("cpu").model_to_device(module, optimizer=self.optimizers)
        super().teardown()


class AccelFabricStrategy(FabricSingleDeviceStrategy):
    """A single-device Fabric strategy that moves the model with accel.

    ``Fabric(strategy=AccelFabricStrategy("npu"))``; ``fabric.setup(model, optimizer)``
    then keeps ties and re-points the optimizer at the moved parameters (Fabric
    itself re-points them only for its XLA strategies, by name, after untying).
    Batches stay Fabric's to move (it never asks the strategy).

    :param accelerator: an :class:`AccelAccelerator`, an accel accelerator name or
        handle, or ``None`` to take Fabric's ``accelerator=`` (which must then be an
        :class:`AccelAccelerator`).
    :param registry: the accel registry to select a named accelerator from.
    """

    def __init__(
        self,
        accelerator: _Accelerator = None,
        *,
        registry: accel.AcceleratorRegistry | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: FabricPrecision | None = None,
    ) -> None:
        lightning_accelerator = as_lightning_accelerator(accelerator, registry)
        super().__init__(
            device=_default_device(lightning_accelerator),
            accelerator=lightning_accelerator,
            checkpoint_io=checkpoint_io,
            precision=precision,
        )
        self.parallel_devices: list[torch.device] | None = None
        # What the model looked like before the last move, until Fabric hands over
        # the optimizers built on it (setup() does so right after the move).
        self._last_move: RestorePoint | None = None

    @property
    @override
    def root_device(self) -> torch.device:
        return _root_device(self.parallel_devices, self._accelerator, self._root_device)

    def accel_handle(self) -> accel.Accelerator:
        """The accel accelerator this strategy moves to, checked against the run's setup."""
        return _handle(self, self.parallel_devices, self._accelerator)

    @override
    def setup_environment(self) -> None:
        self.accel_handle()
        super().setup_environment()

    @override
    def module_to_device(self, module: Module) -> None:
        handle = self.accel_handle()
        before = RestorePoint(module)
        _require_in_place(module, handle.model_to_device(module), handle)
        self._last_move = before

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: _LRScheduler | None = None
    ) -> tuple[Module, list[Optimizer], _LRScheduler | None]:
        before, self._last_move = self._last_move, None
        if before is not None and optimizers:
            retarget_optimizers(optimizers, before, self.root_device)
        return super().setup_module_and_optimizers(module, optimizers, scheduler)

    @override
    def setup_module(self, module: Module) -> Module:
        self._last_move = None
        return super().setup_module(module)

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        result = super().optimizer_step(optimizer, **kwargs)
        self.accel_handle().mark_step()
        return result


def _default_device(accelerator: AccelAccelerator | None) -> torch.device:
    return torch.device("cpu") if accelerator is None else accelerator.handle().device


def _root_device(
    parallel_devices: list[torch.device] | None, accelerator: object, fallback: torch.device
) -> torch.device:
    if parallel_devices:
        return parallel_devices[0]
    if isinstance(accelerator, AccelAccelerator):
        return accelerator.handle().device
    return fallback


def _handle(
    strategy: object, parallel_devices: list[torch.device] | None, accelerator: object
) -> accel.Accelerator:
    strategy_name = type(strategy).__name__
    if not isinstance(accelerator, AccelAccelerator):
        found = "none" if accelerator is None else type(accelerator).__name__
        raise TypeError(
            f"{strategy_name} moves models with an accel accelerator, but the run's "
            f"accelerator is {found}. Name it in the strategy ({strategy_name}('cpu')) or "
            f"pass accelerator=AccelAccelerator('cpu') (any accel accelerator name)."
        )
    if parallel_devices is not None and len(parallel_devices) != 1:
        devices = ", ".join(str(device) for device in parallel_devices)
        raise ValueError(
            f"{strategy_name} runs on one device per process, but devices= asked for "
            f"{len(parallel_devices)} ({devices}). Pass devices=1, or devices=[INDEX] "
            f"for one particular device."
        )
    device = parallel_devices[0] if parallel_devices else accelerator.handle().device
    return accelerator.handle_for(device)


def _require_in_place(model: Module, moved: Module, handle: accel.Accelerator) -> None:
    if moved is not model:
        raise RuntimeError(
            f"accelerator {handle.name!r} moved the model by returning a new module "
            f"({type(moved).__name__}) instead of moving it in place; Lightning keeps "
            f"the module it was given, so its strategies need in-place moves. Ask the "
            f"plugin's authors for an in-place model_to_device."
        )
