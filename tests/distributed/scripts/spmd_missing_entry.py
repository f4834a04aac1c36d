"""Under XLA SPMD, load_sharded into a state the checkpoint does not fit: a model whose
entries it lacks (torch_xla's load planner) and a plain value it lacks.

Usage: PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python spmd_missing_entry.py DIR

``DIR/errors.json`` holds, for each, the type of the exception load_sharded raised
(by name and as accel.AcceleratorKeyError or not) and its message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch_xla.distributed.spmd as xs

import accel
import accel.distributed
from helpers.models import TiedLM


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    context = accel.distributed.init_spmd("tpu")  # before any tensor is on XLA
    acc = context.accelerator
    model = acc.model_to_device(TiedLM())
    xs.mark_sharding(model.body.weight, context.mesh, ("data", None))
    checkpoint = directory / "ckpt"
    accel.distributed.save_sharded({"model": model, "step": 3}, checkpoint)

    wrapped = acc.model_to_device(nn.Sequential(TiedLM()))  # its entries are "0.body.weight", ...
    report = {
        "model": _error(lambda: accel.distributed.load_sharded(checkpoint, {"model": wrapped})),
        "plain": _error(
            lambda: accel.distributed.load_sharded(checkpoint, {"model": model, "epoch": 0})
        ),
    }
    (directory / "errors.json").write_text(json.dumps(report))


def _error(load: Any) -> dict[str, Any]:
    try:
        load()
    except BaseException as error:  # DCP's CheckpointException is one
        return {
            "type": type(error).__name__,
            "key_error": isinstance(error, accel.AcceleratorKeyError),
            "message": str(error),
        }
    return {"type": None, "key_error": False, "message": ""}


if __name__ == "__main__":
    main()
