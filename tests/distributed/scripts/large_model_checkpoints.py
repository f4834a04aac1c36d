"""A torchrun worker: sharded checkpoints of the recipe's tied LM, saved on a 2x2 mesh
and loaded on others.

Usage:
  torchrun --nproc-per-node 4 large_model_checkpoints.py save DIR
  torchrun --nproc-per-node N large_model_checkpoints.py load SAVED DIR DPxTP[,DPxTP...]

``save`` (2x2): built on ``meta``, STEPS steps, ``save_sharded`` to ``DIR/2x2/step-3``,
STEPS more: the uninterrupted run, reported (the saved state, the losses, the end) to
``DIR/2x2.pt``. Then ``KILL_RANK=r`` makes rank ``r`` SIGKILL itself inside the save of
step 6, once its own shards are written and before DCP's ``.metadata`` and the rename,
after writing ``DIR/killed.json``; the other ranks are left to fail.

``load``, on each mesh in turn (in one process group), reported to ``DIR/<mesh>.pt``:

- ``from_2x2``: a fresh model built on ``meta`` takes the newest complete checkpoint of
  ``SAVED/2x2`` (what ``save`` left in its DIR): ``materialize()``, then
  ``load_sharded`` (model, AdamW and step); then it trains the last STEPS steps;
- ``own``, on a mesh other than 2x2: that mesh's own uninterrupted run, saving at
  step 3, and a fresh model resumed from that checkpoint the same way, trained the same
  last STEPS steps.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import filesystem
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel.distributed
from accel.training.checkpoint import checkpoint_path, latest_checkpoint
from helpers.large_models import adamw, batches, build_on_mesh, gathered, is_tied, train

STEPS = 3
SAVED_ON = (2, 2)


def kill_in_shard_writes(rank: int, doomed: Path, report: Path) -> None:
    """SIGKILL this rank right after it wrote its shards of ``doomed``'s save."""
    real = filesystem._FileSystemWriter.write_data

    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        result = real(self, plan, planner)  # returns once this rank's shards are written
        written = Path(self.path)
        if written.name.startswith(f".{doomed.name}."):
            report.write_text(
                json.dumps(
                    {
                        "rank": rank,
                        "temporary": str(written),
                        "own_shards": sorted(p.name for p in written.glob(f"__{rank}_*")),
                    }
                )
            )
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    filesystem._FileSystemWriter.write_data = write_data  # type: ignore[method-assign]


def mesh_of(name: str) -> tuple[int, int]:
    dp, tp = name.split("x")
    return int(dp), int(tp)


def run_and_save(acc: Any, mesh: Any, directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The uninterrupted run of 2 x STEPS steps, saved after STEPS; its report and
    its state at the end."""
    tokens = batches(2 * STEPS)
    model = build_on_mesh(acc, mesh)
    optimizer = adamw(model)
    first, tied_first = train(model, optimizer, tokens[:STEPS], mesh)
    state = {"model": model, "optimizer": optimizer, "step": STEPS}
    accel.distributed.save_sharded(state, checkpoint_path(directory, STEPS))
    report = {"saved": gathered(model, optimizer), "tied_at_save": is_tied(model)}
    last, tied_last = train(model, optimizer, tokens[STEPS:], mesh)
    report["losses"] = torch.cat([first, last])
    report["end"] = gathered(model, optimizer)
    report["tied_every_step"] = tied_first and tied_last
    return report, {"model": model, "optimizer": optimizer, "step": 2 * STEPS}


def resume(acc: Any, mesh: Any, path: Path) -> dict[str, Any]:
    """A fresh model on ``mesh`` from the checkpoint at ``path``, trained to the end."""
    # materialize(), then load_sharded: materialize(load=path) refuses a sharded model
    # (tests/distributed/test_large_models.py, the xfail).
    model = build_on_mesh(acc, mesh)
    optimizer = adamw(model)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    report: dict[str, Any] = {"path": path.name}
    report["step"] = accel.distributed.load_sharded(path, state)["step"]
    report["loaded"] = gathered(model, optimizer)
    report["tied_loaded"] = is_tied(model)
    losses, report["tied_every_step"] = train(model, optimizer, batches(2 * STEPS)[STEPS:], mesh)
    report["losses"], report["end"] = losses, gathered(model, optimizer)
    return report


def main() -> int:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    context = accel.distributed.init_process_group("cpu", timeout=60)
    acc = context.accelerator
    if mode == "save":
        mesh = init_device_mesh("cpu", SAVED_ON, mesh_dim_names=("dp", "tp"))
        report, state = run_and_save(acc, mesh, directory / "2x2")
        acc.save(report, directory / "2x2.pt")  # every rank calls it; the main one writes
        if "KILL_RANK" in os.environ:
            doomed = checkpoint_path(directory / "2x2", 2 * STEPS)
            if context.rank == int(os.environ["KILL_RANK"]):
                kill_in_shard_writes(context.rank, doomed, directory / "killed.json")
            accel.distributed.save_sharded(state, doomed)
    else:
        saved, directory = directory, Path(sys.argv[3])
        for name in sys.argv[4].split(","):
            mesh = init_device_mesh("cpu", mesh_of(name), mesh_dim_names=("dp", "tp"))
            newest = latest_checkpoint(saved / "2x2")
            assert newest is not None, "no complete checkpoint in SAVED/2x2"
            report = {"from_2x2": resume(acc, mesh, newest)}
            if mesh_of(name) != SAVED_ON:
                own = directory / name
                report["own"], _ = run_and_save(acc, mesh, own)
                again = resume(acc, mesh, checkpoint_path(own, STEPS))
                report["own_resumed"] = again
            acc.save(report, directory / f"{name}.pt")
    accel.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # See train_tied.py: torch's gloo teardown can abort at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
