"""Single-device Lightning strategies whose model moves go through accel.

Lightning moves models with ``module.to(device)`` (Fabric's XLA strategy too, so a
tied model comes out untied; the Trainer re-ties by name afterwards and checks
nothing). These strategies move with :meth:`accel.Accelerator.model_to_device`
instead, so ties hold wherever accel holds them, the accelerator plugin's own
move hooks run, and a failed move leaves the model as it was. What they share with
the multi-process ones is :class:`~accel.integrations._lightning_base.AccelStrategyBase`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.precision import Precision as FabricPrecision
from lightning.fabric.strategies.single_device import (
    SingleDeviceStrategy as FabricSingleDeviceStrategy,
)
from lightning.pytorch.plugins.precision import Precision as TrainerPrecision
from lightning.pytorch.strategies import SingleDeviceStrategy as TrainerSingleDeviceStrategy

from accel.integrations._lightning_base import (
    AccelStrategyBase,
    require_in_place,
)
from accel.training.step import retarget_optimizers

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.nn import Module
    from torch.optim import Optimizer

    # Lightning's signature names the old base class.
    from torch.optim.lr_scheduler import _LRScheduler

__all__ = ["AccelFabricStrategy", "AccelStrategy", "FabricMoves", "TrainerMoves"]


class TrainerMoves(AccelStrategyBase):
    """The Trainer side: move ``self.model`` with accel, step with accel, come back
    to the CPU with accel."""

    if TYPE_CHECKING:
        model: Module | None
        lightning_module: pl.LightningModule | None
        optimizers: list[Optimizer]
        precision_plugin: TrainerPrecision

    def model_to_device(self) -> None:
        assert self.model is not None, "the Trainer connects the model before moving it"
        handle = self.accel_handle()
        require_in_place(self.model, handle.model_to_device(self.model), handle)

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: pl.LightningModule | Module | None = None,
        **kwargs: Any,
    ) -> Any:
        module = model or self.lightning_module
        assert module is not None, "the Trainer steps a connected LightningModule"
        precision = self.precision_plugin
        plain = not kwargs and type(precision).optimizer_step is TrainerPrecision.optimizer_step
        # The precision plugin's closure: forward, backward, the before-step hooks, clipping.
        wrapped = partial(precision._wrap_closure, module, optimizer, closure)  # type: ignore[arg-type]
        return self.accel_step(
            optimizer,
            wrapped,
            partial(super().optimizer_step, optimizer, closure, model, **kwargs),  # type: ignore[misc]
            plain_precision=plain,
        )

    def teardown(self) -> None:
        self.return_to_cpu(self.lightning_module, self.optimizers)
        super().teardown()  # type: ignore[misc]


class FabricMoves(AccelStrategyBase):
    """The Fabric side: move modules with accel and re-point the optimizers Fabric
    hands over next, step with accel."""

    if TYPE_CHECKING:
        precision: FabricPrecision

    #: The module's parameters before the last move, until Fabric hands over the
    #: optimizers built on them (setup() does so right after the move).
    _before_move: tuple[Module, dict[str, torch.nn.Parameter]] | None = None

    def module_to_device(self, module: Module) -> None:
        handle = self.accel_handle()
        before = dict(module.named_parameters(remove_duplicate=False))
        require_in_place(module, handle.model_to_device(module), handle)
        self._before_move = (module, before)

    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: _LRScheduler | None = None
    ) -> tuple[Module, list[Optimizer], _LRScheduler | None]:
        last, self._before_move = self._before_move, None
        if last is not None and last[0] is module and optimizers:
            retarget_optimizers(optimizers, last[1], module)
        return super().setup_module_and_optimizers(module, optimizers, scheduler)  # type: ignore[misc,no-any-return]

    def setup_module(self, module: Module) -> Module:
        self._before_move = None
        return super().setup_module(module)  # type: ignore[misc,no-any-return]

    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        plain = set(kwargs) <= {"closure"} and (
            type(self.precision).optimizer_step is FabricPrecision.optimizer_step
        )
        return self.accel_step(
            optimizer,
            kwargs.get("closure"),
            partial(super().optimizer_step, optimizer, **kwargs),  # type: ignore[misc]
            plain_precision=plain,
        )


class AccelStrategy(TrainerMoves, TrainerSingleDeviceStrategy):
    """A single-device Trainer strategy that moves the model with accel.

    ``Trainer(strategy=AccelStrategy("npu"))`` brings its accelerator along;
    ``Trainer(accelerator=AccelAccelerator("npu"), strategy=AccelStrategy())`` says
    the same in two parts. The device is the accel accelerator's (or the one
    ``devices=[i]`` names); each step is :meth:`accel.Accelerator.optimizer_step`,
    checkpoints go through :class:`AccelCheckpointIO`, and at teardown the model
    returns to the CPU through accel too, with its optimizers following.

    :param accelerator: an :class:`AccelAccelerator`, an accel accelerator name or
        handle, or ``None`` to take the Trainer's ``accelerator=`` (which must then
        be an :class:`AccelAccelerator`).
    :param registry: the accel registry to select a named accelerator from.
    :param lightning_arguments: ``checkpoint_io=`` and ``precision_plugin=``, passed
        on to Lightning's single-device strategy.
    """

    strategy_name = "accel"
    parallel_strategy_name = "AccelDDPStrategy"


class AccelFabricStrategy(FabricMoves, FabricSingleDeviceStrategy):
    """A single-device Fabric strategy that moves the model with accel.

    ``Fabric(strategy=AccelFabricStrategy("npu"))``; ``fabric.setup(model, optimizer)``
    then keeps ties and re-points the optimizer at the moved parameters (Fabric
    itself re-points them only for its XLA strategies, by name, after untying).
    Batches stay Fabric's to move (it never asks the strategy).

    :param accelerator: an :class:`AccelAccelerator`, an accel accelerator name or
        handle, or ``None`` to take Fabric's ``accelerator=`` (which must then be an
        :class:`AccelAccelerator`).
    :param registry: the accel registry to select a named accelerator from.
    :param lightning_arguments: ``checkpoint_io=`` and ``precision=``, passed on to
        Lightning's single-device strategy.
    """

    parallel_strategy_name = "AccelFabricDDPStrategy"
