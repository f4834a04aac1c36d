"""Promises of two processes on the accelerator's distributed backend: an all-reduce,
a DDP step equal to the same step in one process, accumulation under no_sync, gradient
clipping after DDP's reduce, a save
that only the main process writes, and a failed write that raises on both.

The two workers are fresh interpreters that select the accelerator by name from accel's
default registry, as a launched job would: the plugin must be installed (an entry
point), not registered in the parent's code.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

import accel.distributed as adist
from accel.testing.conformance._catalog import Subject, promise
from accel.testing.conformance._models import (
    assert_close,
    cpu_copy,
    cpu_reference_step,
    reference_inputs,
    reference_layer,
    sgd_for,
    squared_error,
)
from accel.testing.conformance._rank_tasks import (
    CLIP_MAX_NORM,
    TASKS,
    WORLD_SIZE,
    all_reduce_task,
    clip_task,
    ddp_step_task,
    failed_save_task,
    gradients_of,
    no_sync_task,
    save_task,
)

__all__ = ["PROMISES"]

#: Seconds both workers get to start (importing torch), meet and finish.
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _worker(rank: int, name: str, port: int, workdir: str) -> None:
    """One rank: start the group through accel, run every task, store what each found
    (its tensors, or the error's last line) for the parent."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    results: dict[str, Any] = {}
    try:
        context = adist.init_process_group(name, timeout=TIMEOUT_S)
        try:
            checks: tuple[Callable[[int, Any], Any], ...] = (
                all_reduce_task,
                ddp_step_task,
                no_sync_task,
                clip_task,
                partial(save_task, workdir=Path(workdir)),
                partial(failed_save_task, workdir=Path(workdir)),
            )
            for task, check in zip(TASKS, checks, strict=True):
                try:
                    results[task] = check(rank, context.accelerator)
                except Exception as exc:
                    results[task] = _last_line(exc)
        finally:
            adist.destroy_process_group()
    except Exception as exc:
        results = dict.fromkeys(TASKS, f"starting the group: {_last_line(exc)}")
    torch.save(results, Path(workdir) / f"rank{rank}.pt")


def _last_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


# One start of the two workers serves every promise: the others read what the first
# ran, or the failure it met (keyed by the run's directory, so that every run starts
# them afresh).
_ran: dict[Path, list[dict[str, Any]] | AssertionError] = {}


def _results(subject: Subject, task: str) -> list[Any]:
    """Each rank's result of ``task``; an error names the rank that failed and how."""
    run_dir = subject.workdir.parent
    if run_dir not in _ran:
        try:
            _ran[run_dir] = _start(subject)
        except AssertionError as exc:
            _ran[run_dir] = exc
    ran = _ran[run_dir]
    if isinstance(ran, AssertionError):
        raise AssertionError(str(ran))
    found = []
    for rank, results in enumerate(ran):
        result = results[task]
        assert not isinstance(result, str), f"rank {rank} failed: {result}"
        found.append(result)
    return found


def _stored(workdir: Path, rank: int) -> dict[str, Any] | None:
    out = workdir / f"rank{rank}.pt"
    return torch.load(out, weights_only=True) if out.exists() else None


def _failed_to_start(workdir: Path, workers: list[subprocess.Popen[bytes]]) -> int | None:
    """The rank that exited without starting the group: the others wait for it in
    vain (until the timeout), so the run stops them at once."""
    for rank, worker in enumerate(workers):
        if worker.poll() is None:
            continue
        stored = _stored(workdir, rank)
        if stored is None or all(
            isinstance(result, str) and result.startswith("starting the group")
            for result in stored.values()
        ):
            return rank
    return None


# One worker: RANK NAME PORT WORKDIR. Called from the imported module, not run with
# `python -m`, which would execute this module a second time beside the package's copy.
_WORKER_CODE = (
    "import sys\n"
    f"from {__name__} import _worker\n"
    "_worker(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4])\n"
)


def _start(subject: Subject) -> list[dict[str, Any]]:
    workdir = subject.workdir
    port = _free_port()
    # Fresh interpreters (not multiprocessing's spawn, which would re-run the caller's
    # main script) that import what this process imports. Their output goes to files:
    # a pipe nobody reads while both run could fill and stop a worker.
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    logs = [workdir / f"rank{rank}.log" for rank in range(WORLD_SIZE)]
    workers = []
    for rank, log in enumerate(logs):
        with log.open("wb") as output:
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _WORKER_CODE,
                        str(rank),
                        subject.requested,
                        str(port),
                        str(workdir),
                    ],
                    env=environment,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
            )
    failed: int | None = None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(worker.poll() is None for worker in workers):
            failed = _failed_to_start(workdir, workers)
            if failed is not None:
                break
            if time.monotonic() > deadline:
                late = next(r for r, w in enumerate(workers) if w.poll() is None)
                raise AssertionError(f"rank {late} did not finish within {TIMEOUT_S} s")
            time.sleep(0.1)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    found = []
    for rank, worker in enumerate(workers):
        stored = _stored(workdir, rank)
        if stored is None and failed is not None and rank != failed:
            theirs = _stored(workdir, failed)
            why = next(iter(theirs.values())) if theirs else "it exited"
            stored = dict.fromkeys(TASKS, f"stopped, as rank {failed} failed {why}")
        if stored is None:
            lines = logs[rank].read_text(errors="replace").strip().splitlines()
            raise AssertionError(
                f"rank {rank} exited with status {worker.returncode} before storing its "
                f"results: {lines[-1] if lines else ''}"
            )
        found.append(stored)
    return found


