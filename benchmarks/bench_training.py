"""The training step's per-call cost on the CPU.

* ``acc.optimizer_step(optimizer)`` against a bare ``optimizer.step()``: with an
  optimizer whose step does nothing (so only accel's own work is left) and with SGD
  on a small model (for scale). Goal: at most 1 µs more per call.
* ``acc.device_loader(loader)`` against iterating the DataLoader directly, in
  batches per second. Goal: at least 0.98× the DataLoader's throughput.

Run through ``bash benchmarks/run training``; alone: ``python benchmarks/bench_training.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from _harness import (
    compare_per_call,
    environment_line,
    fmt_ratio,
    fmt_us,
    print_table,
    verdict,
)
from torch.utils.data import DataLoader, TensorDataset

import accel

OVERHEAD_GOAL_S = 1e-6
THROUGHPUT_GOAL = 0.98


class NullOptimizer(torch.optim.Optimizer):
    """An optimizer whose step does nothing: what remains is the caller's overhead."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1, requires_grad=True)], {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


def optimizer_step_rows(acc: accel.Accelerator) -> list[list[str]]:
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 1))
    model(torch.ones(4, 32)).sum().backward()
    cases = {
        "no-op optimizer": NullOptimizer(),
        "SGD, 2 linear layers (1,089 weights)": torch.optim.SGD(model.parameters(), lr=0.0),
    }
    rows = []
    for label, optimizer in cases.items():
        times = compare_per_call(
            {"bare": optimizer.step, "accel": lambda o=optimizer: acc.optimizer_step(o)},
            samples=25,
        )
        extra = times["accel"] - times["bare"]
        rows.append(
            [
                label,
                fmt_us(times["bare"]),
                fmt_us(times["accel"]),
                fmt_us(extra),
                verdict(extra <= OVERHEAD_GOAL_S),
            ]
        )
    return rows


def device_loader_rows(acc: accel.Accelerator) -> list[list[str]]:
    dataset = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    rows = []
    for batch_size in (8, 64):
        loader = DataLoader(dataset, batch_size=batch_size)
        wrapped = acc.device_loader(loader)
        batches = len(loader)

        def bare(loader: DataLoader[Any] = loader) -> None:
            for _ in loader:
                pass

        def with_accel(wrapped: Any = wrapped) -> None:
            for _ in wrapped:
                pass

        times = compare_per_call({"bare": bare, "accel": with_accel}, samples=15)
        ratio = times["bare"] / times["accel"]  # throughput ratio: accel / bare
        rows.append(
            [
                f"DataLoader, batch {batch_size} ({batches} batches)",
                f"{batches / times['bare']:,.0f}/s",
                f"{batches / times['accel']:,.0f}/s",
                fmt_ratio(ratio),
                verdict(ratio >= THROUGHPUT_GOAL),
            ]
        )
    return rows


def main() -> None:
    print(environment_line(torch=torch.__version__))
    acc = accel.get_accelerator("cpu")
    print_table(
        "acc.optimizer_step against optimizer.step() (CPU)",
        ["optimizer", "optimizer.step()", "acc.optimizer_step", "accel adds", "goal ≤1 µs"],
        optimizer_step_rows(acc),
        notes=["best per-call time of 25 round-robin samples"],
    )
    print_table(
        "acc.device_loader against the DataLoader itself (CPU)",
        ["loader", "DataLoader", "acc.device_loader", "throughput ratio", "goal ≥0.98×"],
        device_loader_rows(acc),
        notes=["batches per second over one epoch, best of 15 round-robin samples"],
    )


if __name__ == "__main__":
    main()
