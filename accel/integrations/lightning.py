"""accel inside Lightning: any accel accelerator as a Lightning accelerator.

Quick use (Trainer, then Fabric)::

    from accel.integrations.lightning import AccelFabricStrategy, AccelStrategy

    trainer = lightning.Trainer(strategy=AccelStrategy("tpu"), devices=1)
    fabric = lightning.Fabric(strategy=AccelFabricStrategy("tpu"))

* :class:`AccelAccelerator`: a Lightning accelerator (Trainer and Fabric) whose
  availability, device counts, ``devices=`` parsing and device stats come from an
  accel plugin, built-in or third-party.
* :class:`AccelStrategy` (Trainer) and :class:`AccelFabricStrategy` (Fabric):
  single-device strategies that move the model with
  :meth:`accel.Accelerator.model_to_device`, so tied weights stay tied on TPU.
* :class:`AccelDDPStrategy` (Trainer) and :class:`AccelFabricDDPStrategy` (Fabric):
  one process per device, launched by Lightning, DDP through
  :mod:`accel.distributed`.
* :class:`AccelCheckpointIO`: checkpoints written with :meth:`accel.Accelerator.save`.

Needs the ``lightning`` package (``pip install 'lightning>=2.5'``); ``import accel``
never imports this module.
"""

from __future__ import annotations

try:
    import lightning  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    if exc.name != "lightning":
        raise
    raise ModuleNotFoundError(
        "accel.integrations.lightning needs the 'lightning' package, which is not "
        "installed: pip install 'lightning>=2.5' (or install accel with its "
        "'lightning' extra)",
        name="lightning",
    ) from exc

from accel.integrations._lightning_accelerator import AccelAccelerator
from accel.integrations._lightning_checkpoint import AccelCheckpointIO
from accel.integrations._lightning_ddp import AccelDDPStrategy, AccelFabricDDPStrategy
from accel.integrations._lightning_strategies import AccelFabricStrategy, AccelStrategy

__all__ = [
    "AccelAccelerator",
    "AccelCheckpointIO",
    "AccelDDPStrategy",
    "AccelFabricDDPStrategy",
    "AccelFabricStrategy",
    "AccelStrategy",
]
