"""A torchrun worker: trains a tied model data-parallel and reports what it saw.

Usage: torchrun --nproc-per-node 2 train_tied.py ACCELERATOR REPORT_DIR [STEPS]

Also started by srun and mpirun (tests/distributed/test_real_launchers.py).
$TRAIN_TIED_HOLD_S seconds of sleep after the group starts keep its rendezvous port
held, so that concurrent launches overlap.

Every rank writes REPORT_DIR/rank<RANK>.json; the test reads them. Each rank
starts from different weights and trains on different data, so equal parameters
at the end prove that DDP both broadcast rank 0's start and averaged gradients.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import accel.distributed
from helpers.models import TiedLM


def main() -> None:
    accelerator, report_dir = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    context = accel.distributed.init_process_group(accelerator, timeout=60)
    again = accel.distributed.init_process_group(accelerator)
    started_at = time.time()
    launch = accel.distributed.read_launch_environment()
    time.sleep(float(os.environ.get("TRAIN_TIED_HOLD_S", "0")))
    torch.manual_seed(100 + context.rank)  # different start per rank, on purpose
    model = TiedLM()
    unique_before = len({id(p) for p in model.parameters()})
    model = context.accelerator.model_to_device(model)
    initial = [p.detach().cpu().clone() for p in model.parameters()]
    ddp = accel.distributed.wrap_data_parallel(model, context)
    after_broadcast = [p.detach().cpu().clone() for p in model.parameters()]
    # Control: the same start and data without DDP must end up different per rank,
    # or equal parameters below would prove nothing.
    plain = context.accelerator.model_to_device(TiedLM())
    plain.load_state_dict(model.state_dict())
    train(ddp, context, steps)
    train(plain, context, steps)
    gathered_cpu = gather_parameters(model, context)
    plain_gathered = gather_parameters(plain, context)
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    final = [p.detach().cpu() for p in model.parameters()]
    report = {
        "rank": context.rank,
        "world_size": context.world_size,
        "local_rank": context.local_rank,
        "backend": context.backend,
        "device": str(context.device),
        "launched": context.launched,
        "launcher": context.launcher,
        "idempotent": again is context,
        "tied": ddp.module is model and model.head.weight is model.embed.weight,
        "unique_before": unique_before,
        "unique_after": len({id(p) for p in model.parameters()}),
        "ddp_unique": len({id(p) for p in ddp.parameters()}),
        "gathered": len(gathered_cpu),
        "ranks_equal": all(torch.equal(gathered_cpu[0], t) for t in gathered_cpu),
        "own_slot_is_mine": torch.equal(gathered_cpu[context.rank], flat),
        "plain_ranks_equal": all(torch.equal(plain_gathered[0], t) for t in plain_gathered),
        "start_differed": changed(initial, after_broadcast) if context.rank != 0 else None,
        "trained": changed(after_broadcast, final),
        "checksum": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "master_port": None if launch is None else launch.master_port,
        "port_source": None if launch is None else launch.master_port_source,
        "local_world_size": None if launch is None else launch.local_world_size,
        "launch_env": {name: os.environ.get(name) for name in LAUNCH_ENV},
        "started_at": started_at,
        "finished_at": time.time(),
    }
    destroyed = accel.distributed.destroy_process_group()
    report["destroyed"] = destroyed and not torch.distributed.is_initialized()
    report_dir.mkdir(parents=True, exist_ok=True)  # a fresh machine has no such folder
    (report_dir / f"rank{context.rank}.json").write_text(json.dumps(report))


#: What the real-launcher tests check the derived ports and the detection against.
LAUNCH_ENV = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "OMPI_MCA_ess_base_jobid")


def train(
    model: torch.nn.Module, context: accel.distributed.DistributedContext, steps: int
) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(7 + context.rank)  # different data per rank
    for _ in range(steps):
        tokens = torch.randint(0, 16, (4, 5), generator=generator)
        tokens = context.accelerator.batch_to_device(tokens)
        loss = model(tokens).float().logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if context.backend == "xla":
            import torch_xla

            torch_xla.sync()


def changed(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def gather_parameters(
    model: torch.nn.Module, context: accel.distributed.DistributedContext
) -> list[torch.Tensor]:
    """Every rank's parameters, flattened, through all_gather (rank order)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(context.world_size)]
    torch.distributed.all_gather(gathered, flat)
    return [t.cpu() for t in gathered]


if __name__ == "__main__":
    main()
    # torch's gloo teardown aborts at interpreter exit in a few per cent of runs
    # ("terminate called without an active exception", from C++ static destructors,
    # after all Python code has finished); a bare torch DDP script without accel does
    # the same (2 of 30 runs on torch 2.13). The report is written by now, so leave
    # without running those destructors: the test judges the report, not torch's exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
