"""acc.save against a bare torch.save of the same dict to the same disk, and acc.load +
restore against torch.load + load_state_dict, on a GPT-2 small state (model + AdamW).

Goals: save at >= 0.9x torch.save's throughput (the atomic write's fsyncs and rename
are the price), load + restore at <= 1.1x the time of doing it by hand. Each candidate
is timed in turn, several rounds, best sample kept (see _harness). ``--small`` uses a
4-layer, 256-wide GPT-2 for a quick look. ``--xla-resume`` (in the XLA environment,
``PJRT_DEVICE=CPU``) reports the time to resume on XLA:CPU: from starting a process to
the end of the first training step after ``acc.load``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _harness import fmt_ms, fmt_ratio, print_table, timed, verdict
from bench_models import GPT2_SMALL, GPT2Config, gpt2_style

import accel

SMALL = GPT2Config(vocab=8192, width=256, layers=4, heads=4)

#: The resumed process: everything from `python` starting to the first step's end.
RESUME = """
import os, sys, time
sys.path[:0] = os.environ["BENCH_PATH"].split(os.pathsep)
marks = {}
import torch, accel
from bench_models import GPT2_SMALL, GPT2Config, gpt2_style
marks["imported"] = time.time()
acc = accel.get_accelerator("tpu")
small = GPT2Config(vocab=8192, width=256, layers=4, heads=4)
config = small if os.environ["BENCH_SMALL"] == "1" else GPT2_SMALL
model = acc.model_to_device(gpt2_style(config, device="cpu"))
optimizer = torch.optim.AdamW(model.parameters())
marks["built"] = time.time()
acc.load(os.environ["BENCH_CHECKPOINT"], {"model": model, "optimizer": optimizer})
acc.synchronize()
marks["loaded"] = time.time()
tokens = acc.batch_to_device(torch.zeros(1, 8, dtype=torch.long))
model(tokens).sum().backward()
acc.optimizer_step(optimizer)
acc.synchronize()
marks["stepped"] = time.time()
print(" ".join(f"{k}={v}" for k, v in marks.items()))
"""


def xla_resume(small: bool) -> None:
    acc = accel.get_accelerator("cpu")
    model = gpt2_style(SMALL if small else GPT2_SMALL, device="cpu")
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    directory = Path(tempfile.mkdtemp(dir="."))
    checkpoint = directory / "resume.pt"
    acc.save({"model": model, "optimizer": optimizer}, checkpoint)
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "BENCH_PATH": os.pathsep.join([str(here), str(here.parent)]),
        "BENCH_SMALL": "1" if small else "0",
        "BENCH_CHECKPOINT": str(checkpoint),
    }
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-c", RESUME], env=env, capture_output=True, text=True, check=True
    )
    marks = dict(item.split("=") for item in done.stdout.split()[-4:])
    checkpoint.unlink()
    directory.rmdir()
    at = {key: float(value) - start for key, value in marks.items()}
    print_table(
        f"Time to resume on XLA:CPU ({'a small GPT-2' if small else 'GPT-2 small'} + AdamW)",
        ["process start to", "seconds"],
        [
            ["imports done (torch, accel)", f"{at['imported']:.1f}"],
            ["model built and on XLA", f"{at['built']:.1f}"],
            ["acc.load restored it", f"{at['loaded']:.1f}"],
            ["first step done (compiles)", f"{at['stepped']:.1f}"],
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--xla-resume", action="store_true")
    args = parser.parse_args()
    if args.xla_resume:
        xla_resume(args.small)
        return
    config = SMALL if args.small else GPT2_SMALL
    acc = accel.get_accelerator("cpu")
    model = gpt2_style(config, device="cpu")
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()  # AdamW's moments exist: the state is model + 2x parameters
    directory = Path(tempfile.mkdtemp(dir="."))
    plain = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    size = 0
    best = {"torch.save": 1e9, "acc.save": 1e9, "by hand": 1e9, "acc.load": 1e9}
    for _ in range(args.rounds):
        with timed() as clock:
            torch.save(plain, directory / "bare.pt")
        best["torch.save"] = min(best["torch.save"], clock.seconds)
        with timed() as clock:
            acc.save({"model": model, "optimizer": optimizer}, directory / "atomic.pt")
        best["acc.save"] = min(best["acc.save"], clock.seconds)
        size = (directory / "atomic.pt").stat().st_size
        with timed() as clock:
            stored = torch.load(directory / "bare.pt", weights_only=True)
            model.load_state_dict(stored["model"])
            optimizer.load_state_dict(stored["optimizer"])
        best["by hand"] = min(best["by hand"], clock.seconds)
        with timed() as clock:
            acc.load(directory / "atomic.pt", {"model": model, "optimizer": optimizer})
        best["acc.load"] = min(best["acc.load"], clock.seconds)
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    save_ratio = best["torch.save"] / best["acc.save"]  # throughput ratio
    load_ratio = best["acc.load"] / best["by hand"]  # time ratio
    print_table(
        f"Checkpoint of {'a small GPT-2' if args.small else 'GPT-2 small'} + AdamW "
        f"({size / 2**20:,.0f} MiB), CPU, best of {args.rounds}",
        ["operation", "accel", "peer", "ratio", "goal", "verdict"],
        [
            [
                "save",
                fmt_ms(best["acc.save"]),
                fmt_ms(best["torch.save"]),
                fmt_ratio(save_ratio) + " throughput",
                ">= 0.9×",
                verdict(save_ratio >= 0.9),
            ],
            [
                "load + restore",
                fmt_ms(best["acc.load"]),
                fmt_ms(best["by hand"]),
                fmt_ratio(load_ratio) + " time",
                "<= 1.1×",
                verdict(load_ratio <= 1.1),
            ],
        ],
        [
            "peer for save: bare torch.save of the same dict to the same disk (no fsync)",
            "peer for load: torch.load + load_state_dict of model and optimizer",
        ],
    )


if __name__ == "__main__":
    main()
