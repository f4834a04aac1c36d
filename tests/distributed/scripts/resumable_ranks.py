"""A torchrun worker that trains, checkpoints and resumes across two gloo ranks.

Usage: torchrun --nproc-per-node 2 resumable_ranks.py MODE DIR [STEPS]

MODE ``ddp``: DistributedDataParallel, checkpoints through ``acc.save`` / ``acc.load``
(rank 0 writes, every rank reads). MODE ``fsdp``: FSDP2 through ``fully_shard_tied``,
checkpoints through ``accel.distributed.save_sharded`` / ``load_sharded`` (each rank
writes its shards). A checkpoint every 3 steps, the newest two kept, under
``acc.preemption_guard()``; the full parameters go to ``DIR/final.pt`` at the end.

- ``KILL_AFTER_STEP=n``: every rank SIGKILLs itself right after step ``n``;
- ``KILL_RANK=r`` with ``KILL_AFTER_STEP``: only rank ``r`` SIGKILLs itself, and only in
  torchrun's first attempt (``TORCHELASTIC_RESTART_COUNT`` 0), so that a restart runs on;
- ``TERM_AFTER_STEP=n``: rank 1 alone gets SIGTERM after step ``n``; both ranks must
  save at the same step and exit 0;
- ``SLOW_STEP_S=s``: a run that did not resume sleeps ``s`` seconds after each step,
  so that a scheduler's signal finds it training (the resumed run goes at full speed);
- ``TERM_AT_START_UP=1``: in a run that did not resume, rank 1 alone gets SIGTERM once
  the process group and DDP are up, before the guard is entered (start-up);
- ``HOLD_AT_START_UP_S=s``: a run that did not resume writes ``DIR/started-rank<r>``
  once it is started up (process group, model, DDP) and sleeps ``s`` seconds before its
  loop, so that a signal sent then finds it starting up;
- ``SEED_PER_RANK=1``: once the model is built, every generator (torch, Python,
  NumPy) is seeded by rank, and each step's loss is scaled by a draw from Python's
  and NumPy's: the ranks' dropout masks and scales differ. Each rank then writes its
  own ``DIR/final-rank<r>.pt``: the full parameters and its generators' final states.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy
import torch
from torch import nn

import accel.distributed
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    prune_checkpoints,
)

VOCAB, WIDTH = 16, 8


class TiedDropoutLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.body = nn.Linear(WIDTH, WIDTH)
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.tanh(self.body(self.embed(tokens)))))


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 9
    kill_after = int(os.environ.get("KILL_AFTER_STEP", "-1"))
    term_after = int(os.environ.get("TERM_AFTER_STEP", "-1"))
    kill_rank = os.environ.get("KILL_RANK")
    if kill_rank is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        kill_after = -1  # restarted by torchrun: run to the end
    slow_step_s = float(os.environ.get("SLOW_STEP_S", "0"))
    term_at_start_up = os.environ.get("TERM_AT_START_UP") == "1"
    hold_at_start_up_s = float(os.environ.get("HOLD_AT_START_UP_S", "0"))
    directory.mkdir(parents=True, exist_ok=True)
    context = accel.distributed.init_process_group("cpu", timeout=60)
    acc, rank = context.accelerator, context.rank
    acc.manual_seed(0)
    model = acc.model_to_device(TiedDropoutLM())
    if mode == "ddp":
        trained: nn.Module = accel.distributed.wrap_data_parallel(model, context)
    else:
        trained = accel.distributed.fully_shard_tied(model, [model.embed, model.head])
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    per_rank = os.environ.get("SEED_PER_RANK") == "1"
    if per_rank:  # after the model: its initial values stay the same on every rank
        acc.manual_seed(1000 + rank)
        random.seed(2000 + rank)
        numpy.random.seed(3000 + rank)
    step = 0
    newest = latest_checkpoint(directory)
    if newest is not None:
        if mode == "ddp":
            remainder = acc.load(newest, state)
        else:
            placeholders = {**state, "step": 0, "rng": acc.rng_state()}
            remainder = accel.distributed.load_sharded(newest, placeholders)
        step = remainder["step"]
        acc.set_rng_state(remainder["rng"])
        print(f"rank {rank} resumed from {newest.name} at step {step}", flush=True)
        slow_step_s = hold_at_start_up_s = 0.0
        term_at_start_up = False
    if term_at_start_up and rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    if hold_at_start_up_s:
        (directory / f"started-rank{rank}").touch()
        time.sleep(hold_at_start_up_s)

    data = torch.Generator().manual_seed(7)
    for _ in range(step):  # the data order continues where it stopped
        torch.randint(0, VOCAB, (4, 6), generator=data)
    with acc.preemption_guard() as guard:
        if guard.received is not None:  # a signal from start-up, taken over by the guard
            name = signal.Signals(guard.received).name
            print(f"rank {rank} noted {name} before the loop", flush=True)
        while step < steps:
            tokens = torch.randint(0, VOCAB, (4, 6), generator=data)
            mine = tokens[rank * 2 : (rank + 1) * 2]
            logits = trained(mine[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1))
            if per_rank:
                loss = loss * (1 + random.random() / 10 + float(numpy.random.rand()) / 10)
            loss.backward()
            acc.optimizer_step(optimizer)
            optimizer.zero_grad()
            scheduler.step()
            step += 1
            if step == kill_after and kill_rank in (None, str(rank)):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(slow_step_s)
            if step == term_after and rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            requested = guard.requested  # every rank reads it at every step
            if requested or step % 3 == 0:
                path = checkpoint_path(directory, step)
                snapshot = {**state, "step": step, "rng": acc.rng_state()}
                if mode == "ddp":
                    acc.save(snapshot, path)
                else:
                    accel.distributed.save_sharded(snapshot, path)
                if rank == 0:
                    prune_checkpoints(directory, keep=2)
            if requested:
                print(f"rank {rank} preempted: saved step {step}", flush=True)
                noted = "nothing" if guard.received is None else signal.Signals(guard.received).name
                print(f"rank {rank} noted {noted}", flush=True)
                break
    if step == steps:
        full = {name: _full(p) for name, p in model.named_parameters(remove_duplicate=False)}
        acc.save(
            {"model": full, "tied": model.head.weight is model.embed.weight}, directory / "final.pt"
        )
        if per_rank:  # each rank its own file: acc.save writes on rank 0 only
            generators = {
                "torch": torch.get_rng_state(),
                "python": torch.tensor(random.getstate()[1]),
                "numpy": torch.from_numpy(numpy.random.get_state()[1].astype("int64")),
            }
            torch.save({"model": full, "rng": generators}, directory / f"final-rank{rank}.pt")
    accel.distributed.destroy_process_group()
    return 0


def _full(parameter: torch.Tensor) -> torch.Tensor:
    full = getattr(parameter, "full_tensor", None)  # a DTensor shard: gather it (collective)
    return (full() if callable(full) else parameter).detach()


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
