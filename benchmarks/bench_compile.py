"""``acc.compile`` against ``torch.compile`` by hand, on the CPU, per training step.

Both compile the same small MLP with inductor; the step (forward, backward, AdamW)
is timed after warm-up, sampled round-robin, best sample per side. ``acc.compile``
only picks the backend, so the compiled step should cost the same.

Run through ``bash benchmarks/run compile`` (main test environment; inductor needs a
C compiler, the compile itself takes a minute on 2 cores), or alone:
``python benchmarks/bench_compile.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from _harness import compare_per_call, environment_line, fmt_ms, fmt_ratio, print_table, verdict
from torch import nn

import accel

GOAL_RATIO = 1.02
WIDTH, BATCH = 256, 64


def training_step(compile_model: Callable[[nn.Module], nn.Module]) -> Callable[[], object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    compiled = compile_model(model)
    inputs = torch.randn(BATCH, WIDTH)

    def step() -> None:
        compiled(inputs).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # compile, and settle the optimizer state
        step()
    return step


def main() -> None:
    print(environment_line(torch=torch.__version__))
    torch.set_num_threads(1)
    acc = accel.get_accelerator("cpu")
    steps = {
        "accel": training_step(acc.compile),
        "torch.compile": training_step(lambda model: torch.compile(model, backend="inductor")),
    }
    best = compare_per_call(steps, samples=25, min_sample_s=0.05)
    ratio = best["accel"] / best["torch.compile"]
    print_table(
        "A compiled training step on the CPU (inductor)",
        ["model", "acc.compile", "torch.compile by hand", "ratio", f"goal ≤{GOAL_RATIO}×"],
        [
            [
                f"MLP {WIDTH}-{WIDTH}-{WIDTH}, batch {BATCH}, AdamW",
                fmt_ms(best["accel"]),
                fmt_ms(best["torch.compile"]),
                fmt_ratio(ratio),
                verdict(ratio <= GOAL_RATIO),
            ]
        ],
        notes=["best of 25 round-robin samples per side, after 3 warm-up steps; one thread"],
    )


if __name__ == "__main__":
    main()
