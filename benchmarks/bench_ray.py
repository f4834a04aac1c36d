"""A Ray Train step on the CPU: accel's preparation against Ray's own.

One ``TorchTrainer`` run, two CPU workers over gloo, on a local Ray cluster. In each
worker the same tied model is prepared twice: with ``accel.integrations.ray``
(``prepare_model``, ``prepare_data_loader``, each step ``acc.optimizer_step``) and with
``ray.train.torch.prepare_model`` and ``prepare_data_loader`` (each step
``optimizer.step()``): two DDP models in Ray's one group. Samples of a fixed number of
steps alternate between the two, in alternating order, so that both workers run the
same collectives in the same order and a slow spell hits both alike; the best sample
of each is its per-step time. Goal: accel ≤ 1.02× Ray's.

Run through ``bash benchmarks/run ray`` (about a minute); alone, from the repository
root: ``PYTHONPATH=tests python benchmarks/bench_ray.py`` in the Ray test environment.
"""

from __future__ import annotations

import json
import tempfile
import time
from itertools import cycle
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from accel.integrations.ray import (
    prepare_data_loader,
    prepare_model,
    torch_config,
    worker_accelerator,
)
from helpers.models import TiedLM
from helpers.ray_training import local_cluster

GOAL = 1.02
VOCAB, WIDTH, BATCH, TOKENS = 2048, 128, 16, 32
STEPS_PER_SAMPLE, SAMPLES, WARMUP = 10, 15, 5


def _data() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH * 16, TOKENS), generator=generator)
    return DataLoader(TensorDataset(tokens, tokens.roll(1, dims=1)), batch_size=BATCH)


def _step_function(model: torch.nn.Module, batches: Any, step: Any) -> Any:
    iterator = cycle(batches)

    def run() -> None:
        tokens, targets = next(iterator)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        step()

    return run


def train_func(config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    net = TiedLM(VOCAB, WIDTH)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    model, optimizer = prepare_model(net, optimizer, accelerator="cpu")
    acc = worker_accelerator("cpu")
    accel_batches = list(prepare_data_loader(_data(), accelerator="cpu"))

    def accel_step() -> None:
        acc.optimizer_step(optimizer)
        optimizer.zero_grad()

    torch.manual_seed(0)
    ray_net = TiedLM(VOCAB, WIDTH)
    ray_optimizer = torch.optim.SGD(ray_net.parameters(), lr=0.01)
    ray_model = ray.train.torch.prepare_model(ray_net)
    ray_batches = list(ray.train.torch.prepare_data_loader(_data()))

    def ray_step() -> None:
        ray_optimizer.step()
        ray_optimizer.zero_grad()

    candidates = {
        "accel": _step_function(model, accel_batches, accel_step),
        "ray": _step_function(ray_model, ray_batches, ray_step),
    }
    for run in candidates.values():
        for _ in range(WARMUP):
            run()
    best = dict.fromkeys(candidates, float("inf"))
    names = list(candidates)
    for sample in range(SAMPLES):
        for name in names if sample % 2 == 0 else reversed(names):
            start = time.perf_counter()
            for _ in range(STEPS_PER_SAMPLE):
                candidates[name]()
            best[name] = min(best[name], (time.perf_counter() - start) / STEPS_PER_SAMPLE)
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps(best))


def main() -> None:
    with tempfile.TemporaryDirectory() as directory, local_cluster():
        out = Path(directory) / "times.json"
        TorchTrainer(
            train_func,
            train_loop_config={"out": str(out)},
            torch_config=torch_config("cpu"),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(Path(directory) / "storage"), name="bench"),
        ).fit()
        times = json.loads(out.read_text())
    ratio = times["accel"] / times["ray"]
    print_table(
        "Per-step time, 2 CPU workers over gloo (rank 0, best of 15 samples of 10 steps)",
        ["preparation", "per step", "ratio to Ray's", f"goal ≤{GOAL:.2f}×"],
        [
            ["ray.train.torch.prepare_model + prepare_data_loader", fmt_ms(times["ray"]), "", ""],
            [
                "accel.integrations.ray.prepare_model + prepare_data_loader",
                fmt_ms(times["accel"]),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL),
            ],
        ],
        notes=[
            f"tied model: vocabulary {VOCAB}, width {WIDTH}; batch {BATCH}×{TOKENS} tokens, SGD",
            environment_line(torch=torch.__version__, ray=ray.__version__),
        ],
    )


if __name__ == "__main__":
    main()
