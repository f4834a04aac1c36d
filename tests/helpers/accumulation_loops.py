"""One gradient-accumulation loop on XLA, fed three ways, counting XLA's work.

The loop is the same in each: micro-batches of token ids through a small tied
language model, the loss divided by the number of micro-batches, one optimizer step
every ``micro`` batches. Only where the batches come from changes: ``acc.device_loader``,
``acc.batch_to_device`` (with one step mark per optimizer step), or torch_xla's own
``MpDeviceLoader``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.nn import functional as F

import accel
from helpers.models import TiedLM

STEPS = 6
MICRO = 3
VOCAB = 16


def xla_work() -> tuple[int, int]:
    """Graphs compiled and graph executions run so far in this process, once what was
    dispatched has finished (torch_xla counts an execution when it ends)."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    xm.wait_device_ops()
    compiled = met.metric_data("CompileTime")
    executed = met.metric_data("ExecuteTime")
    return (compiled[0] if compiled else 0), (executed[0] if executed else 0)


def data(steps: int = STEPS, micro: int = MICRO) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (4, 9), generator=generator) for _ in range(steps * micro)]


def accumulate(
    loop: str, *, step: str = "acc", steps: int = STEPS, micro: int = MICRO
) -> dict[str, Any]:
    """Train ``steps`` optimizer steps of ``micro`` micro-batches; return the graphs and
    executions the loop cost and its losses.

    :param loop: ``"device_loader"``, ``"batch_to_device"`` or ``"MpDeviceLoader"``.
    :param step: ``"acc"`` (``acc.optimizer_step``, which marks the step itself outside
        a ``device_loader`` loop) or ``"plain"`` (``optimizer.step()``, and, for
        ``batch_to_device``, ``acc.mark_step()`` after it).
    """
    import torch_xla.distributed.parallel_loader as pl

    acc = accel.get_accelerator("tpu")
    torch.manual_seed(0)
    model = acc.model_to_device(TiedLM(VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches: Iterable[torch.Tensor]
    if loop == "device_loader":
        batches = acc.device_loader(data(steps, micro))
    elif loop == "MpDeviceLoader":
        batches = pl.MpDeviceLoader(data(steps, micro), acc.device)
    else:
        batches = (acc.batch_to_device(tokens) for tokens in data(steps, micro))
    acc.mark_step()
    graphs, executions = xla_work()
    losses = []
    for index, tokens in enumerate(batches):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        (loss / micro).backward()
        losses.append(loss.detach())
        if index % micro == micro - 1:
            if step == "acc":
                acc.optimizer_step(optimizer)
            else:
                optimizer.step()
                if loop == "batch_to_device":
                    acc.mark_step()
            optimizer.zero_grad()
    acc.mark_step()  # the MpDeviceLoader loop's last step
    graphs_now, executions_now = xla_work()
    return {
        "graphs": graphs_now - graphs,
        "executions": executions_now - executions,
        "losses": [float(loss) for loss in losses],
    }