@promise(
    "distributed.all_reduce",
    "two processes start the group on the accelerator's backend and all-reduce a tensor",
    needs=("distributed",),
)
def all_reduce(subject: Subject) -> None:
    for rank, result in enumerate(_results(subject, "all_reduce")):
        got = result["sum"].tolist()
        assert got == [3.0] * 3, f"rank {rank}: the all-reduce of 1 and 2 gave {got}"


@promise(
    "distributed.ddp_step",
    "a DDP step of two processes, half the batch each, equals one process's step",
    needs=("distributed", "forward"),
)
def ddp_step(subject: Subject) -> None:
    expected = cpu_reference_step(*reference_inputs())
    for rank, result in enumerate(_results(subject, "ddp_step")):
        assert_close(result, expected, f"rank {rank} after the DDP step")


def _cpu_grads(inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    model = reference_layer()
    (squared_error(model(inputs), targets) * WORLD_SIZE).backward()  # type: ignore[no-untyped-call]
    return gradients_of(model)


def _grads_text(grads: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{name} {tensor.flatten()[:2].tolist()}" for name, tensor in grads.items())


@promise(
    "distributed.no_sync",
    "under no_sync(enabled=True) backward keeps each rank's gradients; enabled=False "
    "syncs them, and the accumulated step equals one process's",
    needs=("distributed", "forward"),
)
def no_sync(subject: Subject) -> None:
    inputs, targets = reference_inputs()
    whole = {name: g / WORLD_SIZE for name, g in _cpu_grads(inputs, targets).items()}
    for rank, result in enumerate(_results(subject, "no_sync")):
        first = inputs.chunk(2)[rank].chunk(2)[0], targets.chunk(2)[rank].chunk(2)[0]
        own = _cpu_grads(*first)
        got = result["unsynced"]
        assert all(torch.allclose(got[k], v, rtol=1e-4, atol=1e-5) for k, v in own.items()), (
            f"rank {rank}: under no_sync(enabled=True) the gradients were reduced across "
            f"the ranks ({_grads_text(got)}; its own: {_grads_text(own)})"
        )
        got = result["synced"]
        assert all(torch.allclose(got[k], v, rtol=1e-4, atol=1e-5) for k, v in whole.items()), (
            f"rank {rank}: after the micro-step under no_sync(enabled=False) the gradients "
            f"are {_grads_text(got)}, not the synced {_grads_text(whole)} (the sync was "
            "skipped?)"
        )
        assert_close(result["model"], cpu_reference_step(inputs, targets), f"rank {rank}")


def _cpu_clipped_step(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, Any]:
    model = reference_layer()
    optimizer = sgd_for(model)
    squared_error(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_MAX_NORM)
    optimizer.step()
    return norm, cpu_copy(model)


@promise(
    "distributed.clip_grad_norm_",
    "in a job of two processes clip_grad_norm_ after a DDP backward clips the reduced "
    "gradients once: the whole model's norm on both ranks, and one process's clipped step",
    needs=("distributed", "forward", "reductions"),
)
def clip_in_a_job(subject: Subject) -> None:
    inputs, targets = reference_inputs()
    norm, expected = _cpu_clipped_step(inputs, targets)
    for rank, result in enumerate(_results(subject, "clip")):
        got = result["norm"]
        assert torch.allclose(got, norm, rtol=1e-4, atol=1e-5), (
            f"rank {rank}: clip_grad_norm_ returned {float(got):.6g} where the whole "
            f"model's gradients have norm {float(norm):.6g}: DDP had reduced them already "
            "(were they reduced again, or clipped unreduced?)"
        )
        assert_close(result["model"], expected, f"rank {rank}: the clipped step")


@promise(
    "distributed.save_on_main_process",
    "in a job of two processes only the main one writes a save, and each returns once "
    "the file is complete",
    needs=("distributed",),
)
def save_on_main_process(subject: Subject) -> None:
    for rank, result in enumerate(_results(subject, "save")):
        writer = int(result["writer"])
        assert writer != -1, (
            f"rank {rank}: save returned before the main process had written the file "
            "(every process returns once the file is complete)"
        )
        assert writer == 0, (
            f"rank {rank} read back the file rank {writer} saved: only the main process "
            "(rank 0) of a distributed job may write a save (as "
            "accel.training.checkpoint.save_on_main_process does)"
        )


@promise(
    "distributed.failed_save_raises_everywhere",
    "in a job of two processes a save whose write fails on the main process raises an "
    "OSError on both",
    needs=("distributed",),
)
def failed_save_raises_everywhere(subject: Subject) -> None:
    for rank, result in enumerate(_results(subject, "failed_save")):
        assert int(result["raised"]) == 1, (
            f"rank {rank}: save returned as if the file were written, but rank 0's write "
            "failed (the kit's object raises OSError, as a full disk does): a failed write "
            "must raise an OSError on every process (as "
            "accel.training.checkpoint.save_on_main_process does)"
        )


PROMISES = (
    all_reduce,
    ddp_step,
    no_sync,
    clip_in_a_job,
    save_on_main_process,
    failed_save_raises_everywhere,
)
