"""A torchrun worker for acc.save(..., asynchronous=True) over two gloo ranks.

Usage: torchrun --nproc-per-node 2 async_ranks.py MODE DIR

MODE ``wait``: rank 0's write is held until rank 1 has looked at its pending save and
rank 0 has changed the model after save returned; then every rank's ``wait()`` must
return with the file complete and holding the values from before the change. MODE
``fail``: rank 0's write runs into a file size limit; every rank's ``wait()`` raises.
MODE ``wrapper``: a plugin wraps the ``save`` hook and passes it through; an
asynchronous save must still be written by rank 0 alone, with no collective in the
background (the others hear from it over accel's save group). MODE ``thread``: the loop
runs in a thread that is not the main one (as Ray Train's does) and saves
synchronously; rank 0 alone writes, and every rank returns once the file is complete.
Each rank writes what it saw to ``DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import accel
import accel.distributed
from accel.training.checkpoint import _atomic as atomic
from accel.training.checkpoint import _main_process as main_process
from accel.training.checkpoint import _save as save_pipeline


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def hold_writes_until(path: Path) -> None:
    real_write = atomic._RecordingFile.write

    def write(self: atomic._RecordingFile, data: Any) -> int:
        wait_for(path)
        return real_write(self, data)

    atomic._RecordingFile.write = write  # type: ignore[method-assign]


class PassesSaveThrough:
    """A cross-cutting plugin that wraps ``save`` and changes nothing."""

    def __init__(self) -> None:
        self.calls = 0

    @accel.hookimpl(wrapper=True)
    def save(self) -> Generator[None, Any, Any]:
        self.calls += 1
        return (yield)


def record_atomic_writes() -> list[str]:
    """The paths this process writes with atomic_save, by whichever caller."""
    written: list[str] = []
    real = atomic.atomic_save

    def atomic_save(obj: Any, path: Any) -> None:
        written.append(str(path))
        real(obj, path)

    # Both names it is called by: accel's own background write, and the fallback's.
    save_pipeline.atomic_save = atomic_save
    main_process.atomic_save = atomic_save
    return written


def save_in_a_thread(acc: Any, obj: Any, path: Path) -> BaseException | None:
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            acc.save(obj, path)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=loop, name="train-loop")
    thread.start()
    thread.join()
    return failures[0] if failures else None


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = PassesSaveThrough()
    if mode == "wrapper":
        accel.default_registry().register(wrapper, name="passes-save-through")
    context = accel.distributed.init_process_group("cpu", timeout=60)
    acc, rank = context.accelerator, context.rank
    torch.manual_seed(0)
    model = nn.Linear(64, 64)
    path = directory / "c.pt"
    report: dict[str, Any] = {"rank": rank}
    if mode == "wait":
        expected = {name: value.clone() for name, value in model.state_dict().items()}
        if rank == 0:
            hold_writes_until(directory / "release")
        pending = acc.save({"model": model, "step": 1}, path, asynchronous=True)
        if rank == 1:
            report["done_before_rank_0_wrote"] = pending.done()
            (directory / "rank1-looked").touch()
        else:
            with torch.no_grad():
                model.weight.add_(1.0)  # after save returned, before the write
            wait_for(directory / "rank1-looked")
            (directory / "release").touch()
        pending.wait()
        report["complete_after_wait"] = path.is_file()
        stored = torch.load(path, weights_only=True)
        report["holds_the_old_values"] = all(
            torch.equal(stored["model"][name], value) for name, value in expected.items()
        )
    elif mode in ("wrapper", "thread"):
        written = record_atomic_writes()
        obj = {"rank": torch.tensor(rank)}
        if mode == "wrapper":
            acc.save(obj, path, asynchronous=True).wait()
            report["wrapper_calls"] = wrapper.calls
        else:
            failure = save_in_a_thread(acc, obj, path)
            report["failure"] = None if failure is None else repr(failure)
        report["complete"] = path.is_file()
        report["written_here"] = written
        report["stored_rank"] = int(torch.load(path, weights_only=True)["rank"])
    else:
        acc.save({"small": torch.zeros(4)}, path)
        if rank == 0:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        pending = acc.save({"big": torch.zeros(2**16)}, path, asynchronous=True)
        try:
            pending.wait()
        except OSError as exc:
            report["errno"], report["message"] = exc.errno, str(exc)
        report["previous_intact"] = torch.equal(
            torch.load(path, weights_only=True)["small"], torch.zeros(4)
        )
    acc.wait_for_saves()  # told already: nothing more to raise
    (directory / f"rank{rank}.json").write_text(json.dumps(report))
    accel.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
