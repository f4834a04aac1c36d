"""The kernel's per-call cost on the CPU, each call beside what one writes by hand
(issue 38, item 7: no slower).

* ``acc.optimizer_step(optimizer)`` against ``optimizer.step()`` (SGD, two small layers);
* ``acc.batch_to_device(batch)`` against ``{k: v.to(device) for k, v in batch.items()}``
  over the same dict of eight tensors;
* ``acc.model_to_device(model)`` of a 50-layer MLP already on the CPU against
  ``model.to(device)``: the model moves nowhere and no plugin takes part, so accel
  returns it at once, after proving torch's ``.to()`` would change nothing;
* the same with an MLP that has its own ``_apply`` (torch's ``.to()`` may then change
  it): accel runs the whole move, its capture and the hooks, so the difference is its
  fixed cost per move (the worst case for it);
* ``acc.mark_step()``, a no-op on the CPU, in µs, beside a call of a pluggy hook
  with one no-op implementation (``PluginManager.hook.NAME()``): the floor of any
  call through pluggy's call loop, which issue 38 asks every hook call to take.

Each round is a fresh interpreter (nothing warmed by an earlier round), the candidates'
order rotated from round to round; inside a round each candidate is the best of
round-robin samples (``_harness.compare_per_call``). The table shows the median over
the rounds of each time and of each round's ratio.

Run alone: ``python benchmarks/bench_kernel.py [--rounds N]`` (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

#: (the case, accel's candidate, the one by hand, the goal: on the ratio, or on accel's
#: time in seconds when ``ABSOLUTE``)
CASES: list[tuple[str, str, str, float]] = [
    ("optimizer step (SGD, 1,089 weights)", "acc.optimizer_step", "optimizer.step()", 1.07),
    ("batch: a dict of 8 tensors", "acc.batch_to_device", "dict of .to()", 2.0),
    ("model: a 50-layer MLP, CPU -> CPU", "acc.model_to_device", "model.to(device)", 1.2),
    (
        "model: the same, its own _apply (the hooks run)",
        "acc.model_to_device, hooks",
        "model.to(device), own _apply",
        1.2,
    ),
    ("mark_step (CPU: nothing to do)", "acc.mark_step", "pluggy hook, one no-op", 0.74e-6),
]

#: Goals below this are times in seconds, not ratios.
ABSOLUTE = 1e-3


#: Samples per candidate in a round, and the least time one sample takes.
SAMPLES = 7
MIN_SAMPLE_S = 0.005


def _candidates() -> dict[str, Callable[[], object]]:
    import pluggy
    import torch

    import accel

    acc = accel.get_accelerator("cpu")

    class Spec:
        @pluggy.HookspecMarker("bench")
        def mark_step(self) -> None: ...

    class NoOp:
        @pluggy.HookimplMarker("bench")
        def mark_step(self) -> None:
            return None

    manager = pluggy.PluginManager("bench")
    manager.add_hookspecs(Spec)
    manager.register(NoOp())
    device = acc.device

    small = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 1))
    small(torch.ones(4, 32)).sum().backward()
    optimizer = torch.optim.SGD(small.parameters(), lr=0.0)  # lr 0: the weights stay

    batch = {
        name: torch.zeros(8, 16)
        for name in ("input_ids", "attention_mask", "labels", "a", "b", "c", "d", "e")
    }
    mlp = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(50)))

    class OwnApply(torch.nn.Sequential):
        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            return super()._apply(fn, recurse)

    own_apply = OwnApply(*(torch.nn.Linear(64, 64) for _ in range(50)))

    return {
        "acc.optimizer_step": lambda: acc.optimizer_step(optimizer),
        "optimizer.step()": optimizer.step,
        "acc.batch_to_device": lambda: acc.batch_to_device(batch),
        "dict of .to()": lambda: {key: value.to(device) for key, value in batch.items()},
        "acc.model_to_device": lambda: acc.model_to_device(mlp),
        "model.to(device)": lambda: mlp.to(device),
        "acc.model_to_device, hooks": lambda: acc.model_to_device(own_apply),
        "model.to(device), own _apply": lambda: own_apply.to(device),
        "acc.mark_step": acc.mark_step,
        "pluggy hook, one no-op": manager.hook.mark_step,
    }


def _one_round(index: int) -> None:
    """In a fresh interpreter: each candidate's best time per call, as JSON."""
    import gc

    from _harness import timed

    candidates = _candidates()
    names = list(candidates)
    shift = index % len(names)
    order = names[shift:] + names[:shift]
    # As _harness.compare_per_call, with one collection per sweep rather than one per
    # sample: with torch imported a collection takes ~80 ms, most of a round's time.
    calls = {}
    for name in order:
        number = 1
        while True:
            with timed() as clock:
                for _ in range(number):
                    candidates[name]()
            if clock.seconds >= MIN_SAMPLE_S:
                break
            number *= 2
        calls[name] = number
    best = dict.fromkeys(order, float("inf"))
    for _ in range(SAMPLES):
        gc.collect()
        for name in order:
            call, number = candidates[name], calls[name]
            with timed() as clock:
                for _ in range(number):
                    call()
            best[name] = min(best[name], clock.seconds / number)
    print(json.dumps(best))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round", type=int, help=argparse.SUPPRESS)  # a child's round
    args = parser.parse_args()
    if args.round is not None:
        _one_round(args.round)
        return

    import torch
    from _harness import environment_line, fmt_ratio, fmt_us, print_table, verdict

    import accel

    where = os.path.dirname(accel.__file__)
    print(environment_line(torch=torch.__version__, accel=f"{accel.__version__} ({where})"))
    load_before = os.getloadavg()[0]
    rounds: list[dict[str, float]] = []
    for index in range(args.rounds):
        done = subprocess.run(
            [sys.executable, __file__, "--round", str(index)],
            check=True,
            capture_output=True,
            text=True,
        )
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    load_after = os.getloadavg()[0]

    def median(name: str) -> float:
        return statistics.median(times[name] for times in rounds)

    rows: list[list[Any]] = []
    for case, ours, theirs, goal in CASES:
        ratio = statistics.median(times[ours] / times[theirs] for times in rounds)
        if goal < ABSOLUTE:
            shown_goal, met = f"≤ {goal * 1e6:.2f} µs", median(ours) <= goal
        else:
            shown_goal, met = f"≤ {fmt_ratio(goal)}", ratio <= goal
        rows.append(
            [
                case,
                fmt_us(median(ours)),
                fmt_us(median(theirs)),
                fmt_ratio(ratio),
                shown_goal,
                verdict(met),
            ]
        )
    print_table(
        "The kernel against the same work by hand (CPU)",
        ["call", "accel", "by hand", "ratio", "goal", "verdict"],
        rows,
        [
            f"median of {args.rounds} rounds, each a fresh interpreter with the order "
            f"rotated; in a round, the best of {SAMPLES} round-robin samples of ≥ 5 ms",
            f"load average {load_before:.2f} at the start, {load_after:.2f} at the end "
            "(a shared 2-core machine: ratios move by several per cent between runs)",
        ],
    )


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness
    main()
