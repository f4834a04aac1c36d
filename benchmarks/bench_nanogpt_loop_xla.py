"""nanoGPT's own loop, small, on XLA:CPU: through accel against torch_xla by hand.

The shape of nanoGPT's ``train.py`` around its ``model.py`` (:mod:`nanogpt_model`,
written in code): 2 layers, 64 wide, 4 heads, a 65-token vocabulary, ``wte`` tied to
``lm_head``; gradient accumulation 2, the loss divided by it; ``clip_grad_norm_`` at
1.0; ``configure_optimizers``' AdamW (decay and no-decay groups, ``fused`` only on
CUDA); the learning rate of ``get_lr(iter_num)`` (warm-up, then cosine) written into
every ``optimizer.param_groups`` entry at the top of every iteration, a Python float;
``zero_grad(set_to_none=True)``. A model this small makes a step mostly host work
(tracing, dispatch), so this is where accel's per-step Python shows.

Where the batch is taken, ``BENCH_NANOGPT_LOOP_FETCH``: ``top`` (the default), at the
top of each micro-step, as docs/training.md advises on XLA; ``train.py``, the next
batch taken between forward and backward, as nanoGPT's ``train.py`` does (with
``next()`` on the loader), which moves accel's graph cut after the first micro-batch's
forward.

- accel: ``acc.model_to_device``, ``acc.device_loader``, ``acc.clip_grad_norm_``,
  ``acc.optimizer_step``.
- torch_xla by hand: ``.to(device)`` (re-tied by hand), ``MpDeviceLoader``,
  ``torch.nn.utils.clip_grad_norm_``, ``xm.optimizer_step``.

Both sides train their own copy of the same model on the same batches in one process.
After warm-up epochs they take turns, an epoch each, the order alternating every round,
each epoch ended by waiting for the device; the ratio is the median of the rounds'
ratios (pairwise), so a slow spell on the shared machine hits both sides of a pair
alike. Graph compilations and executions are counted per side
(``torch_xla.debug.metrics``); the last losses of both are printed (they agree: the same
arithmetic on the same data).

``--profile SIDE`` (``accel`` or ``torch_xla``) prints a cProfile of that side's epochs
instead (by time spent in each function), to see where the host time goes.

Runs in the XLA test environment: ``bash benchmarks/run nanogpt-loop-xla``; alone:
``PJRT_DEVICE=CPU python benchmarks/bench_nanogpt_loop_xla.py``. A few minutes.
"""

from __future__ import annotations

import copy
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict

ROUNDS = int(os.environ.get("BENCH_NANOGPT_LOOP_ROUNDS", "15"))
WARMUP_EPOCHS = 2
GOAL_RATIO = 1.02
ACCUMULATION = 2
STEPS_PER_EPOCH = 8
BATCH = 8
GRAD_CLIP = 1.0
#: "train.py": the next batch taken between forward and backward, as train.py does;
#: "top": at the top of each micro-step, as docs/training.md advises on XLA.
WHERE = {"top": "at the top of each micro-step", "train.py": "between forward and backward"}
FETCH = os.environ.get("BENCH_NANOGPT_LOOP_FETCH", "top")


def sides() -> tuple[dict[str, Callable[[], Any]], Callable[[], dict[str, int]]]:
    """Each side's epoch (returning its last loss), and the metrics counter."""
    import nanogpt_model as nanogpt
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics
    import torch_xla.distributed.parallel_loader as pl

    import accel

    acc = accel.get_accelerator("tpu")
    config = nanogpt.GPTConfig()
    torch.manual_seed(0)
    initial = nanogpt.GPT(config)
    tokens = torch.randint(
        0, config.vocab_size, (STEPS_PER_EPOCH * ACCUMULATION, BATCH, config.block_size + 1)
    )
    batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]

    def train_epoch(
        model: Any, optimizer: torch.optim.Optimizer, loader: Any, clip_and_step: Any
    ) -> Callable[[], Any]:
        """An epoch of train.py's loop; the iteration count lives on across epochs."""
        iter_num = 0

        def epoch() -> Any:
            nonlocal iter_num
            batches = iter(loader)
            if FETCH == "train.py":
                X, Y = next(batches)
            for _ in range(STEPS_PER_EPOCH):
                lr = nanogpt.get_lr(iter_num)
                for param_group in optimizer.param_groups:
                    param_group["lr"] = lr
                for _ in range(ACCUMULATION):
                    if FETCH == "train.py":
                        _, loss = model(X, Y)
                        loss = loss / ACCUMULATION
                        # The next batch while the forward runs; none after the last.
                        X, Y = next(batches, (X, Y))
                    else:
                        X, Y = next(batches)
                        _, loss = model(X, Y)
                        loss = loss / ACCUMULATION
                    loss.backward()
                clip_and_step()
                optimizer.zero_grad(set_to_none=True)
                iter_num += 1
            return loss

        return epoch

    def optimizer_of(model: Any, device: torch.device) -> torch.optim.AdamW:
        return model.configure_optimizers(  # type: ignore[no-any-return]
            weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.99), device_type=device.type
        )

    def with_accel() -> Callable[[], Any]:
        model = acc.model_to_device(copy.deepcopy(initial))
        optimizer = optimizer_of(model, acc.device)
        loader = acc.device_loader(batches)

        def clip_and_step() -> None:
            acc.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            acc.optimizer_step(optimizer)

        return train_epoch(model, optimizer, loader, clip_and_step)

    def by_hand() -> Callable[[], Any]:
        device = torch_xla.device()
        model = copy.deepcopy(initial).to(device)
        model.transformer.wte.weight = model.lm_head.weight  # .to() untied them
        optimizer = optimizer_of(model, device)
        loader = pl.MpDeviceLoader(batches, device)

        def clip_and_step() -> None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            xm.optimizer_step(optimizer)

        return train_epoch(model, optimizer, loader, clip_and_step)

    def counts() -> dict[str, int]:
        compiled = metrics.metric_data("CompileTime")
        executed = metrics.metric_data("ExecuteTime")
        return {
            "graphs": compiled[0] if compiled else 0,
            "executions": executed[0] if executed else 0,
        }

    return {"accel": with_accel(), "torch_xla": by_hand()}, counts


