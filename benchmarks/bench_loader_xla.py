"""``acc.device_loader`` on XLA:CPU: its cost per batch against torch_xla's
``MpDeviceLoader``, and the graph executions of an accumulation loop.

Per batch: epochs of batches of two int64 tensors (token ids and targets, 8×64, as a
dict and as a tuple), iterated with nothing else in the loop, so the figure is the
loader's own cost (the copy to the device, the threads' hand-offs, the step mark, the
batch rebuilt). The two loaders take turns, an epoch each, round after round (the
order flipping every round), so a slow spell on this shared machine hits both alike;
the ratio is the median of the rounds' ratios.

Accumulation: a small tied language model, 6 optimizer steps of 3 micro-batches, in a
fresh process per loop: through ``acc.device_loader``, through ``batch_to_device``
with one step mark per optimizer step (``acc.optimizer_step`` marks it), and through
``MpDeviceLoader`` (a mark per batch). Graphs compiled and executions run come from
``torch_xla.debug.metrics``.

Runs in the XLA test environment with ``PJRT_DEVICE=CPU``, through ``bash
benchmarks/run loader-xla``; alone: ``PJRT_DEVICE=CPU python
benchmarks/bench_loader_xla.py``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ratio, fmt_us, print_table, verdict

BATCHES = int(os.environ.get("BENCH_LOADER_BATCHES", "300"))  # per epoch
ROUNDS = int(os.environ.get("BENCH_LOADER_ROUNDS", "31"))
GOAL_RATIO = 1.02
STEPS, MICRO = 6, 3
LOOPS = ("device_loader", "batch_to_device", "MpDeviceLoader")


def per_batch_rows() -> list[list[str]]:
    import torch
    import torch_xla.distributed.parallel_loader as pl

    import accel

    acc = accel.get_accelerator("tpu")
    rows = []
    for kind in ("dict", "tuple"):
        generator = torch.Generator().manual_seed(0)
        pairs = [
            tuple(torch.randint(0, 50257, (8, 64), generator=generator) for _ in range(2))
            for _ in range(BATCHES)
        ]
        batches: list[object] = [
            {"inputs": a, "targets": b} if kind == "dict" else (a, b) for a, b in pairs
        ]
        loaders = {
            "accel": acc.device_loader(batches),
            "torch_xla": pl.MpDeviceLoader(batches, acc.device),
        }

        def epoch(loader: object) -> tuple[float, float]:
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in loader:  # type: ignore[attr-defined]
                pass
            return (time.perf_counter() - wall) / BATCHES, (time.process_time() - cpu) / BATCHES

        for loader in loaders.values():  # warm-up: threads, transfers, the first marks
            epoch(loader)
        wall: dict[str, list[float]] = {name: [] for name in loaders}
        cpu: dict[str, list[float]] = {name: [] for name in loaders}
        for round_ in range(ROUNDS):
            order = list(loaders) if round_ % 2 == 0 else list(loaders)[::-1]
            for name in order:
                seconds, cpu_seconds = epoch(loaders[name])
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
        ratios = sorted(a / b for a, b in zip(wall["accel"], wall["torch_xla"], strict=True))
        ratio = statistics.median(ratios)
        cpu_ratio = statistics.median(
            a / b for a, b in zip(cpu["accel"], cpu["torch_xla"], strict=True)
        )
        rows.append(
            [
                f"{kind} of two int64 8×64 tensors",
                fmt_us(statistics.median(wall["accel"])),
                fmt_us(statistics.median(wall["torch_xla"])),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
                f"{fmt_ratio(ratios[len(ratios) // 4])}-{fmt_ratio(ratios[-1 - len(ratios) // 4])}",
                fmt_ratio(cpu_ratio),
            ]
        )
    return rows


def accumulation_child(loop: str) -> dict[str, float]:
    """6 optimizer steps of 3 micro-batches through ``loop``, in this (fresh) process."""
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics
    import torch_xla.distributed.parallel_loader as pl

    import accel
    from helpers.models import TiedLM

    acc = accel.get_accelerator("tpu")
    torch.manual_seed(0)
    model = acc.model_to_device(TiedLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = [torch.randint(0, 16, (4, 9)) for _ in range(STEPS * MICRO)]
    acc.mark_step()
    xm.wait_device_ops()  # torch_xla counts an execution when it ends
    compiled = (metrics.metric_data("CompileTime") or [0])[0]
    executed = (metrics.metric_data("ExecuteTime") or [0])[0]
    if loop == "device_loader":
        batches: object = acc.device_loader(data)
    elif loop == "MpDeviceLoader":
        batches = pl.MpDeviceLoader(data, acc.device)
    else:
        batches = (acc.batch_to_device(tokens) for tokens in data)
    losses = []
    for index, tokens in enumerate(batches):  # type: ignore[call-overload]
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        (loss / MICRO).backward()
        losses.append(loss.detach())
        if index % MICRO == MICRO - 1:
            acc.optimizer_step(optimizer)  # outside a device_loader: marks at once
            optimizer.zero_grad()
    acc.mark_step()
    xm.wait_device_ops()
    return {
        "graphs": (metrics.metric_data("CompileTime") or [0])[0] - compiled,
        "executions": (metrics.metric_data("ExecuteTime") or [0])[0] - executed,
        "last_loss": float(losses[-1]),
    }


def accumulation_rows() -> list[list[str]]:
    results = {}
    for loop in LOOPS:
        done = subprocess.run(
            [sys.executable, __file__, "--child", loop],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{loop} failed:\n{done.stderr[-3000:]}")
        results[loop] = json.loads(done.stdout.strip().splitlines()[-1])
    reference = results["batch_to_device"]
    return [
        [
            loop,
            str(int(result["graphs"])),
            str(int(result["executions"])),
            f"{result['last_loss']:.6f}",
            verdict(
                result["graphs"] <= reference["graphs"]
                and result["executions"] <= reference["executions"]
            )
            if loop == "device_loader"
            else "",
        ]
        for loop, result in results.items()
    ]


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    print_table(
        f"acc.device_loader against MpDeviceLoader, per batch ({BATCHES} batches an epoch)",
        [
            "batch",
            "accel",
            "MpDeviceLoader",
            "ratio",
            f"goal ≤{GOAL_RATIO}×",
            "middle half of the rounds' ratios",
            "CPU-time ratio",
        ],
        per_batch_rows(),
        notes=[
            f"median of {ROUNDS} interleaved rounds (an epoch of each loader a round, the "
            "order flipping); ratio: median of the rounds' ratios",
            "CPU-time ratio: the same for the process's CPU time (every thread), which "
            "other load on the machine disturbs less than wall time",
        ],
    )
    print_table(
        f"An accumulation loop on XLA:CPU ({STEPS} optimizer steps of {MICRO} micro-batches)",
        ["loop", "graphs", "executions", "last loss", "goal ≤ batch_to_device"],
        accumulation_rows(),
        notes=[
            "batch_to_device: one step mark per optimizer step (acc.optimizer_step outside "
            "a device_loader loop); MpDeviceLoader marks a step at every batch",
            "a small tied language model (tests/helpers/models.py), AdamW; each loop in a "
            "fresh process",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(accumulation_child(sys.argv[2])))
    else:
        main()
