"""The rest of the step on XLA:CPU: accumulation 2 + clipping, accel against torch_xla by hand.

accel: ``acc.device_loader``, ``acc.no_sync`` around each micro-step's backward,
``acc.clip_grad_norm_`` and ``acc.optimizer_step``. By hand: ``MpDeviceLoader``,
``xm.reduce_gradients`` then ``torch.nn.utils.clip_grad_norm_`` then
``optimizer.step()`` (reduce before clipping, as Accelerate and Lightning do), the
loader marking the step. A GPT-2-small-shaped tied model; no ``.item()`` inside the
loop. Each side runs in a fresh process (its own graphs, counted by
``torch_xla.debug.metrics``); time per optimizer step is the wall time after the
warm-up steps, ended by waiting for the device.

Run through ``bash benchmarks/run step-xla`` (XLA test environment, ``PJRT_DEVICE=CPU``;
a few minutes on 2 cores); alone: ``PJRT_DEVICE=CPU python benchmarks/bench_step_xla.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict

STEPS = int(os.environ.get("BENCH_STEP_XLA_STEPS", "8"))  # optimizer steps
WARMUP = 3
ACCUMULATION = 2
ROUNDS = int(os.environ.get("BENCH_STEP_XLA_ROUNDS", "1"))
GOAL_RATIO = 1.05
SIDES = ("accel", "torch_xla")
LENGTH, BATCH = 64, 1


def child(side: str) -> dict[str, float]:
    """One side's steps in this (fresh) process."""
    import bench_models as models
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics
    import torch_xla.distributed.parallel_loader as pl
    from torch import nn

    torch.manual_seed(0)
    model = models.GPT2LM(models.GPT2_SMALL)
    vocab = models.GPT2_SMALL.vocab
    tokens = torch.randint(0, vocab, (STEPS * ACCUMULATION, BATCH, LENGTH + 1))
    batches = [{"inputs": t[:, :-1], "targets": t[:, 1:]} for t in tokens]
    loss_fn = nn.CrossEntropyLoss()

    if side == "accel":
        import accel

        acc = accel.get_accelerator("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model = acc.model_to_device(model, optimizer=optimizer)
        loader = acc.device_loader(batches)

        def backward(loss: torch.Tensor, last: bool) -> None:
            with acc.no_sync(model, enabled=not last):
                loss.backward()

        def step_optimizer() -> None:
            acc.clip_grad_norm_(model.parameters(), max_norm=1.0)
            acc.optimizer_step(optimizer)
    else:
        device = torch_xla.device()
        model = model.to(device)
        model.lm_head.weight = model.wte.weight  # .to() untied it: re-tie by hand
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loader = pl.MpDeviceLoader(batches, device)

        def backward(loss: torch.Tensor, last: bool) -> None:
            loss.backward()

        def step_optimizer() -> None:
            xm.reduce_gradients(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()

    started = 0.0
    for index, batch in enumerate(loader):
        step, micro_step = divmod(index, ACCUMULATION)
        if step == WARMUP and micro_step == 0:
            torch_xla.sync()
            xm.wait_device_ops()
            started = time.perf_counter()
        logits = model(batch["inputs"])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
        last = micro_step == ACCUMULATION - 1
        backward(loss / ACCUMULATION, last)
        if last:
            step_optimizer()
            optimizer.zero_grad()
    torch_xla.sync()
    xm.wait_device_ops()
    elapsed = time.perf_counter() - started
    compiled = metrics.metric_data("CompileTime")
    return {
        "step_s": elapsed / (STEPS - WARMUP),
        "compiled": float(compiled[0]) if compiled else 0.0,
        "last_loss": float(loss.item()),
    }


def run_child(side: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", side], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for round_ in range(ROUNDS):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            results[side].append(run_child(side))
    step = {side: min(r["step_s"] for r in results[side]) for side in SIDES}
    graphs = {side: {int(r["compiled"]) for r in results[side]} for side in SIDES}
    losses = {side: results[side][0]["last_loss"] for side in SIDES}
    ratio = step["accel"] / step["torch_xla"]
    print_table(
        f"Optimizer step with accumulation {ACCUMULATION} + clipping on XLA:CPU "
        f"({STEPS} steps, the first {WARMUP} not timed)",
        [
            "model",
            "accel",
            "torch_xla by hand",
            "ratio",
            f"goal ≤{GOAL_RATIO}×",
            "graphs (accel)",
            "graphs (by hand)",
            "goal: equal",
        ],
        [
            [
                f"GPT-2 small (tied), micro-batch {BATCH}×{LENGTH}",
                fmt_ms(step["accel"]),
                fmt_ms(step["torch_xla"]),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
                "/".join(map(str, sorted(graphs["accel"]))),
                "/".join(map(str, sorted(graphs["torch_xla"]))),
                verdict(graphs["accel"] == graphs["torch_xla"]),
            ]
        ],
        notes=[
            f"best of {ROUNDS} fresh process(es) per side (sides alternating); other load on "
            "this shared machine only adds time",
            f"last loss: accel {losses['accel']:.6f}, by hand {losses['torch_xla']:.6f} "
            "(the same batches and start)",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        main()
