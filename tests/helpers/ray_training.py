"""Ray Train's side of the Ray tests: a local cluster, and the train function its
workers run (the loop docs/integrations.md shows), each rank writing what it saw.

Ray's workers import this module by name (``helpers.ray_training``), so the cluster
puts the repository and tests/ on their ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import CheckpointConsistencyMode, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader

from accel.integrations.ray import prepare_data_loader, prepare_model, worker_accelerator
from helpers.integration_plugins import InstalledVendorPlugin
from helpers.models import TiedLM
from helpers.tied_training import (
    BATCH,
    LR,
    STEPS,
    VOCAB,
    data_parallel_reference,
    dataset,
    loss_of,
    reference,
)

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
#: examples/ray_train.py, the loop docs/integrations.md shows, imports as ``ray_train``.
EXAMPLES = REPO / "examples"
#: Logical CPUs of the test cluster: one per worker (the controller takes none).
CLUSTER_CPUS = 2
#: Wall-clock bound of one trainer run: Ray's start-up is most of it (20 s on 2 idle
#: cores, 100 s on busy ones).
FIT_TIMEOUT_S = 400
#: Settings that make Ray start less and watch less on a 2-core machine.
QUIET_RAY = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DEDUP_LOGS": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}


def vendor_distribution(root: Path) -> Path:
    """An installed distribution (its ``.dist-info`` only) whose ``accel`` entry points
    are the test vendor plugins: how Ray's workers, which the tests do not start, find
    them. It holds no Ray code."""
    info = root / "accel_ray_test_vendor-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: accel-ray-test-vendor\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        "[accel]\n"
        "vendornpu = helpers.integration_plugins:InstalledVendorPlugin\n"
        "vendorccl = helpers.integration_plugins:OwnBackendVendorPlugin\n",
        encoding="utf-8",
    )
    return root


@contextmanager
def local_cluster(extra_paths: tuple[Path, ...] = (), **env: str) -> Iterator[None]:
    """A local Ray cluster of :data:`CLUSTER_CPUS` CPUs, no dashboard; its workers see
    this repository's accel, tests/, examples/ and ``extra_paths``, with ``env`` set."""
    for name, value in QUIET_RAY.items():
        os.environ.setdefault(name, value)  # read by the processes ray.init starts
    path = os.pathsep.join(str(p) for p in (REPO, TESTS, EXAMPLES, *extra_paths))
    ray.init(
        num_cpus=CLUSTER_CPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path, **QUIET_RAY, **env}},
    )
    try:
        yield
    finally:
        ray.shutdown()


