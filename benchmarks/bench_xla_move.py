"""Moving a tied GPT-2-small model to XLA:CPU: accel against a bare ``.to()`` + re-tie.

Runs in the XLA test environment (torch 2.9.1 + torch_xla 2.9.0) with
``PJRT_DEVICE=CPU``. Every sample moves a fresh deep copy of one CPU model (the copy
is not timed) and ends only when the device holds the data: ``torch_xla.sync()``,
``xm.wait_device_ops()`` and one value fetched back from the last parameter. The
sides alternate their order from round to round.

Run through ``bash benchmarks/run``; alone: ``PJRT_DEVICE=CPU python
benchmarks/bench_xla_move.py``.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import gc
import os
import resource
import statistics
from collections.abc import Callable

# Before torch_xla is imported: it picks its PJRT device once, at import.
os.environ.setdefault("PJRT_DEVICE", "CPU")

import bench_models as models
import torch
import torch_xla
import torch_xla.core.xla_model as xm
from _harness import (
    compare_per_call,
    environment_line,
    fmt_ms,
    fmt_ratio,
    print_table,
    timed,
    verdict,
)

import accel
from accel.tying import TyingSnapshot
from accel.tying._capture import RestorePoint

ROUNDS = int(os.environ.get("BENCH_XLA_ROUNDS", "9"))
GOAL_RATIO = 1.05


def settle(model: models.GPT2LM) -> None:
    """Return only once the device really holds the moved parameters."""
    torch_xla.sync()
    xm.wait_device_ops()
    model.h[-1].mlp.c_proj.bias[:1].cpu()


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def release_free_memory() -> None:
    """Give freed heap memory back to the OS, so every sample starts alike."""
    _libc.malloc_trim(0)


def main() -> None:
    print(environment_line(torch=torch.__version__, torch_xla=torch_xla.__version__))
    acc = accel.get_accelerator("tpu")
    device = acc.device
    torch.manual_seed(0)
    template = models.gpt2_style(models.GPT2_SMALL, device="cpu")
    parameters = models.unique_parameter_count(template)

    def bare(model: models.GPT2LM) -> models.GPT2LM:
        model.to(device)
        model.lm_head.weight = model.wte.weight
        return model

    def with_accel(model: models.GPT2LM) -> models.GPT2LM:
        return acc.model_to_device(model)

    # Two diagnostics, not candidates. The first holds the CPU parameters until the
    # move is over, as accel's restore point does; the second also moves the tied
    # tensor once (its second slot emptied before `.to()`), which accel could do
    # since it knows the ties before the move.
    def bare_holding_originals(model: models.GPT2LM) -> models.GPT2LM:
        originals = [(p, p.data) for p in model.parameters()]
        bare(model)
        del originals
        return model

    def holding_originals_tied_once(model: models.GPT2LM) -> models.GPT2LM:
        originals = [(p, p.data) for p in model.parameters()]
        model.lm_head._parameters["weight"] = None
        bare(model)
        del originals
        return model

    sides: dict[str, Callable[[models.GPT2LM], models.GPT2LM]] = {
        "bare .to() + manual re-tie": bare,
        "accel model_to_device": with_accel,
        "(bare, CPU parameters held to the end)": bare_holding_originals,
        "(… and the tied weight moved once)": holding_originals_tied_once,
    }
    samples: dict[str, list[float]] = {name: [] for name in sides}
    faults: dict[str, list[int]] = {name: [] for name in sides}
    for round_number in range(ROUNDS + 1):  # round 0 warms up the runtime
        order = list(sides.items())
        if round_number % 2:
            order.reverse()
        for name, move in order:
            model = copy.deepcopy(template)
            gc.collect()
            release_free_memory()
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            with timed() as clock:
                moved = move(model)
                settle(moved)
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
            assert moved.lm_head.weight is moved.wte.weight, name
            assert moved.wte.weight.device.type == "xla", name
            if round_number:
                samples[name].append(clock.seconds)
                faults[name].append(faulted)
            del model, moved
            gc.collect()

    bare_name, accel_name = "bare .to() + manual re-tie", "accel model_to_device"
    best = {name: min(values) for name, values in samples.items()}
    median = {name: statistics.median(values) for name, values in samples.items()}
    # Each round runs every side within a few seconds: the ratio within a round is
    # immune to the machine's load drifting between rounds.
    paired = {
        name: statistics.median(
            side / bare for side, bare in zip(values, samples[bare_name], strict=True)
        )
        for name, values in samples.items()
    }
    ratio = paired[accel_name]
    rows = []
    for name in sides:
        rows.append(
            [
                name,
                fmt_ms(best[name]),
                fmt_ms(median[name]),
                fmt_ratio(best[name] / best[bare_name]),
                fmt_ratio(paired[name]),
                f"{statistics.median(faults[name]) * resource.getpagesize() / 2**20:,.0f} MiB",
                verdict(ratio <= GOAL_RATIO) if name == accel_name else "",
            ]
        )
    print_table(
        f"GPT-2 small ({models.millions(parameters)} parameters, tied embedding) to "
        f"{device} (XLA:CPU), {ROUNDS} rounds",
        [
            "move",
            "best",
            "median",
            "÷ bare (best)",
            "÷ bare (median of rounds)",
            "memory faulted in",
            f"goal ≤{GOAL_RATIO}×",
        ],
        rows,
        [
            "Each sample: move a fresh deep copy of one CPU model, then sync, wait for "
            "device ops and fetch a value back. The goal is judged on the median over "
            "rounds of each round's ratio to the bare move (both ran within seconds of "
            "each other).",
            "memory faulted in: median minor page faults of a sample × the page size, "
            "i.e. fresh memory the process had to map during the move.",
            "Before each sample the heap's free memory goes back to the OS "
            "(`malloc_trim`), so no side inherits another's freed pages.",
            "The rows in parentheses are diagnostics, not candidates: a bare move that "
            "keeps the CPU parameters alive until it ends (as accel's restore point "
            "does), and the same with the tied slot emptied before `.to()` so the "
            "shared weight crosses to the device once instead of twice.",
        ],
    )

    # accel's own work in a move, with no device transfer: the restore point, the tie
    # snapshot, the re-tie and the check, on the CPU model.
    def accel_bookkeeping() -> None:
        RestorePoint(template)
        snapshot = TyingSnapshot.capture(template)
        snapshot.retie()
        snapshot.check(template)

    own = compare_per_call({"bookkeeping": accel_bookkeeping})["bookkeeping"]
    print_table(
        "accel's bookkeeping in that move (no transfer)",
        ["work", "time", "share of the bare move"],
        [
            [
                "RestorePoint + TyingSnapshot.capture + retie + check",
                fmt_ms(own),
                f"{own / best[bare_name]:.2%}",
            ]
        ],
    )


if __name__ == "__main__":
    main()
