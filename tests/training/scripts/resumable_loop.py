"""A training run that resumes from its newest checkpoint, for the kill tests.

Dropout, AdamW, a StepLR schedule, a seeded data order and draws from Python's and
NumPy's generators, a tied embedding; a checkpoint every ``--every`` steps (the last
two kept), under ``acc.preemption_guard()``. At the end the final state goes to
``<dir>/final.pt``. The test picks where the run dies, by environment variable:

- ``KILL_AFTER_STEP=n``: SIGKILL right after step ``n``;
- ``KILL_IN_SAVE_AT_STEP=n``: SIGKILL in the middle of writing step ``n``'s checkpoint,
  after its first kilobytes reached the temporary file;
- ``TERM_AFTER_STEP=n``: SIGTERM right after step ``n`` (the guard notes it; the run
  saves and exits 0).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from pathlib import Path

import numpy
import torch
from torch import nn

import accel
from accel.training.checkpoint import _atomic as atomic
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    prune_checkpoints,
)

VOCAB, WIDTH, BATCH, SAMPLES = 32, 16, 8, 64


class TiedDropoutLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.tanh(self.hidden(self.embed(tokens)))))


def batch_at(step: int, tokens: torch.Tensor) -> torch.Tensor:
    """The step's batch: a permutation per epoch, seeded by the epoch (no hidden state)."""
    per_epoch = SAMPLES // BATCH
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(1000 + epoch))
    return tokens[order[index * BATCH : (index + 1) * BATCH]]


def die_in_save(at_step: int, step: list[int]) -> None:
    real_write = atomic._RecordingFile.write

    def write(self: atomic._RecordingFile, data: object) -> int:
        written = real_write(self, data)
        if step[0] == at_step and self.file.tell() > 1024:
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    atomic._RecordingFile.write = write  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args()
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    kill_after = int(os.environ.get("KILL_AFTER_STEP", "-1"))
    term_after = int(os.environ.get("TERM_AFTER_STEP", "-1"))
    current = [0]
    if "KILL_IN_SAVE_AT_STEP" in os.environ:
        die_in_save(int(os.environ["KILL_IN_SAVE_AT_STEP"]), current)

    acc = accel.get_accelerator(args.accelerator)
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
            noise = random.random() + float(numpy.random.rand())  # host generators in use
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1)
            ) * (1.0 + 1e-3 * noise)
            loss.backward()
            acc.optimizer_step(optimizer)
            optimizer.zero_grad()
            scheduler.step()
            step += 1
            current[0] = step
            if step == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == term_after:
                os.kill(os.getpid(), signal.SIGTERM)
            if guard.requested or step % args.every == 0:
                acc.save(
                    {**state, "step": step, "rng": acc.rng_state()},
                    checkpoint_path(directory, step),
                )
                prune_checkpoints(directory, keep=2)
            if guard.requested:
                print(f"preempted: saved step {step}", flush=True)
                return 0
    acc.save({"model": model, "optimizer": optimizer, "step": step}, directory / "final.pt")
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
