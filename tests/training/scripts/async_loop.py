"""``resumable_loop.py``'s run, saving with ``asynchronous=True``, for the kill tests.

The model, data, generators and schedule are resumable_loop's, so an uninterrupted run
ends with its parameters. A checkpoint every ``--every`` steps, pruned to the last two
right after the save returns. Which checkpoints that prune keeps depends on whether the
background write has ended by then (a checkpoint still being written is neither counted
nor deleted), so a test that checks them says when the write ends:

- ``WRITE_ENDS=after-prune``: every background write waits until the loop has pruned
  (the checkpoint being written is never counted);
- ``WRITE_ENDS=before-prune``: the loop waits for the write before it prunes (every
  checkpoint is counted, as with synchronous saves).

The test picks where the run dies, by environment variable:

- ``KILL_IN_WRITE_OF_STEP=n``: SIGKILL in the middle of the background write of step
  ``n``'s checkpoint, after its first kilobytes reached the temporary file, at
  whatever step the loop has reached by then;
- ``TERM_AFTER_STEP=n``: SIGTERM right after step ``n`` (the guard notes it; the run
  saves and exits 0 once the save is complete).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy
import torch
from resumable_loop import SAMPLES, VOCAB, TiedDropoutLM, batch_at
from torch import nn

import accel
from accel.training.checkpoint import _atomic as atomic
from accel.training.checkpoint import _save, writing_in_background
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    prune_checkpoints,
)


def die_in_write(name: str) -> None:
    writing = threading.local()
    real_save, real_write = _save.atomic_save, atomic._RecordingFile.write

    def atomic_save(obj: Any, path: Any) -> None:
        writing.name = Path(path).name
        real_save(obj, path)

    def write(self: atomic._RecordingFile, data: object) -> int:
        written = real_write(self, data)
        if getattr(writing, "name", None) == name and self.file.tell() > 1024:
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    _save.atomic_save = atomic_save  # type: ignore[assignment]
    atomic._RecordingFile.write = write  # type: ignore[method-assign]


def hold_writes_until_pruned() -> threading.Semaphore:
    """Each background write waits for one ``release()`` of the returned semaphore, which
    the loop gives once it has pruned after that save."""
    pruned = threading.Semaphore(0)
    real_save = _save.atomic_save

    def atomic_save(obj: Any, path: Any) -> None:
        if writing_in_background() and not pruned.acquire(timeout=60):
            raise RuntimeError(f"the loop never pruned after the save of {path}")
        real_save(obj, path)

    _save.atomic_save = atomic_save  # type: ignore[assignment]
    return pruned


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3)
    args = parser.parse_args()
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    term_after = int(os.environ.get("TERM_AFTER_STEP", "-1"))
    write_ends = os.environ.get("WRITE_ENDS")
    if write_ends not in (None, "after-prune", "before-prune"):
        parser.error(f"WRITE_ENDS is after-prune or before-prune, not {write_ends!r}")
    pruned = hold_writes_until_pruned() if write_ends == "after-prune" else None
    if "KILL_IN_WRITE_OF_STEP" in os.environ:
        die_in_write(checkpoint_path(directory, int(os.environ["KILL_IN_WRITE_OF_STEP"])).name)

    acc = accel.get_accelerator("cpu")
    acc.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    tokens = torch.randint(0, VOCAB, (SAMPLES, 6), generator=torch.Generator().manual_seed(7))
    model = acc.model_to_device(TiedDropoutLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    step = 0
    resume_from = latest_checkpoint(directory)
    if resume_from is not None:
        remainder = acc.load(resume_from, state)
        step = remainder["step"]
        acc.set_rng_state(remainder["rng"])
        print(f"resumed from {resume_from.name} at step {step}", flush=True)

    with acc.preemption_guard() as guard:
        while step < args.steps:
            batch = acc.batch_to_device(batch_at(step, tokens))
            noise = random.random() + float(numpy.random.rand())
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1)
            ) * (1.0 + 1e-3 * noise)
            loss.backward()
            acc.optimizer_step(optimizer)
            optimizer.zero_grad()
            scheduler.step()
            step += 1
            if step == term_after:
                os.kill(os.getpid(), signal.SIGTERM)
            if guard.requested or step % args.every == 0:
                pending = acc.save(
                    {**state, "step": step, "rng": acc.rng_state()},
                    checkpoint_path(directory, step),
                    asynchronous=True,
                )
                if write_ends == "before-prune":
                    pending.wait()
                prune_checkpoints(directory, keep=2)  # a pending one is not counted
                if pruned is not None:
                    pruned.release()
            if guard.requested:
                print(f"preempted: saving step {step}", flush=True)
                break
    if guard.requested:  # the guard's exit waited for the save
        print(f"preempted: saved step {step}, complete: {pending.done()}", flush=True)
        return 0
    acc.save({"model": model, "optimizer": optimizer, "step": step}, directory / "final.pt")
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
