"""acc.load + restore on XLA:CPU against a restore written by hand with torch_xla, on a
GPT-2 small state (model + AdamW, 1.4 GiB).

By hand: ``torch.load(map_location="cpu")``, ``model.load_state_dict``,
``optimizer.load_state_dict`` (which puts the AdamW moments on the parameters'
device), one ``torch_xla.sync()``. Both end with ``xm.wait_device_ops()``. Goal: accel
within 1.2x of the time by hand. The two are timed in one process, interleaved, the
order swapped every round, into the same model and optimizer (each restore replaces
every tensor the previous one left), and the median reported with the load average
(the machine is shared). Each candidate's uploads and compilations are counted with
torch_xla's metrics in a round of its own. ``--fresh`` times each restore in a process
of its own instead, as a resumed run does it (fresh memory: its page faults are part
of every copy), the two still interleaved.

    PJRT_DEVICE=CPU python benchmarks/bench_restore_xla.py [--small] [--rounds N] [--fresh]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
from _harness import fmt_ms, fmt_ratio, print_table, timed, verdict
from bench_models import GPT2_SMALL, GPT2Config, gpt2_style

import accel

SMALL = GPT2Config(vocab=8192, width=256, layers=4, heads=4)

#: One restore in a fresh process (``--fresh``): the seconds of the restore alone.
FRESH = """
import os, sys, time
sys.path[:0] = os.environ["BENCH_PATH"].split(os.pathsep)
import torch, torch_xla, torch_xla.core.xla_model as xm, accel
from bench_models import GPT2_SMALL, GPT2Config, gpt2_style
small = GPT2Config(vocab=8192, width=256, layers=4, heads=4)
acc = accel.get_accelerator("tpu")
model = acc.model_to_device(gpt2_style(small if sys.argv[2] == "1" else GPT2_SMALL, device="cpu"))
optimizer = torch.optim.AdamW(model.parameters())
xm.wait_device_ops()
start = time.perf_counter()
if sys.argv[1] == "acc.load":
    acc.load(os.environ["BENCH_CHECKPOINT"], {"model": model, "optimizer": optimizer})
else:
    stored = torch.load(os.environ["BENCH_CHECKPOINT"], map_location="cpu", weights_only=True)
    model.load_state_dict(stored["model"])
    optimizer.load_state_dict(stored["optimizer"])
    torch_xla.sync()
