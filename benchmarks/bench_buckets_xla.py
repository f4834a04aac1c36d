"""Variable sequence lengths on XLA:CPU: length buckets against padding each batch to
its longest sequence.

One epoch of 200 batches with random lengths 8-256 trains a small token model with
``acc.device_loader`` + ``acc.optimizer_step``. Padded to the longest sequence, almost
every batch has a new shape and XLA compiles a graph for it; padded to the smallest of
``power_of_two_buckets(256)`` (16, 32, 64, 128, 256) that holds it, XLA compiles one
graph per bucket. Each side runs in a fresh process (its own graph cache); the
compilations come from ``torch_xla.debug.metrics``, the wall time is the whole epoch,
compilations included. Goal: at most 6 graphs with buckets.

Runs in the XLA test environment with ``PJRT_DEVICE=CPU``, through ``bash
benchmarks/run buckets-xla``; alone: ``PYTHONPATH=tests PJRT_DEVICE=CPU python
benchmarks/bench_buckets_xla.py`` (``BENCH_BUCKETS_BATCHES=50`` for a shorter epoch).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ratio, print_table, verdict

BATCHES = int(os.environ.get("BENCH_BUCKETS_BATCHES", "200"))
SHORTEST, LONGEST = 8, 256
GOAL_GRAPHS = 6
SIDES = ("buckets", "longest")


def child(side: str) -> dict[str, float]:
    """One epoch of ``side`` in this (fresh) process."""
    import torch_xla.debug.metrics as metrics

    import accel
    from accel.training.buckets import power_of_two_buckets
    from helpers.bucket_training import token_batch, train

    tpu = accel.get_accelerator("tpu")
    draw = random.Random(0)
    lengths = [draw.randint(SHORTEST, LONGEST) for _ in range(BATCHES)]
    # Each batch as a collate function padding to its longest sequence makes it.
    batches = [token_batch(length, seed=i) for i, length in enumerate(lengths)]
    sizes = power_of_two_buckets(LONGEST, smallest=16) if side == "buckets" else None
    started = time.perf_counter()
    losses = train(tpu, batches, sizes)  # ends with the losses fetched: the device is done
    elapsed = time.perf_counter() - started
    compiled = metrics.metric_data("CompileTime")
    return {
        "epoch_s": elapsed,
        "compiled": float(compiled[0]) if compiled else 0.0,
        "shapes": float(len(set(lengths))),
        "last_loss": losses[-1],
    }


def run_child(side: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", side],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    results = {side: run_child(side) for side in SIDES}
    buckets, longest = results["buckets"], results["longest"]
    rows = [
        [
            "graphs compiled",
            f"{buckets['compiled']:.0f}",
            f"{longest['compiled']:.0f}",
            fmt_ratio(buckets["compiled"] / longest["compiled"]),
            verdict(buckets["compiled"] <= GOAL_GRAPHS) + f" (≤ {GOAL_GRAPHS})",
        ],
        [
            "epoch wall time",
            f"{buckets['epoch_s']:.1f} s",
            f"{longest['epoch_s']:.1f} s",
            fmt_ratio(buckets["epoch_s"] / longest["epoch_s"]),
            "(reported)",
        ],
    ]
    print_table(
        f"{BATCHES} batches of 4 sequences, random lengths {SHORTEST}-{LONGEST}",
        ["", "buckets (16-256)", "padded to the longest", "buckets ÷ longest", "goal"],
        rows,
        [
            f"{longest['shapes']:.0f} distinct lengths in the epoch; buckets: "
            "power_of_two_buckets(256, smallest=16), pad values from the loss's ignore index",
            "wall time: the whole epoch in a fresh process, compilations included",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        main()
