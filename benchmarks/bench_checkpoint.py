"""acc.save against a bare torch.save of the same dict to the same disk, and acc.load +
restore against torch.load + load_state_dict, on a GPT-2 small state (model + AdamW).

Goals: save at >= 0.9x torch.save's throughput, compared with a bare torch.save and
with one followed by the fsyncs that make it durable (the inherent cost of a durable
write); load + restore at <= 1.1x the time of doing it by hand. The candidates are
timed interleaved, the order rotated every round, each sample after an os.sync(), and
the median reported with the load average (the machine is shared). ``--small`` uses a
4-layer, 256-wide GPT-2 for a quick look. ``--xla-resume`` (in the XLA environment,
``PJRT_DEVICE=CPU``) reports the time to resume on XLA:CPU: from starting a process to
the end of the first training step after ``acc.load``.
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def _fsync(path: Path) -> None:
    """What a durable bare torch.save needs after it: the file and its directory."""
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY)):
        descriptor = os.open(target, flags)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
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
    state = {"model": model, "optimizer": optimizer}

    def bare_durable() -> None:
        torch.save(plain, directory / "durable.pt")
        _fsync(directory / "durable.pt")

    def by_hand() -> None:
        stored = torch.load(directory / "bare.pt", weights_only=True)
        model.load_state_dict(stored["model"])
        optimizer.load_state_dict(stored["optimizer"])

    candidates = {
        "torch.save": lambda: torch.save(plain, directory / "bare.pt"),
        "torch.save + fsync": bare_durable,
        "acc.save": lambda: acc.save(state, directory / "atomic.pt"),
        "by hand": by_hand,
        "acc.load": lambda: acc.load(directory / "atomic.pt", state),
    }
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    loads = []
    for round_ in range(args.rounds + 1):  # round 0 writes the files and warms up
        # Interleaved, the order rotated each round (both loads after the saves that
        # wrote their files), so that no candidate always follows the same neighbour.
        shift = round_ % 3
        order = names[shift:3] + names[:shift] + names[3:][:: 1 if round_ % 2 else -1]
        for name in order:
            os.sync()  # no dirty pages of the previous sample for this one to wait on
            with timed() as clock:
                candidates[name]()
            if round_:
                samples[name].append(clock.seconds)
        loads.append(os.getloadavg()[0])
    size = (directory / "atomic.pt").stat().st_size
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    median = {name: statistics.median(values) for name, values in samples.items()}
    vs_bare = median["torch.save"] / median["acc.save"]  # throughput ratios
    vs_durable = median["torch.save + fsync"] / median["acc.save"]
    load_ratio = median["acc.load"] / median["by hand"]  # time ratio
    print_table(
        f"Checkpoint of {'a small GPT-2' if args.small else 'GPT-2 small'} + AdamW "
        f"({size / 2**20:,.0f} MiB), CPU, median of {args.rounds} interleaved rounds, "
        f"load average {min(loads):.1f}-{max(loads):.1f}",
        ["operation", "accel", "peer", "ratio", "goal", "verdict"],
        [
            [
                "save vs torch.save",
                fmt_ms(median["acc.save"]),
                fmt_ms(median["torch.save"]),
                fmt_ratio(vs_bare) + " throughput",
                ">= 0.9×",
                verdict(vs_bare >= 0.9),
            ],
            [
                "save vs torch.save + fsync",
                fmt_ms(median["acc.save"]),
                fmt_ms(median["torch.save + fsync"]),
                fmt_ratio(vs_durable) + " throughput",
                ">= 0.9×",
                verdict(vs_durable >= 0.9),
            ],
            [
                "load + restore",
                fmt_ms(median["acc.load"]),
                fmt_ms(median["by hand"]),
                fmt_ratio(load_ratio) + " time",
                "<= 1.1×",
                verdict(load_ratio <= 1.1),
            ],
        ],
        [
            "peers for save: torch.save of the same dict to the same disk, bare (the data "
            "may still be in the page cache) and followed by an fsync of the file and its "
            "directory (durable, like acc.save)",
            "peer for load: torch.load + load_state_dict of model and optimizer",
            "each sample starts after os.sync(), so no sample waits on an earlier one's "
            "writeback; samples (s): "
            + "; ".join(
                f"{name} " + " ".join(f"{v:.2f}" for v in values)
                for name, values in samples.items()
            ),
        ],
    )


if __name__ == "__main__":
    main()
