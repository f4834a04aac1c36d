"""Trains a tied model on XLA, under SPMD over every device or on one device.

Usage: PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python spmd_tied.py spmd|single REPORT [STEPS]

``spmd`` sets up accel.distributed's data-parallel mesh and shards each batch over
it; ``single`` trains the same model on the same batches on one XLA device. The test
compares the two reports: equal losses and parameters prove that SPMD split the
batch and summed the gradients back, and ties must hold in both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel
import accel.distributed
from helpers.models import TiedLM


def main() -> None:
    mode, report_path = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import torch_xla
    import torch_xla.runtime as xr

    report: dict[str, object] = {"mode": mode}
    if mode == "spmd":
        context = accel.distributed.init_spmd("tpu")  # before any tensor is on XLA
        report["num_devices"] = context.num_devices
        report["is_spmd"] = bool(xr.is_spmd())
        accelerator = context.accelerator
        try:
            accel.distributed.init_process_group("tpu")
        except accel.distributed.DistributedSetupError as exc:
            report["process_group_refused"] = str(exc)
    else:
        accelerator = accel.get_accelerator("tpu")
    torch.manual_seed(0)
    model = accelerator.model_to_device(TiedLM())
    report["tied_after_move"] = model.head.weight is model.embed.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 16, (4, 5), generator=generator)
        if mode == "spmd":
            tokens = accel.distributed.shard_batch(tokens)
            report["batch_sharding"] = torch_xla._XLAC._get_xla_sharding_spec(tokens)
        else:
            tokens = accelerator.batch_to_device(tokens)
        loss = model(tokens).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())
    report["losses"] = losses
    report["tied"] = model.head.weight is model.embed.weight
    report["unique_parameters"] = len({id(p) for p in model.parameters()})
    report["parameters"] = {
        name: p.detach().cpu().reshape(-1).tolist() for name, p in model.named_parameters()
    }
    report_path.write_text(json.dumps(report))


if __name__ == "__main__":
    main()
