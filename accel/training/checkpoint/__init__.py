"""Checkpoints and resume: one package for everything a run needs to survive the loss
of its process.

One save, top to bottom, in ``_save``, and one load, in ``_load`` (the handle's ``save``
and ``load`` are those pipelines; a save is the same for synchronous and asynchronous
saves). The steps they call, one job each: the arguments' checks (``_arguments``), CPU
state dicts (``_state``), the save in flight (``_async_save``), the snapshot
(``_snapshot``), every rank's generators (``_rank_generators``), the atomic, durable
write (``_atomic``) and "the main process writes, the others wait for its word"
(``_main_process``); the read (``_read``), whether a checkpoint fits the objects
restored (``_fitting``) and their one upload to the device (``_restoring``). Beside
them: the random generators (``_rng``), preemption (``_preemption``) and keep-last-N
retention (``_retention``). The handle's
``save``, ``load``, ``rng_state``, ``set_rng_state``, ``preemption_guard`` and
``wait_for_saves`` are built on them; the names here are the ones a training loop and a
plugin author use directly.
"""

from __future__ import annotations

from accel.training.checkpoint._async_save import PendingSave, writing_in_background
from accel.training.checkpoint._atomic import atomic_save
from accel.training.checkpoint._main_process import save_on_main_process
from accel.training.checkpoint._preemption import PreemptionGuard
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
)

__all__ = [
    "PendingSave",
    "PreemptionGuard",
    "atomic_save",
    "checkpoint_path",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "save_on_main_process",
    "writing_in_background",
]
