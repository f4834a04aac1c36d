"""How long the conformance kit takes on a small device: the CPU, one run.

A vendor runs ``accel conformance NAME`` in CI; the goal is at most 2 minutes on a
small device. Measured twice: the whole command in a fresh interpreter (imports, the
compile and the two distributed workers included), and each area in this process,
so that the table shows where the time goes. No peer has a kit to compare with
(Lightning, Accelerate, DeepSpeed and Ray Train ship none), so the figure stands
against the goal alone.

Run through ``bash benchmarks/run conformance`` (main test environment), or alone:
``python benchmarks/bench_conformance.py``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from _harness import environment_line, print_table, verdict

from accel.testing.conformance import Limits, all_promises
from accel.testing.conformance._runner import check_promise, subject_for

GOAL_S = 120.0


def whole_command() -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "accel", "conformance", "cpu"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return time.perf_counter() - started


def per_area() -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    with tempfile.TemporaryDirectory() as tmp:
        subject = subject_for("cpu", Path(tmp), limits=Limits())
        for promise in all_promises():
            started = time.perf_counter()
            check_promise(promise, subject)
            seconds[promise.name.partition(".")[0]] += time.perf_counter() - started
    return dict(seconds)


def main() -> None:
    print(environment_line(torch=torch.__version__))
    total = whole_command()
    areas = per_area()
    counts: dict[str, int] = defaultdict(int)
    for promise in all_promises():
        counts[promise.name.partition(".")[0]] += 1
    rows = [[area, counts[area], f"{areas[area]:.1f} s"] for area in areas]
    rows.append(["**`accel conformance cpu`, end to end**", len(all_promises()), f"{total:.1f} s"])
    print_table(
        "The conformance kit on the CPU",
        ["area", "promises", "wall time"],
        rows,
        notes=[
            f"goal: the whole command in at most {GOAL_S:.0f} s on a small device: "
            f"{verdict(total <= GOAL_S)} ({total / GOAL_S:.2f}× the budget)",
            "per area: in this process after the command ran (imports and inductor's "
            "cache warm); `distributed` starts two fresh interpreters",
        ],
    )


if __name__ == "__main__":
    main()
