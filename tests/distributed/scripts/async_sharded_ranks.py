"""A torchrun worker for accel.distributed.save_sharded(..., asynchronous=True) over two
gloo ranks.

Usage: torchrun --nproc-per-node 2 async_sharded_ranks.py MODE DIR

MODE ``ddp`` or ``fsdp``: resumable_ranks.py's run (same model, data and schedule),
checkpointing every 3 steps with an asynchronous save_sharded, the newest two kept;
``KILL_IN_WRITE_OF_STEP=n`` makes every rank SIGKILL itself in the background write
of step ``n``'s checkpoint, once its shards are written and before DCP's
``.metadata`` and the rename. MODE ``snapshot``: FSDP2; every rank's write is held
until that rank has changed its parameters and AdamW moments in place after the
save returned; loaded back, the checkpoint must hold the values from before.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from resumable_ranks import VOCAB, TiedDropoutLM, _full
from torch import nn
from torch.distributed.checkpoint import filesystem

import accel.distributed
from accel.training.retention import checkpoint_path, latest_checkpoint, prune_checkpoints


def wrap_shard_writes(before: Any = None, after: Any = None) -> None:
    real = filesystem._FileSystemWriter.write_data

    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        if before is not None:
            before(Path(self.path))
        result = real(self, plan, planner)
        if after is not None:
            after(Path(self.path))
        return result

    filesystem._FileSystemWriter.write_data = write_data  # type: ignore[method-assign]


def train(mode: str, directory: Path, context: Any) -> None:
    acc, rank = context.accelerator, context.rank
    if "KILL_IN_WRITE_OF_STEP" in os.environ:
        doomed = "." + checkpoint_path(directory, int(os.environ["KILL_IN_WRITE_OF_STEP"])).name

        def die(written: Path) -> None:
            if written.name.startswith(doomed + "."):
                os.kill(os.getpid(), signal.SIGKILL)

        wrap_shard_writes(after=die)
    acc.manual_seed(0)
    model = acc.model_to_device(TiedDropoutLM())
    if mode == "ddp":
        trained: nn.Module = accel.distributed.wrap_data_parallel(model, context)
    else:
        trained = accel.distributed.fully_shard_tied(model, [model.embed, model.head])
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    step = 0
    newest = latest_checkpoint(directory)
    if newest is not None:
        placeholders = {**state, "step": 0, "rng": acc.rng_state()}
        remainder = accel.distributed.load_sharded(newest, placeholders)
        step = remainder["step"]
        acc.set_rng_state(remainder["rng"])
        print(f"rank {rank} resumed from {newest.name} at step {step}", flush=True)
    data = torch.Generator().manual_seed(7)
    for _ in range(step):
        torch.randint(0, VOCAB, (4, 6), generator=data)
    while step < 9:
        tokens = torch.randint(0, VOCAB, (4, 6), generator=data)
        mine = tokens[rank * 2 : (rank + 1) * 2]
        logits = trained(mine[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1))
        loss.backward()
        acc.optimizer_step(optimizer)
        optimizer.zero_grad()
        scheduler.step()
        step += 1
        if step % 3 == 0:
            snapshot = {**state, "step": step, "rng": acc.rng_state()}
            accel.distributed.save_sharded(
                snapshot, checkpoint_path(directory, step), asynchronous=True
            )
            if rank == 0:
                prune_checkpoints(directory, keep=2)
    acc.wait_for_saves()
    full = {name: _full(p) for name, p in model.named_parameters(remove_duplicate=False)}
    acc.save(
        {"model": full, "tied": model.head.weight is model.embed.weight}, directory / "final.pt"
    )


def snapshot(directory: Path, context: Any) -> None:
    acc, rank = context.accelerator, context.rank
    release = directory / f"release-{rank}"

    def held(_: Path) -> None:
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    acc.manual_seed(0)
    model = acc.model_to_device(TiedDropoutLM())
    trained = accel.distributed.fully_shard_tied(model, [model.embed, model.head])
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    trained(torch.randint(0, VOCAB, (2, 5))).sum().backward()
    optimizer.step()
    parameters = dict(model.named_parameters())
    expected = {name: _full(p).clone() for name, p in parameters.items()}
    moments = {name: _full(optimizer.state[p]["exp_avg"]).clone() for name, p in parameters.items()}
    wrap_shard_writes(before=held)
    path = checkpoint_path(directory, 1)
    pending = accel.distributed.save_sharded(
        {"model": model, "optimizer": optimizer, "step": 1}, path, asynchronous=True
    )
    report: dict[str, Any] = {"pending_hidden": latest_checkpoint(directory) is None}
    with torch.no_grad():
        for p in parameters.values():
            p.add_(1.0)
            optimizer.state[p]["exp_avg"].add_(1.0)
    release.touch()
    pending.wait()
    report["complete"] = latest_checkpoint(directory) == path
    accel.distributed.load_sharded(path, {"model": model, "optimizer": optimizer, "step": 0})
    report["parameters_old"] = all(
        torch.equal(_full(p), expected[name]) for name, p in parameters.items()
    )
    report["moments_old"] = all(
        torch.equal(_full(optimizer.state[p]["exp_avg"]), moments[name])
        for name, p in parameters.items()
    )
    (directory / f"rank{rank}.json").write_text(json.dumps(report))


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    context = accel.distributed.init_process_group("cpu", timeout=60)
    if mode == "snapshot":
        snapshot(directory, context)
    else:
        train(mode, directory, context)
    accel.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
