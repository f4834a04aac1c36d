"""A torchrun worker for save_sharded over two gloo ranks whose commit fails on rank 0.

Usage: torchrun --nproc-per-node 2 sharded_commit_ranks.py MODE DIR

Every rank writes its shards; then rank 0's rename of the complete directory to
``DIR/ckpt`` fails (``os.replace`` refused with EACCES). MODE ``sync`` or ``async``:
``save_sharded(..., asynchronous=MODE == "async")``, then ``wait()``. Every rank must
raise an ``OSError`` carrying that errno and the path, rather than wait for a rank 0
that gave up. Each rank writes what it saw to ``DIR/rank<r>.json``.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import accel.distributed


def refuse_renames_to(target: Path) -> None:
    real = os.replace

    def replace(source: Any, destination: Any, **kwargs: Any) -> None:
        if Path(destination) == target:
            raise PermissionError(errno.EACCES, "refused by the test", str(destination))
        real(source, destination, **kwargs)

    os.replace = replace


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    context = accel.distributed.init_process_group("cpu", timeout=60)
    rank = context.rank
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    target = directory / "ckpt"
    if rank == 0:
        refuse_renames_to(target)
    report: dict[str, Any] = {"rank": rank}
    try:
        pending = accel.distributed.save_sharded(
            {"model": model, "step": 1}, target, asynchronous=mode == "async"
        )
        if pending is not None:
            pending.wait()
    except OSError as exc:
        report["error"] = type(exc).__name__
        report["errno"], report["filename"] = exc.errno, exc.filename
    except BaseException as exc:  # a gloo timeout: what the others got before the fix
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["target_exists"] = target.exists()
    report["leftovers"] = sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
    (directory / f"rank{rank}.json").write_text(json.dumps(report))
    accel.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
