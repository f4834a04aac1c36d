"""A torchrun worker for acc.save(..., asynchronous=True) over two gloo ranks.

Usage: torchrun --nproc-per-node 2 async_ranks.py MODE DIR

MODE ``wait``: rank 0's write is held until rank 1 has looked at its pending save and
rank 0 has changed the model after save returned; then every rank's ``wait()`` must
return with the file complete and holding the values from before the change. MODE
``fail``: rank 0's write runs into a file size limit; every rank's ``wait()`` raises.
Each rank writes what it saw to ``DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import accel.distributed
from accel.training import atomic


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


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
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
