"""What every accel Lightning strategy shares, Trainer or Fabric, one device or several.

:class:`AccelStrategyBase` sits before Lightning's own strategy class in each accel
strategy's bases. It turns the ``accelerator=`` argument into an
:class:`~accel.integrations.lightning.AccelAccelerator`, answers ``root_device`` and
:meth:`~AccelStrategyBase.accel_handle` from it, checks the run's setup before
Lightning's, steps optimizers through :meth:`accel.Accelerator.optimizer_step`,
writes checkpoints through :class:`~accel.integrations.lightning.AccelCheckpointIO`
and brings the model back to the CPU through accel at teardown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

import accel
from accel.errors import AcceleratorRuntimeError, AcceleratorTypeError, AcceleratorValueError
from accel.integrations._lightning_accelerator import AccelAccelerator, as_lightning_accelerator
from accel.integrations._lightning_checkpoint import AccelCheckpointIO
from accel.training.step import retarget_optimizers

if TYPE_CHECKING:
    from lightning.fabric.plugins import CheckpointIO
    from torch.nn import Module

__all__ = ["AccelStrategyBase", "AcceleratorArgument", "require_in_place"]

#: What a strategy's ``accelerator=`` accepts.
AcceleratorArgument = AccelAccelerator | str | accel.Accelerator | None


class AccelStrategyBase:
    """The part of an accel strategy that does not depend on Lightning's class.

    A subclass lists it first, then a Lightning strategy class, and says how many
    devices a process may use (:attr:`single_device`).
    """

    #: One device per process: ``devices=`` must name exactly one.
    single_device: bool = True
    #: The strategy to suggest when a single-device one is given several devices.
    parallel_strategy_name: str = ""

    if TYPE_CHECKING:
        # Set by Lightning's strategy classes.
        _accelerator: Any
        _checkpoint_io: CheckpointIO | None
        parallel_devices: list[torch.device] | None

    def __init__(
        self,
        accelerator: AcceleratorArgument = None,
        *,
        registry: accel.AcceleratorRegistry | None = None,
        **lightning_arguments: Any,
    ) -> None:
        lightning_accelerator = as_lightning_accelerator(accelerator, registry)
        if self.single_device:
            lightning_arguments["device"] = (
                torch.device("cpu")
                if lightning_accelerator is None
                else lightning_accelerator.handle().device
            )
        super().__init__(accelerator=lightning_accelerator, **lightning_arguments)  # type: ignore[call-arg]
        if self.single_device:
            # Filled by the Trainer / Fabric from the accelerator's get_parallel_devices().
            self.parallel_devices = None

    # -- the device ------------------------------------------------------------------

    def _process_index(self) -> int:
        """Which of :attr:`parallel_devices` this process trains on."""
        return 0

    @property
    def root_device(self) -> torch.device:
        if self.parallel_devices:
            return self.parallel_devices[self._process_index()]
        if isinstance(self._accelerator, AccelAccelerator):
            return self._accelerator.handle().device
        return torch.device("cpu")

    def lightning_accelerator(self) -> AccelAccelerator:
        """The run's :class:`AccelAccelerator`.

        :raises TypeError: the run's accelerator is another kind.
        """
        accelerator = self._accelerator
        if not isinstance(accelerator, AccelAccelerator):
            name = type(self).__name__
            found = "none" if accelerator is None else type(accelerator).__name__
            raise AcceleratorTypeError(
                f"{name} moves models with an accel accelerator, but the run's "
                f"accelerator is {found}. Name it in the strategy ({name}('cpu')) or "
                f"pass accelerator=AccelAccelerator('cpu') (any accel accelerator name)."
            )
        return accelerator

    def accel_handle(self) -> accel.Accelerator:
        """The accel accelerator this process moves to, checked against the run's setup.

        :raises TypeError: the run's accelerator is not an :class:`AccelAccelerator`.
        :raises ValueError: a single-device strategy was given several devices.
        """
        accelerator = self.lightning_accelerator()
        devices = self.parallel_devices
        if self.single_device and devices is not None and len(devices) != 1:
            name = type(self).__name__
            listed = ", ".join(str(device) for device in devices)
            raise AcceleratorValueError(
                f"{name} runs on one device per process, but devices= asked for "
                f"{len(devices)} ({listed}). Pass devices=1 (or devices=[INDEX] for one "
                f"particular device), or use {self.parallel_strategy_name} for one "
                f"process per device."
            )
        return accelerator.handle_for(self.root_device)

    # -- the run -----------------------------------------------------------------------

    def setup_environment(self) -> None:
        self.accel_handle()
        super().setup_environment()  # type: ignore[misc]

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """:class:`AccelCheckpointIO` on this run's accelerator unless one was given."""
        given = self._checkpoint_io
        if isinstance(given, _WrappingCheckpointIO) and self._accelerator is not None:
            # A wrapper given alone (AsyncCheckpointIO()): it wraps accel's, as
            # Lightning's strategies make it wrap theirs (its setter fills it only once).
            given.checkpoint_io = AccelCheckpointIO(self._accelerator)
        if given is not None:
            return given
        io = AccelCheckpointIO(self._accelerator)
        if self._accelerator is not None:  # the Trainer may set the accelerator later
            self._checkpoint_io = io
        return io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io

    def accel_step(
        self,
        optimizer: Any,
        closure: Callable[[], Any] | None,
        precision_step: Callable[[], Any],
        *,
        plain_precision: bool,
    ) -> Any:
        """Step ``optimizer`` with :meth:`accel.Accelerator.optimizer_step`, then mark
        the step (a plugin may cut lazy graphs without stepping differently).

        ``closure`` (forward and backward) runs first, once, so that on XLA the
        gradients exist before accel reduces them across replicas. A precision plugin
        with a step of its own (a gradient scaler's), or an optimizer that evaluates
        its closure several times (LBFGS), steps through ``precision_step`` instead.
        """
        handle = self.accel_handle()
        if not plain_precision or isinstance(optimizer, torch.optim.LBFGS):
            result = precision_step()
        elif closure is None:
            result = handle.optimizer_step(optimizer)
        else:
            loss = closure()
            result = handle.optimizer_step(optimizer, lambda: loss)
        handle.mark_step()
        return result

    def return_to_cpu(self, module: Module | None, optimizers: list[Any]) -> None:
        """Bring ``module`` back to the CPU through accel, optimizers following.

        Lightning's own teardown calls ``module.cpu()``, which unties on the way back
        from XLA; accel keeps the ties and re-points the optimizers.

        :raises RuntimeError: the CPU plugin moved ``module`` into a new module object,
            which Lightning, keeping ``module``, would never see.
        """
        if module is not None and self.root_device.type != "cpu":
            cpu = self.lightning_accelerator()._cpu()
            before = dict(module.named_parameters(remove_duplicate=False))
            # The optimizers follow only a move in place: a new module is refused while
            # they still hold the parameters of the module Lightning keeps.
            require_in_place(module, cpu.model_to_device(module), cpu)
            retarget_optimizers(optimizers, before, module)


def require_in_place(model: Module, moved: Module, handle: accel.Accelerator) -> None:
    """:raises RuntimeError: the plugin moved ``model`` into a new module object."""
    if moved is not model:
        raise AcceleratorRuntimeError(
            f"accelerator {handle.name!r} moved the model by returning a new module "
            f"({type(moved).__name__}) instead of moving it in place; Lightning keeps "
            f"the module it was given, so its strategies need in-place moves. Ask the "
            f"plugin's authors for an in-place model_to_device."
        )
