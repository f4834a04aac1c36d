"""A training step on XLA:CPU: accel's loop against the same loop written with torch_xla.

accel: ``acc.device_loader`` + ``acc.optimizer_step``. By hand: torch_xla's
``MpDeviceLoader`` + ``xm.optimizer_step``, the loop torch_xla's own examples teach.
The loop bodies are otherwise identical (no ``.item()`` inside, which would split
the graph). Each (model, side) runs in a fresh process, so every side compiles its
own graphs; the count comes from ``torch_xla.debug.metrics``. Time per step is the
wall time of the steps after the warm-up ones, ended by waiting for the device.

Runs in the XLA test environment with ``PJRT_DEVICE=CPU``, through ``bash
benchmarks/run training-xla``; alone: ``PJRT_DEVICE=CPU python
benchmarks/bench_training_xla.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla is imported

from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict

STEPS = 40
WARMUP = 5
ROUNDS = int(os.environ.get("BENCH_TRAINING_ROUNDS", "2"))
GOAL_RATIO = 1.05
SIDES = ("accel", "torch_xla")
# (label, model, sequence length, batch size)
MODELS = {
    "demo": ("accel demo model (tied, 5 tensors)", 63, 2),
    "gpt2": ("GPT-2 small (tied, 124M parameters)", 64, 1),
}


def child(model_name: str, side: str) -> dict[str, float]:
    """One side's 40 steps in this (fresh) process."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as metrics
    import torch_xla.distributed.parallel_loader as pl
    from torch import nn

    torch.manual_seed(0)
    _, length, batch_size = MODELS[model_name]
    if model_name == "demo":
        from accel.tools._demo import build_tied_language_model

        model, vocab = build_tied_language_model(), 64
    else:
        import bench_models as models

        model, vocab = models.GPT2LM(models.GPT2_SMALL), models.GPT2_SMALL.vocab
    tokens = torch.randint(0, vocab, (STEPS, batch_size, length + 1))
    batches = [{"inputs": t[:, :-1], "targets": t[:, 1:]} for t in tokens]
    loss_fn = nn.CrossEntropyLoss()

    if side == "accel":
        import accel

        acc = accel.get_accelerator("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model = acc.model_to_device(model, optimizer=optimizer)
        loader = acc.device_loader(batches)

        def step_optimizer() -> None:
            acc.optimizer_step(optimizer)
    else:
        device = torch_xla.device()
        model = model.to(device)  # unties: re-tie by hand, as torch_xla's docs say
        if model_name == "gpt2":
            model.lm_head.weight = model.wte.weight
        else:
            model.tie_weights()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loader = pl.MpDeviceLoader(batches, device)

        def step_optimizer() -> None:
            xm.optimizer_step(optimizer)

    started = 0.0
    for step, batch in enumerate(loader):
        if step == WARMUP:
            torch_xla.sync()
            xm.wait_device_ops()
            started = time.perf_counter()
        logits = model(batch["inputs"])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))
        loss.backward()
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


def run_child(model_name: str, side: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", model_name, side],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{model_name}/{side} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    import torch
    import torch_xla

    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    rows = []
    for model_name, (label, length, batch_size) in MODELS.items():
        results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
        for round_ in range(ROUNDS):
            order = SIDES if round_ % 2 == 0 else SIDES[::-1]
            for side in order:
                results[side].append(run_child(model_name, side))
        step = {side: min(r["step_s"] for r in results[side]) for side in SIDES}
        graphs = {side: {int(r["compiled"]) for r in results[side]} for side in SIDES}
        ratio = step["accel"] / step["torch_xla"]
        rows.append(
            [
                f"{label}, batch {batch_size}×{length}",
                fmt_ms(step["accel"]),
                fmt_ms(step["torch_xla"]),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
                "/".join(map(str, sorted(graphs["accel"]))),
                "/".join(map(str, sorted(graphs["torch_xla"]))),
                verdict(graphs["accel"] == graphs["torch_xla"]),
            ]
        )
    print_table(
        f"Time per training step on XLA:CPU ({STEPS} steps, the first {WARMUP} not timed)",
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
        rows,
        notes=[
            f"best of {ROUNDS} fresh processes per side (sides alternating): other load on this "
            "shared machine only adds time",
            "accel: device_loader + optimizer_step; by hand: MpDeviceLoader + "
            "xm.optimizer_step; AdamW, cross-entropy, the same batches",
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        main()
