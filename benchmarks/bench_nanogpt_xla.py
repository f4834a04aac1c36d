"""nanoGPT's training loop on XLA:CPU: written with accel against written with torch_xla.

The model is nanoGPT's architecture at its ``shakespeare-char`` size (6 layers, 6
heads, 384 wide, a 65-token vocabulary, the embedding tied to the output; built here
by ``bench_models.GPT2LM``, nothing downloaded), on sequences of 64 tokens, 4 a
micro-batch, so that XLA:CPU runs a step in well under a second. The loop is nanoGPT's
``train.py``: AdamW, the loss divided over ``gradient_accumulation_steps``
micro-batches, gradients clipped to 1.0, ``zero_grad(set_to_none=True)``; the batch is
taken at the top of each micro-step (nanoGPT takes the next one between forward and
backward, which on XLA cuts the graph there; see docs/training.md). Run with
accumulation 1 (``shakespeare-char``'s own setting) and 4.

- accel: ``acc.device_loader``, ``acc.no_sync`` around each backward,
  ``acc.clip_grad_norm_``, ``acc.optimizer_step``.
- torch_xla by hand, as its examples teach: ``MpDeviceLoader`` (which marks the step
  at every batch), ``xm.reduce_gradients``, ``clip_grad_norm_``, ``optimizer.step()``.

Each (accumulation, side) runs in a fresh process, so each compiles its own graphs
(counted by ``torch_xla.debug.metrics``). The sides alternate in every round, the
order flipping each round, and the ratio is the median of the rounds' ratios
(pairwise), so a slow spell on this shared machine hits both sides of a pair alike.

Runs in the XLA test environment with ``PJRT_DEVICE=CPU``, through ``bash
benchmarks/run nanogpt-xla``; alone: ``PJRT_DEVICE=CPU python
benchmarks/bench_nanogpt_xla.py``. Several minutes a round on 2 cores.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict

ROUNDS = int(os.environ.get("BENCH_NANOGPT_ROUNDS", "3"))
GOAL_RATIO = 1.02
SIDES = ("accel", "torch_xla")
LENGTH, BATCH = 64, 4
# gradient_accumulation_steps -> (optimizer steps, of which not timed)
RUNS = {1: (16, 4), 4: (8, 3)}


def child(accumulation: int, side: str) -> dict[str, float]:
    """One side's loop in this (fresh) process."""
    import bench_models as models
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics
    import torch_xla.distributed.parallel_loader as pl
    from torch.nn import functional as F

    config = models.GPT2Config(vocab=65, positions=256, width=384, layers=6, heads=6)
    steps, warmup = RUNS[accumulation]
    torch.manual_seed(0)
    model = models.GPT2LM(config)
    tokens = torch.randint(0, config.vocab, (steps * accumulation, BATCH, LENGTH + 1))
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens]

    if side == "accel":
        import accel

        acc = accel.get_accelerator("tpu")
        model = acc.model_to_device(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
        loader = acc.device_loader(batches)

        def backward(loss: torch.Tensor, last: bool) -> None:
            with acc.no_sync(model, enabled=not last):
                loss.backward()

        def step() -> None:
            acc.clip_grad_norm_(model.parameters(), 1.0)
            acc.optimizer_step(optimizer)
    else:
        device = torch_xla.device()
        model = model.to(device)
        model.lm_head.weight = model.wte.weight  # .to() untied it: re-tie by hand
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
        loader = pl.MpDeviceLoader(batches, device)

        def backward(loss: torch.Tensor, last: bool) -> None:
            loss.backward()

        def step() -> None:
            xm.reduce_gradients(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

    started = 0.0
    for index, (inputs, targets) in enumerate(loader):
        optimizer_step, micro_step = divmod(index, accumulation)
        if optimizer_step == warmup and micro_step == 0:
            torch_xla.sync()
            xm.wait_device_ops()
            started = time.perf_counter()
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, config.vocab), targets.reshape(-1))
        last = micro_step == accumulation - 1
        backward(loss / accumulation, last)
        if last:
            step()
            optimizer.zero_grad(set_to_none=True)
    torch_xla.sync()
    xm.wait_device_ops()
    elapsed = time.perf_counter() - started
    compiled = metrics.metric_data("CompileTime")
    executed = metrics.metric_data("ExecuteTime")
    return {
        "step_s": elapsed / (steps - warmup),
        "graphs": float(compiled[0]) if compiled else 0.0,
        "executions": float(executed[0]) if executed else 0.0,
        "last_loss": float(loss.item()),
    }


def run_child(accumulation: int, side: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", str(accumulation), side],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"accumulation {accumulation}/{side} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    rows = []
    for accumulation, (steps, warmup) in RUNS.items():
        results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
        for round_ in range(ROUNDS):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                results[side].append(run_child(accumulation, side))
        pairs = zip(results["accel"], results["torch_xla"], strict=True)
        ratio = statistics.median(a["step_s"] / b["step_s"] for a, b in pairs)
        median = {side: statistics.median(r["step_s"] for r in results[side]) for side in SIDES}
        counts = {
            side: "/".join(
                sorted({f"{int(r['graphs'])} / {int(r['executions'])}" for r in results[side]})
            )
            for side in SIDES
        }
        losses = {side: results[side][0]["last_loss"] for side in SIDES}
        rows.append(
            [
                f"{accumulation} ({steps} steps, {warmup} not timed)",
                fmt_ms(median["accel"]),
                fmt_ms(median["torch_xla"]),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
                counts["accel"],
                counts["torch_xla"],
                f"{losses['accel']:.5f} / {losses['torch_xla']:.5f}",
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
            "graphs / executions (accel)",
            "graphs / executions (by hand)",
            "last loss (accel / by hand)",
        ],
        rows,
        notes=[
            f"{ROUNDS} rounds of one fresh process per side, the order flipping each round; "
            "times: medians; ratio: median of the rounds' ratios",
            "graphs and executions over the whole run, warm-up included",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), sys.argv[3])))
    else:
        main()
