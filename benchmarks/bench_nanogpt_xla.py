"""nanoGPT's training loop on XLA:CPU: written with accel against written with torch_xla.

The model is nanoGPT's architecture at its ``shakespeare-char`` size (6 layers, 6
heads, 384 wide, a 65-token vocabulary, the embedding tied to the output, weights
drawn as nanoGPT draws them; built by ``bench_models.GPT2LM``, nothing downloaded), on
sequences of 64 tokens, 4 a micro-batch, so that XLA:CPU runs a step in about a
second. The loop is nanoGPT's ``train.py``: AdamW, the loss divided over
``gradient_accumulation_steps`` micro-batches, gradients clipped to 1.0,
``zero_grad(set_to_none=True)``; the batch is taken at the top of each micro-step
(nanoGPT takes the next one between forward and backward, which on XLA cuts the graph
there; see docs/training.md). Run with accumulation 1 (``shakespeare-char``'s own
setting) and 4.

- accel: ``acc.device_loader``, ``acc.no_sync`` around each backward,
  ``acc.clip_grad_norm_``, ``acc.optimizer_step``.
- torch_xla by hand, as its examples teach: ``MpDeviceLoader`` (which marks the step
  at every batch), ``xm.reduce_gradients``, ``clip_grad_norm_``, ``optimizer.step()``.
- With accumulation, also torch_xla by hand with one step mark per optimizer step
  (batches moved with ``.to()``, ``xm.mark_step()`` after ``zero_grad``): the graph
  accel's loader cuts, written by hand, which tells accel's own cost apart from what
  one graph per optimizer step costs on XLA:CPU.

Each side trains its own copy of the same model in one process per accumulation
setting (each compiles its own graphs; counted per side with ``torch_xla.debug.metrics``),
on the same batches. After two warm-up epochs each, they take turns, an epoch of a few
optimizer steps each, round after round (the order rotating every round), each epoch
ended by waiting for the device; a ratio is the median of the rounds' ratios
(pairwise), so a slow spell on this shared machine hits both sides of a pair alike.

Runs in the XLA test environment with ``PJRT_DEVICE=CPU``, through ``bash
benchmarks/run nanogpt-xla``; alone: ``PJRT_DEVICE=CPU python
benchmarks/bench_nanogpt_xla.py``. About fifteen minutes on 2 cores.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict

ROUNDS = int(os.environ.get("BENCH_NANOGPT_ROUNDS", "7"))
GOAL_RATIO = 1.02
PER_STEP = "torch_xla, one mark per step"
LENGTH, BATCH = 64, 4
WARMUP_EPOCHS = 2
#: gradient_accumulation_steps -> optimizer steps in an epoch
STEPS_PER_EPOCH = {1: 4, 4: 2}


def child(accumulation: int) -> dict[str, Any]:
    """Both sides' epochs, taking turns, in this (fresh) process."""
    import bench_models as models
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics
    import torch_xla.distributed.parallel_loader as pl
    from torch import nn
    from torch.nn import functional as F

    import accel

    acc = accel.get_accelerator("tpu")  # the runtime starts before any backward
    config = models.GPT2Config(vocab=65, positions=256, width=384, layers=6, heads=6)
    torch.manual_seed(0)
    initial = models.GPT2LM(config)
    for module in initial.modules():  # nanoGPT's _init_weights
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    steps = STEPS_PER_EPOCH[accumulation]
    tokens = torch.randint(0, config.vocab, (steps * accumulation, BATCH, LENGTH + 1))
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens]

    def loss_of(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, config.vocab), targets.reshape(-1))

    def with_accel() -> Callable[[], torch.Tensor]:
        model = acc.model_to_device(copy.deepcopy(initial))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
        loader = acc.device_loader(batches)

        def epoch() -> torch.Tensor:
            for index, (inputs, targets) in enumerate(loader):
                last = index % accumulation == accumulation - 1
                with acc.no_sync(model, enabled=not last):
                    loss = loss_of(model, inputs, targets)
                    (loss / accumulation).backward()
                if last:
                    acc.clip_grad_norm_(model.parameters(), 1.0)
                    acc.optimizer_step(optimizer)
                    optimizer.zero_grad(set_to_none=True)
            return loss

        return epoch

    def by_hand() -> Callable[[], torch.Tensor]:
        device = torch_xla.device()
        model = copy.deepcopy(initial).to(device)
        model.lm_head.weight = model.wte.weight  # .to() untied it: re-tie by hand
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
        loader = pl.MpDeviceLoader(batches, device)

        def epoch() -> torch.Tensor:
            for index, (inputs, targets) in enumerate(loader):
                loss = loss_of(model, inputs, targets)
                (loss / accumulation).backward()
                if index % accumulation == accumulation - 1:
                    xm.reduce_gradients(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            return loss

        return epoch

    def by_hand_one_mark_per_step() -> Callable[[], torch.Tensor]:
        device = torch_xla.device()
        model = copy.deepcopy(initial).to(device)
        model.lm_head.weight = model.wte.weight
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))

        def epoch() -> torch.Tensor:
            for index, (inputs, targets) in enumerate(batches):
                loss = loss_of(model, inputs.to(device), targets.to(device))
                (loss / accumulation).backward()
                if index % accumulation == accumulation - 1:
                    xm.reduce_gradients(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    xm.mark_step()
            return loss

        return epoch

    epochs = {"accel": with_accel(), "torch_xla": by_hand()}
    if accumulation > 1:
        epochs[PER_STEP] = by_hand_one_mark_per_step()
    sides = list(epochs)
    graphs = dict.fromkeys(sides, 0)
    executions = dict.fromkeys(sides, 0)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    losses = {}

    def counts() -> tuple[int, int]:
        compiled = metrics.metric_data("CompileTime")
        executed = metrics.metric_data("ExecuteTime")
        return (compiled[0] if compiled else 0), (executed[0] if executed else 0)

    for round_ in range(-WARMUP_EPOCHS, ROUNDS):
        turn = round_ % len(sides)  # each side first in its turn, the order rotating
        for side in sides[turn:] + sides[:turn]:
            torch_xla.sync()
            xm.wait_device_ops()
            compiled, executed = counts()
            started = time.perf_counter()
            loss = epochs[side]()
            torch_xla.sync()
            xm.wait_device_ops()  # (torch_xla counts an execution when it ends)
            elapsed = time.perf_counter() - started
            compiled_now, executed_now = counts()
            graphs[side] += compiled_now - compiled
            executions[side] += executed_now - executed
            losses[side] = float(loss.item())
            if round_ >= 0:
                seconds[side].append(elapsed / steps)
    return {"seconds": seconds, "graphs": graphs, "executions": executions, "losses": losses}


def run_child(accumulation: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", str(accumulation)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"accumulation {accumulation} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    rows = []
    for accumulation, steps in STEPS_PER_EPOCH.items():
        result = run_child(accumulation)
        seconds = result["seconds"]

        def ratios_to(side: str, seconds: dict[str, list[float]] = seconds) -> list[float]:
            return [a / b for a, b in zip(seconds["accel"], seconds[side], strict=True)]

        ratios = ratios_to("torch_xla")
        ratio = statistics.median(ratios)
        per_step = PER_STEP in seconds
        counts = [f"{result['graphs'][side]} / {result['executions'][side]}" for side in seconds]
        rows.append(
            [
                f"{accumulation} ({steps} steps an epoch)",
                fmt_ms(statistics.median(seconds["accel"])),
                fmt_ms(statistics.median(seconds["torch_xla"])),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
                f"{fmt_ratio(min(ratios))}-{fmt_ratio(max(ratios))}",
                fmt_ms(statistics.median(seconds[PER_STEP])) if per_step else "-",
                fmt_ratio(statistics.median(ratios_to(PER_STEP))) if per_step else "-",
                ", ".join(counts),
                " / ".join(f"{result['losses'][side]:.5f}" for side in seconds),
            ]
        )
    print_table(
        f"nanoGPT (shakespeare-char size) on XLA:CPU, time per optimizer step, "
        f"micro-batch {BATCH}×{LENGTH}",
        [
            "gradient accumulation",
            "accel",
            "torch_xla by hand",
            "ratio",
            f"goal ≤{GOAL_RATIO}×",
            "rounds' ratios",
            "by hand, one mark per step",
            "ratio to it",
            f"graphs / executions in {ROUNDS + WARMUP_EPOCHS} epochs (in that order)",
            "last loss (in that order)",
        ],
        rows,
        notes=[
            f"{ROUNDS} rounds of an epoch per side, taking turns in one process, the order "
            f"rotating each round, after {WARMUP_EPOCHS} warm-up epochs each; times: "
            "medians; ratios: medians of the rounds' ratios",
            "torch_xla by hand: MpDeviceLoader, which marks the step at every batch; one mark "
            "per step: batches moved with .to(), xm.mark_step() after each optimizer step",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]))))
    else:
        main()
