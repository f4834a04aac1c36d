"""Trains a tied model under XLA SPMD over every device, checkpointing through
accel.distributed.save_sharded / load_sharded, and resumes after a kill.

Usage: PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python spmd_resume.py DIR [STEPS]

The body's weight is sharded over the devices (its rows split), the batch too. A
checkpoint every 3 steps (``DIR/step-*.pt``, directories); at start the newest
one is loaded. ``KILL_AFTER_STEP=n``: SIGKILL right after step ``n``. At the end,
``DIR/final.json`` holds the parameters, whether the tie held after the load, and
how many devices the batch was sharded over.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch_xla.distributed.spmd as xs

import accel.distributed
from accel.training.checkpoint._retention import checkpoint_path, latest_checkpoint
from helpers.models import TiedLM


def main() -> None:
    directory = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    kill_after = int(os.environ.get("KILL_AFTER_STEP", "-1"))
    directory.mkdir(parents=True, exist_ok=True)
    context = accel.distributed.init_spmd("tpu")  # before any tensor is on XLA
    acc = context.accelerator
    acc.manual_seed(0)
    model = acc.model_to_device(TiedLM())
    # One weight sharded over the devices (rows split), so the checkpoint holds shards.
    xs.mark_sharding(model.body.weight, context.mesh, ("data", None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    state = {"model": model, "optimizer": optimizer}
    step, report = 0, {"num_devices": context.num_devices}
    report["body_sharding"] = _sharding(model.body.weight)
    newest = latest_checkpoint(directory)
    if newest is not None:
        remainder = accel.distributed.load_sharded(newest, {**state, "step": 0})
        step = remainder["step"]
        report["resumed_from"] = newest.name
        report["tied_after_load"] = model.head.weight is model.embed.weight
        report["devices_after_load"] = sorted({str(p.device) for p in model.parameters()})
        report["body_sharding_after_load"] = _sharding(model.body.weight)
    data = torch.Generator().manual_seed(7)
    for _ in range(step):  # the data order continues where it stopped
        torch.randint(0, 16, (4, 5), generator=data)
    while step < steps:
        tokens = accel.distributed.shard_batch(torch.randint(0, 16, (4, 5), generator=data))
        loss = model(tokens).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        acc.optimizer_step(optimizer)
        step += 1
        if step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step % 3 == 0:
            path = checkpoint_path(directory, step)
            accel.distributed.save_sharded({**state, "step": step}, path)
    report["tied"] = model.head.weight is model.embed.weight
    report["parameters"] = {
        name: p.detach().cpu().reshape(-1).tolist() for name, p in model.named_parameters()
    }
    report["adam_steps"] = [float(s["step"]) for s in optimizer.state.values()]
    (directory / "final.json").write_text(json.dumps(report))


def _sharding(tensor: torch.Tensor) -> str:
    import torch_xla

    return str(torch_xla._XLAC._get_xla_sharding_spec(tensor))


if __name__ == "__main__":
    main()
