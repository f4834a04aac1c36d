"""Promises of two processes on the accelerator's distributed backend: an all-reduce,
and a DDP step equal to the same step in one process.

The two workers are spawned fresh and select the accelerator by name from accel's
default registry, as a launched job would: the plugin must be installed (an entry
point), not registered in the parent's code.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback
from pathlib import Path

import torch
from torch import nn

from accel.testing.conformance._catalog import Subject, promise
from accel.testing.conformance._models import (
    assert_close,
    cpu_copy,
    cpu_reference_step,
    reference_inputs,
    reference_layer,
    sgd_for,
)

__all__ = ["PROMISES"]

WORLD_SIZE = 2
#: Seconds both workers get to start (importing torch), meet and finish.
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _worker(rank: int, name: str, port: int, workdir: str, task: str) -> None:
    """One rank: start the group through accel, run ``task``, store what it found."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    out = Path(workdir) / f"rank{rank}.pt"
    try:
        import accel.distributed as adist

        context = adist.init_process_group(name, timeout=TIMEOUT_S)
        acc = context.accelerator
        try:
            if task == "all_reduce":
                tensor = torch.full((3,), float(rank + 1), device=acc.device)
                torch.distributed.all_reduce(tensor)
                result = {"sum": tensor.to("cpu")}
            else:
                model = acc.model_to_device(reference_layer())
                optimizer = sgd_for(model)
                wrapped = adist.wrap_data_parallel(model)
                inputs, targets = reference_inputs()
                x, y = acc.batch_to_device((inputs.chunk(2)[rank], targets.chunk(2)[rank]))
                # DDP averages the ranks' gradients: twice each half's sum is the
                # whole batch's sum, as the one-process step computes it.
                loss = nn.functional.mse_loss(wrapped(x), y, reduction="sum") * WORLD_SIZE
                loss.backward()
                acc.optimizer_step(optimizer)
                result = cpu_copy(model)
        finally:
            adist.destroy_process_group()
        torch.save(result, out)
    except BaseException:
        out.with_suffix(".error").write_text(traceback.format_exc())
        raise


def _run(subject: Subject, task: str) -> list[dict[str, torch.Tensor]]:
    """Both ranks' results; an error names the rank that failed and how."""
    workdir = subject.workdir / task
    workdir.mkdir()
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    workers = [
        context.Process(
            target=_worker, args=(rank, subject.requested, port, str(workdir), task), daemon=True
        )
        for rank in range(WORLD_SIZE)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(TIMEOUT_S)
    for rank, worker in enumerate(workers):
        if worker.is_alive():
            worker.kill()
            worker.join()
            raise AssertionError(f"rank {rank} did not finish within {TIMEOUT_S} s")
    results = []
    for rank, worker in enumerate(workers):
        error = workdir / f"rank{rank}.error"
        if error.exists():
            last = error.read_text().strip().splitlines()[-1]
            raise AssertionError(f"rank {rank} failed: {last}")
        assert worker.exitcode == 0, f"rank {rank} exited with status {worker.exitcode}"
        results.append(torch.load(workdir / f"rank{rank}.pt", weights_only=True))
    return results


@promise(
    "distributed.all_reduce",
    "two processes start the group on the accelerator's backend and all-reduce a tensor",
    needs=("distributed",),
)
def all_reduce(subject: Subject) -> None:
    for rank, result in enumerate(_run(subject, "all_reduce")):
        got = result["sum"].tolist()
        assert got == [3.0] * 3, f"rank {rank}: the all-reduce of 1 and 2 gave {got}"


@promise(
    "distributed.ddp_step",
    "a DDP step of two processes, half the batch each, equals one process's step",
    needs=("distributed", "forward"),
)
def ddp_step(subject: Subject) -> None:
    expected = cpu_reference_step(*reference_inputs())
    for rank, result in enumerate(_run(subject, "ddp_step")):
        assert_close(result, expected, f"rank {rank} after the DDP step")


PROMISES = (all_reduce, ddp_step)
