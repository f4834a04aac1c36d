"""Asynchronous saves: how long the loop stalls, and what a training loop that
checkpoints keeps of its throughput.

1. The stall per ``acc.save(state, path, asynchronous=True)`` of GPT-2 small + AdamW
   (built in code), side by side with the snapshot copy alone (the tensors copied into
   fresh CPU memory, what the stall cannot go below) and a synchronous ``acc.save``.
   Goals: stall <= 1.3x the snapshot copy, <= 0.25x the synchronous save.
2. A small GPT-2 (4 layers, 256 wide) training on the CPU, a checkpoint every 10 steps:
   steps per second with asynchronous saves, with synchronous saves, and with none, in
   20-step segments. Goal: asynchronous >= 0.9x of none (the synchronous figure beside
   it). Each segment's time includes waiting for its last save, so nothing is left
   unpaid. Training runs on ``--threads`` torch threads (1 by default: see the table).
3. The GIL: a pure-Python loop's rate in the main thread while GPT-2 small's snapshot
   is written with ``atomic_save`` beside it, against its rate alone, the writer in a
   thread and in a forked process (which cannot hold the loop's GIL). A writer
   holding the GIL would stop the loop; the two figures side by side say how much the
   GIL costs beyond the CPU the write takes.

Candidates are interleaved, the order rotated every round, each sample after an
``os.sync()``; medians are reported with the load average (the machine is shared).
``--small`` runs part 1 on the small model for a quick look.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _harness import fmt_ms, fmt_ratio, print_table, timed, verdict
from bench_models import GPT2_SMALL, GPT2Config, gpt2_style
from torch.nn import functional as F

import accel
from accel.training.checkpoint._atomic import atomic_save
from accel.training.checkpoint._save import device_state_dict, storable
from accel.training.checkpoint._snapshot import take_snapshot

SMALL = GPT2Config(vocab=8192, width=256, layers=4, heads=4)


def _trained_state(config: GPT2Config) -> dict[str, Any]:
    model = gpt2_style(config, device="cpu")
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()  # AdamW's moments exist: the state is model + 2x parameters
    optimizer.zero_grad()
    return {"model": model, "optimizer": optimizer}


def _rotated(names: list[str], round_: int) -> list[str]:
    shift = round_ % len(names)
    return names[shift:] + names[:shift]


def stall(config: GPT2Config, rounds: int, directory: Path) -> None:
    acc = accel.get_accelerator("cpu")
    state = _trained_state(config)
    stored = storable(state, device_state_dict)
    written: list[float] = []
    kept: list[Any] = []

    def snapshot_copy() -> None:
        # As an asynchronous save takes it: into the memory of the previous snapshot.
        _, owned = take_snapshot(stored, kept)
        kept[:] = owned

    def asynchronous() -> Callable[[], None]:
        start = time.perf_counter()
        pending = acc.save(state, directory / "async.pt", asynchronous=True)
        return lambda: (pending.wait(), written.append(time.perf_counter() - start))

    candidates: dict[str, Callable[[], Any]] = {
        "snapshot copy": snapshot_copy,
        "asynchronous acc.save": asynchronous,
        "synchronous acc.save": lambda: acc.save(state, directory / "sync.pt"),
    }
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    loads = []
    for round_ in range(rounds + 1):  # round 0 writes the files and warms up
        for name in _rotated(list(candidates), round_):
            os.sync()
            with timed() as clock:
                result = candidates[name]()
            if callable(result):
                result()  # the asynchronous write's end, outside the stall
            del result
            if round_:
                samples[name].append(clock.seconds)
        loads.append(os.getloadavg()[0])
    size = (directory / "sync.pt").stat().st_size
    median = {name: statistics.median(values) for name, values in samples.items()}
    vs_copy = median["asynchronous acc.save"] / median["snapshot copy"]
    vs_sync = median["asynchronous acc.save"] / median["synchronous acc.save"]
    label = "a small GPT-2" if config == SMALL else "GPT-2 small"
    print_table(
        f"The loop's stall per save, {label} + AdamW ({size / 2**20:,.0f} MiB), CPU, median "
        f"of {rounds} interleaved rounds, load average {min(loads):.1f}-{max(loads):.1f}",
        ["stall", "asynchronous", "against", "ratio", "goal", "verdict"],
        [
            [
                "vs the snapshot copy alone",
                fmt_ms(median["asynchronous acc.save"]),
                fmt_ms(median["snapshot copy"]),
                fmt_ratio(vs_copy) + " time",
                "<= 1.3×",
                verdict(vs_copy <= 1.3),
            ],
            [
                "vs a synchronous acc.save",
                fmt_ms(median["asynchronous acc.save"]),
                fmt_ms(median["synchronous acc.save"]),
                fmt_ratio(vs_sync) + " time",
                "<= 0.25×",
                verdict(vs_sync <= 0.25),
            ],
        ],
        [
            "stall: from the call to its return (the snapshot taken, the write started); "
            "the background write then took "
            f"{fmt_ms(statistics.median(written[1:] or written))} (median, from the call)",
            "each sample starts after os.sync(); samples (s): "
            + "; ".join(
                f"{name} " + " ".join(f"{v:.3f}" for v in values)
                for name, values in samples.items()
            ),
        ],
    )


def throughput(
    rounds: int, directory: Path, threads: int, steps: int = 20, every: int = 10
) -> None:
    acc = accel.get_accelerator("cpu")
    torch.manual_seed(0)
    state = _trained_state(SMALL)
    model, optimizer = state["model"], state["optimizer"]
    tokens = torch.randint(0, SMALL.vocab, (4, 33))
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)

    def segment(mode: str) -> float:
        with timed() as clock:
            for step in range(steps):
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, SMALL.vocab), tokens[:, 1:].reshape(-1))
                loss.backward()
                acc.optimizer_step(optimizer)
                optimizer.zero_grad()
                if mode != "none" and step % every == every // 2:
                    path = directory / f"{mode}-{step}.pt"
                    acc.save({**state, "step": step}, path, asynchronous=mode == "asynchronous")
            acc.wait_for_saves()  # the last write is part of the segment
        return steps / clock.seconds

    samples: dict[str, list[float]] = {"none": [], "asynchronous": [], "synchronous": []}
    loads = []
    for round_ in range(rounds + 1):
        for mode in _rotated(list(samples), round_):
            os.sync()
            rate = segment(mode)
            if round_:
                samples[mode].append(rate)
        loads.append(os.getloadavg()[0])
    torch.set_num_threads(threads_before)
    size = (directory / f"synchronous-{every // 2}.pt").stat().st_size
    median = {mode: statistics.median(values) for mode, values in samples.items()}
    rows = []
    for mode in ("asynchronous", "synchronous"):
        ratio = median[mode] / median["none"]
        rows.append(
            [
                f"{mode} saves",
                f"{median[mode]:.2f} steps/s",
                f"{median['none']:.2f} steps/s",
                fmt_ratio(ratio) + " throughput",
                ">= 0.9×" if mode == "asynchronous" else "(reported)",
                verdict(ratio >= 0.9) if mode == "asynchronous" else "—",
            ]
        )
    print_table(
        f"Training a small GPT-2 on the CPU ({size / 2**20:,.0f} MiB checkpoint every {every} "
        f"steps), {steps}-step segments, median of {rounds} interleaved rounds, load average "
        f"{min(loads):.1f}-{max(loads):.1f}",
        ["loop", "steps/s", "no checkpoints", "ratio", "goal", "verdict"],
        rows,
        [
            "each segment ends with acc.wait_for_saves(): its last write is paid for; "
            "the batch is 4 sequences of 32 tokens",
            f"torch intra-op threads: {threads} (--threads; on a machine whose cores "
            "other jobs share, torch's OpenMP threads wait on each other whenever one is "
            "descheduled: 2 threads ran 10x slower than 1 here); samples (steps/s): "
            + "; ".join(
                f"{mode} " + " ".join(f"{v:.2f}" for v in values)
                for mode, values in samples.items()
            ),
        ],
    )


def gil(directory: Path, rounds: int) -> None:
    state = _trained_state(GPT2_SMALL)
    snapshot, _ = take_snapshot(storable(state, device_state_dict))

    def count_while(running: Callable[[], bool], at_least: float = 0.0) -> float:
        counted, start = 0, time.perf_counter()
        while True:
            for _ in range(1000):
                counted += 1
            elapsed = time.perf_counter() - start
            if elapsed > at_least and not running():
                return counted / elapsed

    def in_a_thread() -> tuple[float, float]:
        writer = threading.Thread(target=atomic_save, args=(snapshot, directory / "gil.pt"))
        start = time.perf_counter()
        writer.start()
        rate = count_while(writer.is_alive)
        return rate, time.perf_counter() - start

    def in_a_process() -> tuple[float, float]:
        start = time.perf_counter()
        child = os.fork()  # the snapshot is the child's too (copy on write): no pickling
        if child == 0:
            try:
                atomic_save(snapshot, directory / "gil-process.pt")
            finally:
                os._exit(0)
        finished: list[bool] = []

        def running() -> bool:
            if not finished and os.waitpid(child, os.WNOHANG)[0] == child:
                finished.append(True)
            return not finished

        rate = count_while(running)
        return rate, time.perf_counter() - start

    ratios: dict[str, list[float]] = {"thread": [], "process": []}
    writes: dict[str, list[float]] = {"thread": [], "process": []}
    for round_ in range(rounds):
        for kind in _rotated(["thread", "process"], round_):
            os.sync()
            during, seconds = (in_a_thread if kind == "thread" else in_a_process)()
            alone = count_while(lambda: False, at_least=min(seconds, 3.0))
            ratios[kind].append(during / alone)
            writes[kind].append(seconds)
    print_table(
        f"The GIL during a background write of GPT-2 small + AdamW, median of {rounds} "
        f"interleaved rounds",
        ["the write runs in", "main thread's Python loop: rate during / alone", "write"],
        [
            [
                f"a {kind}",
                fmt_ratio(statistics.median(ratios[kind])),
                f"{statistics.median(writes[kind]):.2f} s",
            ]
            for kind in ("thread", "process")
        ],
        [
            "the loop is pure Python, the worst case for a writer that held the GIL; a "
            "process holds none of the loop's GIL, so what it costs the loop is CPU only "
            f"({os.cpu_count()} cores, shared): the thread's figure beside it is the GIL's "
            "share",
            "ratios: "
            + "; ".join(f"{k} " + " ".join(f"{v:.2f}" for v in vals) for k, vals in ratios.items()),
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parts", default="stall,throughput,gil")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for training")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory(dir=".") as name:
        directory = Path(name)
        if "stall" in parts:
            stall(SMALL if args.small else GPT2_SMALL, args.rounds, directory)
        if "throughput" in parts:
            throughput(args.rounds, directory, args.threads)
        if "gil" in parts:
            gil(directory, args.rounds)


if __name__ == "__main__":
    main()
