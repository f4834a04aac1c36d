"""acc.save against a bare torch.save of the same dict to the same disk, and acc.load +
restore against torch.load + load_state_dict, on a GPT-2 small state (model + AdamW).

Goals: save at >= 0.9x torch.save's throughput (the atomic write's fsyncs and rename
are the price), load + restore at <= 1.1x the time of doing it by hand. Each candidate
is timed in turn, several rounds, best sample kept (see _harness). ``--small`` uses a
4-layer, 256-wide GPT-2 for a quick look.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _harness import fmt_ms, fmt_ratio, print_table, timed, verdict
from bench_models import GPT2_SMALL, GPT2Config, gpt2_style

import accel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = GPT2Config(vocab=8192, width=256, layers=4, heads=4) if args.small else GPT2_SMALL
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