def fit(
    train_func: Any,
    config: Mapping[str, Any],
    storage: Path,
    *,
    workers: int = 2,
    torch_config: ray.train.torch.TorchConfig | None = None,
    max_failures: int = 0,
) -> ray.train.Result:
    """``TorchTrainer(...).fit()``, failing the test if it has not returned (or raised)
    within :data:`FIT_TIMEOUT_S`."""
    trainer = TorchTrainer(
        train_func,
        train_loop_config=dict(config),
        torch_config=torch_config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(
            storage_path=str(storage),
            name="run",
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(FIT_TIMEOUT_S)
    assert not thread.is_alive(), f"trainer.fit() still running after {FIT_TIMEOUT_S} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def read_reports(report_dir: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((report_dir / f"rank{r}.json").read_text()) for r in range(ranks)]


# -- in Ray's workers ----------------------------------------------------------------


def initial_model(rank: int) -> TiedLM:
    torch.manual_seed(100 + rank)  # a different start per rank: equal ends need DDP
    return TiedLM(VOCAB)


def train_tied(config: dict[str, Any]) -> None:
    """The loop of docs/integrations.md, on ``config["accelerator"]``: a tied model,
    SGD, a checkpoint reported after every step and resumed from when there is one.
    With ``config["kill_after"]`` set, rank 1 SIGKILLs itself once, after the
    checkpoint of that step is committed."""
    name = config["accelerator"]
    report_dir = Path(config["report_dir"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    _append(report_dir / f"pids{rank}.txt", str(os.getpid()))

    net = initial_model(rank)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    model, optimizer = prepare_model(net, optimizer, accelerator=name)
    acc = worker_accelerator(name)
    loader = prepare_data_loader(
        DataLoader(dataset(STEPS * BATCH * world_size), batch_size=BATCH), accelerator=name
    )

    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = {"model": net, "optimizer": optimizer}
            start = acc.load(Path(directory) / "state.pt", state)["step"] + 1

    for step, (tokens, targets) in enumerate(loader):
        if step < start:
            continue  # done before the checkpoint
        loss = loss_of(model, tokens, targets)
        optimizer.zero_grad()
        loss.backward()
        acc.optimizer_step(optimizer)
        with tempfile.TemporaryDirectory() as directory:
            acc.save(
                {"model": net, "optimizer": optimizer, "step": step}, Path(directory) / "state.pt"
            )
            ray.train.report(
                {"step": step, "loss": loss.item()},
                # acc.save wrote on rank 0 only: the others have nothing to hand over.
                checkpoint=ray.train.Checkpoint.from_directory(directory) if rank == 0 else None,
            )
        _kill_once(config, report_dir, rank, step)

    expected = data_parallel_reference(initial_model(0), world_size, shuffle=False)
    trained = {key: value.detach().cpu() for key, value in net.state_dict().items()}
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    vendor = InstalledVendorPlugin.INSTANCES[0] if InstalledVendorPlugin.INSTANCES else None
    _write(
        report_dir / f"rank{rank}.json",
        {
            "rank": rank,
            "world_size": world_size,
            "local_rank": context.get_local_rank(),
            "backend": str(dist.get_backend()),
            "accelerator": acc.name,
            "device": str(acc.device),
            "wrapper": type(model).__name__,
            "tied": net.head.weight is net.embed.weight,
            "unique_parameters": len({id(p) for p in net.parameters()}),
            "head_optimized": id(net.head.weight) in optimized,
            "resumed_from": start,
            "parameters": torch.cat([v.reshape(-1) for v in trained.values()]).tolist(),
            "reference_max_difference": max(
                (trained[key] - value).abs().max().item()
                for key, value in expected.state_dict().items()
            ),
            "vendor_calls": sorted(set(vendor.calls)) if vendor else None,
        },
    )


def _kill_once(config: Mapping[str, Any], report_dir: Path, rank: int, step: int) -> None:
    if config.get("kill_after") != step or rank != 1:
        return
    marker = report_dir / "killed"
    if marker.exists():
        return  # the restarted worker goes on
    # Wait until the controller has committed this step's checkpoint, so that the
    # restart has it to resume from; then die as a lost machine would.
    ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)
    marker.write_text(str(step))
    os.kill(os.getpid(), signal.SIGKILL)


def train_tied_xla(config: dict[str, Any]) -> None:
    """One worker on ``tpu`` (XLA:CPU here): the loop through accel, and beside it a
    bare ``ray.train.torch.prepare_model`` moving a second copy to the same device."""
    report_dir = Path(config["report_dir"])
    net = initial_model(0)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    model, optimizer = prepare_model(net, optimizer, accelerator="tpu")
    acc = worker_accelerator("tpu")
    loader = prepare_data_loader(DataLoader(dataset(), batch_size=BATCH), accelerator="tpu")
    for tokens, targets in loader:
        loss = loss_of(model, tokens, targets)
        optimizer.zero_grad()
        loss.backward()
        acc.optimizer_step(optimizer)
    trained = acc.state_dict(net)
    expected = reference(initial_model(0)).state_dict()
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}

    bare = ray.train.torch.prepare_model(initial_model(0), move_to_device=acc.device)
    _write(
        report_dir / "rank0.json",
        {
            "world_size": ray.train.get_context().get_world_size(),
            "device": str(net.head.weight.device),
            "wrapper": type(model).__name__,
            "tied": net.head.weight is net.embed.weight,
            "head_optimized": id(net.head.weight) in optimized,
            "reference_max_difference": max(
                (trained[key] - value).abs().max().item() for key, value in expected.items()
            ),
            "bare_device": str(bare.head.weight.device),
            "bare_tied": bare.head.weight is bare.embed.weight,
        },
    )


def prepare_only(config: dict[str, Any]) -> None:
    """Bad input: prepare a model on ``config["accelerator"]`` and nothing more."""
    prepare_model(TiedLM(VOCAB), accelerator=config["accelerator"])


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as file:
        file.write(line + "\n")


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report), encoding="utf-8")
