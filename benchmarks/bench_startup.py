"""Start-up: what ``import accel`` and the ``accel`` command cost, whole process.

Each command runs as a fresh process, once to warm the file cache, then RUNS times
round-robin with the others; the figure is the median wall time. ``import torch``
alone varies by more than accel's whole cost between runs on a busy machine, so the
cost of ``import accel`` after torch is also timed inside each process (the
interpreter's clock around the import statement), which is the figure the goal is
judged on; the whole-process difference is shown beside it. Run in the main
test environment (no torch_xla, no peers), with ``PJRT_DEVICE`` and the
``ACCEL_*`` variables cleared so every process sees the default configuration.

Run through ``bash benchmarks/run``; alone: ``python benchmarks/bench_startup.py``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict

RUNS = 7
IMPORT_OVERHEAD_GOAL_S = 0.030
HELP_GOAL_S = 0.150
LIST_GOAL_RATIO = 1.5


def clean_environment() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if key != "PJRT_DEVICE" and not key.startswith("ACCEL_")
    }


def main() -> None:
    print(environment_line(torch=torch.__version__))
    python = sys.executable
    accel_command = str(Path(python).with_name("accel"))
    commands = {
        "python -c pass": [python, "-c", "pass"],
        "python -c 'import torch'": [python, "-c", "import torch"],
        "python -c 'import torch, accel'": [python, "-c", "import torch, accel"],
        "python -c 'import accel'": [python, "-c", "import accel"],
        "accel --help": [accel_command, "--help"],
        "accel list": [accel_command, "list"],
    }
    environment = clean_environment()
    timed_import = [
        python,
        "-c",
        "import time, torch; start = time.perf_counter(); import accel; "
        "print(time.perf_counter() - start)",
    ]

    def run(argv: list[str]) -> float:
        start = time.perf_counter()
        subprocess.run(
            argv, env=environment, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        return time.perf_counter() - start

    def import_seconds() -> float:
        done = subprocess.run(
            timed_import, env=environment, check=True, capture_output=True, text=True
        )
        return float(done.stdout)

    for argv in commands.values():
        run(argv)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    in_process: list[float] = []
    for _ in range(RUNS):
        for name, argv in commands.items():
            samples[name].append(run(argv))
        in_process.append(import_seconds())
    median = {name: statistics.median(values) for name, values in samples.items()}

    print_table(
        f"Process wall time, median of {RUNS} runs",
        ["command", "median", "min", "max"],
        [
            [name, fmt_ms(median[name]), fmt_ms(min(values)), fmt_ms(max(values))]
            for name, values in samples.items()
        ],
    )

    torch_s = median["python -c 'import torch'"]
    overhead = statistics.median(in_process)
    whole_process = median["python -c 'import torch, accel'"] - torch_s
    alone = median["python -c 'import accel'"] - median["python -c pass"]
    help_s = median["accel --help"]
    list_ratio = median["accel list"] / torch_s
    print_table(
        "Start-up goals",
        ["measure", "figure", "goal", "verdict"],
        [
            [
                "`import accel` after `import torch`, timed in the process",
                f"+{fmt_ms(overhead)} (min {fmt_ms(min(in_process))}, "
                f"max {fmt_ms(max(in_process))})",
                f"≤ {fmt_ms(IMPORT_OVERHEAD_GOAL_S)}",
                verdict(overhead <= IMPORT_OVERHEAD_GOAL_S),
            ],
            [
                "the same, as the difference of whole-process medians",
                f"{whole_process * 1e3:+.1f} ms",
                "(too noisy to judge: see the spread of `import torch` above)",
                "",
            ],
            [
                "`import accel` alone, over `python -c pass`",
                f"+{fmt_ms(alone)}",
                "(no goal)",
                "",
            ],
            [
                "`accel --help`",
                fmt_ms(help_s),
                f"< {fmt_ms(HELP_GOAL_S)}",
                verdict(help_s < HELP_GOAL_S),
            ],
            [
                "`accel list` ÷ `python -c 'import torch'`",
                fmt_ratio(list_ratio),
                f"≤ {fmt_ratio(LIST_GOAL_RATIO)}",
                verdict(list_ratio <= LIST_GOAL_RATIO),
            ],
        ],
    )


if __name__ == "__main__":
    main()