def finish() -> None:
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    xm.wait_device_ops()


def measure() -> dict[str, Any]:
    epochs, counts = sides()
    names = list(epochs)
    totals = {name: {"graphs": 0, "executions": 0} for name in names}
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}  # the process's CPU time
    losses: dict[str, float] = {}
    for round_ in range(-WARMUP_EPOCHS, ROUNDS):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            finish()
            before = counts()
            started, cpu_started = time.perf_counter(), time.process_time()
            loss = epochs[name]()
            finish()  # (torch_xla counts an execution when it ends)
            elapsed = time.perf_counter() - started
            cpu_elapsed = time.process_time() - cpu_started
            after = counts()
            for key in totals[name]:
                totals[name][key] += after[key] - before[key]
            losses[name] = float(loss.item()) * ACCUMULATION
            if round_ >= 0:
                seconds[name].append(elapsed / STEPS_PER_EPOCH)
                cpu[name].append(cpu_elapsed / STEPS_PER_EPOCH)
    return {"seconds": seconds, "cpu": cpu, "totals": totals, "losses": losses}


def profile(side: str) -> None:
    epochs, _ = sides()
    for _ in range(WARMUP_EPOCHS):
        epochs[side]()
        finish()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(ROUNDS):
        epochs[side]()
        finish()
    profiler.disable()
    stats = pstats.Stats(profiler).strip_dirs().sort_stats("tottime")
    print(f"{side}: {ROUNDS} epochs of {STEPS_PER_EPOCH} steps")
    stats.print_stats(30)


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    load = os.getloadavg()
    result = measure()
    end = os.getloadavg()
    seconds = result["seconds"]
    ratios = [a / b for a, b in zip(seconds["accel"], seconds["torch_xla"], strict=True)]
    ratio = statistics.median(ratios)
    quartiles = statistics.quantiles(ratios, n=4)
    cpu = result["cpu"]
    cpu_ratio = statistics.median(
        [a / b for a, b in zip(cpu["accel"], cpu["torch_xla"], strict=True)]
    )
    totals = result["totals"]
    print_table(
        f"nanoGPT's loop (2 layers, 64 wide, accumulation {ACCUMULATION}, clipping, "
        f"param-group LR; batches taken {WHERE[FETCH]}) on XLA:CPU, time per optimizer "
        f"step, micro-batch {BATCH}×64",
        [
            "accel",
            "torch_xla by hand",
            "ratio (pairwise median)",
            f"goal ≤{GOAL_RATIO}×",
            "middle half of the rounds' ratios",
            "CPU-time ratio",
            "graphs / executions (accel, by hand)",
            "last loss (accel, by hand)",
        ],
        [
            [
                fmt_ms(statistics.median(seconds["accel"])),
                fmt_ms(statistics.median(seconds["torch_xla"])),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
                f"{fmt_ratio(quartiles[0])}-{fmt_ratio(quartiles[2])}",
                fmt_ratio(cpu_ratio),
                ", ".join(f"{t['graphs']} / {t['executions']}" for t in totals.values()),
                " / ".join(f"{result['losses'][name]:.5f}" for name in totals),
            ]
        ],
        notes=[
            f"{ROUNDS} rounds of an epoch ({STEPS_PER_EPOCH} optimizer steps) per side, "
            f"taking turns in one process, the order alternating, after {WARMUP_EPOCHS} "
            f"warm-up epochs each; times: medians; the ratio: the median of the rounds' "
            f"ratios; graphs and executions over every epoch, warm-up included",
            "CPU-time ratio: the median of the rounds' ratios of the process's CPU time "
            "(every thread: tracing, torch_xla's loader and XLA's execution), which other "
            "processes disturb less than wall time",
            f"load average at the start: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; "
            f"at the end: {end[0]:.2f}, {end[1]:.2f}, {end[2]:.2f}",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--profile":
        profile(sys.argv[2])
    else:
        main()
