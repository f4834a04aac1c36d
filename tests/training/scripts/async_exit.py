"""A process that returns from main with an asynchronous save still writing.

Usage: python async_exit.py finish|fail DIR

The write is held until the interpreter exits (an atexit handler registered after
accel's lets it go), so the save is pending at exit for certain. ``fail`` first saves
a small checkpoint at ``DIR/c.pt``, then sets a file size limit the pending write
runs into.
"""

from __future__ import annotations

import atexit
import resource
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch

import accel
from accel.training import atomic


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    acc = accel.get_accelerator("cpu")
    path = directory / "c.pt"
    if mode == "fail":
        acc.save({"x": torch.zeros(4)}, path)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    exiting = threading.Event()
    real_write = atomic._RecordingFile.write

    def write(self: atomic._RecordingFile, data: Any) -> int:
        exiting.wait()
        return real_write(self, data)

    atomic._RecordingFile.write = write  # type: ignore[method-assign]
    pending = acc.save(
        {"x": torch.arange(2**16, dtype=torch.float32)}, path, asynchronous=True
    )  # 256 KiB
    # atexit runs last in, first out: this handler runs before accel's, which waits.
    atexit.register(exiting.set)
    print(f"pending at exit: {not pending.done()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