xm.wait_device_ops()
print("seconds", time.perf_counter() - start)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    config = SMALL if args.small else GPT2_SMALL

    source = gpt2_style(config, device="cpu")
    source_optimizer = torch.optim.AdamW(source.parameters())
    source(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    source_optimizer.step()  # AdamW's moments exist: the state is model + 2x parameters
    directory = Path(tempfile.mkdtemp(dir="."))
    path = directory / "restore.pt"
    accel.get_accelerator("cpu").save({"model": source, "optimizer": source_optimizer}, path)
    expected = source.h[0].mlp.c_fc.weight.detach().clone()
    expected_moment = source_optimizer.state[source.h[0].mlp.c_fc.weight]["exp_avg"].clone()
    del source, source_optimizer
    if args.fresh:
        fresh(path, args)
        return

    acc = accel.get_accelerator("tpu")
    model = acc.model_to_device(gpt2_style(config, device="cpu"))
    optimizer = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optimizer": optimizer}

    def with_accel() -> None:
        acc.load(path, state)
        xm.wait_device_ops()

    def by_hand() -> None:
        stored = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(stored["model"])
        optimizer.load_state_dict(stored["optimizer"])
        torch_xla.sync()
        xm.wait_device_ops()

    candidates: dict[str, Callable[[], None]] = {"acc.load": with_accel, "by hand": by_hand}
    counts = {}
    for name, restore in candidates.items():  # also the warm-up: the file in the page cache
        met.clear_all()
        restore()
        uploads = met.metric_data("TransferToDeviceTime")
        compiled = met.metric_data("CompileTime")
        counts[name] = (uploads[0] if uploads else 0, compiled[0] if compiled else 0)
        weight = model.h[0].mlp.c_fc.weight
        assert torch.equal(weight.detach().cpu(), expected), name
        assert torch.equal(optimizer.state[weight]["exp_avg"].cpu(), expected_moment), name
        assert model.lm_head.weight is model.wte.weight, name

    samples: dict[str, list[float]] = {name: [] for name in candidates}
    loads = []
    for round_ in range(args.rounds):
        order = list(candidates) if round_ % 2 else list(candidates)[::-1]
        for name in order:
            with timed() as clock:
                candidates[name]()
            samples[name].append(clock.seconds)
        loads.append(os.getloadavg()[0])
    path.unlink()
    directory.rmdir()

    median = {name: statistics.median(values) for name, values in samples.items()}
    ratio = median["acc.load"] / median["by hand"]
    size = "a small GPT-2" if args.small else "GPT-2 small"
    print_table(
        f"Restore of {size} + AdamW on XLA:CPU, median of {args.rounds} interleaved rounds, "
        f"load average {min(loads):.1f}-{max(loads):.1f}",
        ["restore", "time", "uploads", "compilations", "ratio", "goal", "verdict"],
        [
            [
                "acc.load(path, state)",
                fmt_ms(median["acc.load"]),
                counts["acc.load"][0],
                counts["acc.load"][1],
                fmt_ratio(ratio) + " time",
                "<= 1.2×",
                verdict(ratio <= 1.2),
            ],
            [
                "by hand (torch.load, load_state_dict, sync)",
                fmt_ms(median["by hand"]),
                counts["by hand"][0],
                counts["by hand"][1],
                "",
                "",
                "",
            ],
        ],
        [
            "uploads: torch_xla's TransferToDeviceTime samples (one per host-to-device "
            "transfer call); compilations: CompileTime samples",
            "samples (s): "
            + "; ".join(
                f"{name} " + " ".join(f"{v:.2f}" for v in values)
                for name, values in samples.items()
            ),
        ],
    )


def fresh(path: Path, args: argparse.Namespace) -> None:
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "BENCH_PATH": os.pathsep.join([str(here), str(here.parent)]),
        "BENCH_CHECKPOINT": str(path),
    }
    samples: dict[str, list[float]] = {"acc.load": [], "by hand": []}
    loads = []
    for round_ in range(args.rounds):
        order = list(samples) if round_ % 2 else list(samples)[::-1]
        for name in order:
            done = subprocess.run(
                [sys.executable, "-c", FRESH, name, "1" if args.small else "0"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            samples[name].append(float(done.stdout.split()[-1]))
        loads.append(os.getloadavg()[0])
    path.unlink()
    path.parent.rmdir()
    median = {name: statistics.median(values) for name, values in samples.items()}
    ratio = median["acc.load"] / median["by hand"]
    size = "a small GPT-2" if args.small else "GPT-2 small"
    print_table(
        f"Restore of {size} + AdamW on XLA:CPU, each in a fresh process, median of "
        f"{args.rounds} interleaved rounds, load average {min(loads):.1f}-{max(loads):.1f}",
        ["restore", "time", "ratio", "goal", "verdict"],
        [
            [
                "acc.load(path, state)",
                fmt_ms(median["acc.load"]),
                fmt_ratio(ratio) + " time",
                "<= 1.2×",
                verdict(ratio <= 1.2),
            ],
            ["by hand (torch.load, load_state_dict, sync)", fmt_ms(median["by hand"]), "", "", ""],
        ],
        [
            "samples (s): "
            + "; ".join(
                f"{name} " + " ".join(f"{v:.2f}" for v in values)
                for name, values in samples.items()
            ),
        ],
    )


if __name__ == "__main__":
    main()
