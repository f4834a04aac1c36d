"""What a CPU move pays for being safe: the per-model lock and the restore point.

``acc.model_to_device(model, optimizer=...)`` on the ``cpu`` accelerator against a bare
``model.to("cpu")``, which for a model already on the CPU copies nothing: so the
difference is accel's whole fixed cost per move, the worst case for it (with an
optimizer to follow, the move takes its capture; without one, a model already in place
takes none). Beside them, the parts that cost is made of: taking the model's move lock,
the restore point (references, version counters, ``mark_moved``), and torch's rule
whether the move unties (``move_unties``: one cached answer per pair of device types, so
a CPU <-> CPU or CPU <-> CUDA move never enters tying code), and, with ``--before
FILE``, the restore point of an earlier ``accel/tying/_capture.py`` (``git show
REV:accel/tying/_capture.py > FILE``) for comparison.

Run through ``bash benchmarks/run move``; alone: ``python benchmarks/bench_move.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import bench_models as models
import torch
from _harness import compare_per_call, environment_line, fmt_ratio, fmt_us, print_table, verdict

import accel
from accel._core.moving import _move_lock, move_unties
from accel.tying._capture import RestorePoint

#: The lock may cost at most this much per move.
LOCK_GOAL_S = 1e-6
#: So may torch's rule once its answer for the pair of device types is cached.
UNTYING_CHECK_GOAL_S = 1e-6
RULE = "torch's rule, CPU -> CPU"


def _earlier_restore_point(path: str) -> type:
    spec = importlib.util.spec_from_file_location("earlier_capture", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    restore_point: type = module.RestorePoint
    return restore_point


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="an earlier accel/tying/_capture.py")
    args = parser.parse_args()
    print(environment_line(torch=torch.__version__, accel=accel.__version__))
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    config = models.GPT2Config(vocab=1000, positions=64, width=64, layers=12, heads=1)
    model = models.gpt2_style(config, device="cpu")
    slots = sum(len(m._parameters) + len(m._buffers) for m in model.modules())

    def lock_only() -> None:
        with _move_lock(model):
            pass

    def restore_point() -> None:
        RestorePoint(model).mark_moved()

    cpu_device = torch.device("cpu")
    samples = {"cpu": next(model.parameters())}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    candidates = {
        "bare model.to('cpu')": lambda: model.to("cpu"),
        "acc.model_to_device(model)": lambda: cpu.model_to_device(model),
        "acc.model_to_device(model, optimizer=...)": lambda: cpu.model_to_device(
            model, optimizer=optimizer
        ),
        "the move lock alone": lock_only,
        "the restore point alone": restore_point,
        RULE: lambda: move_unties(samples, cpu_device),
    }
    if args.before:
        earlier = _earlier_restore_point(args.before)
        candidates["the restore point, --before"] = lambda: earlier(model)
    times = compare_per_call(candidates)
    bare = times["bare model.to('cpu')"]
    rows = [(name, fmt_us(seconds), fmt_ratio(seconds / bare)) for name, seconds in times.items()]
    print_table(
        f"A CPU move of a GPT-2-style model already on the CPU ({slots} slots)",
        ["what", "per move", "vs bare .to()"],
        rows,
        [
            f"the lock: {fmt_us(times['the move lock alone'])} per move, goal "
            f"≤ {fmt_us(LOCK_GOAL_S)}: {verdict(times['the move lock alone'] <= LOCK_GOAL_S)}",
            f"torch's rule, CPU -> CPU: {fmt_us(times[RULE])} per move, goal "
            f"≤ {fmt_us(UNTYING_CHECK_GOAL_S)}: {verdict(times[RULE] <= UNTYING_CHECK_GOAL_S)}",
        ],
    )


if __name__ == "__main__":
    main()
