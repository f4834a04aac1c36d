"""What a CPU move pays for being safe: the per-model lock and the restore point.

``acc.model_to_device(model)`` on the ``cpu`` accelerator (the built-ins registered,
so the TPU plugin's tie guard's cheap checks run too) against a bare
``model.to("cpu")``, which for a model already on the CPU copies nothing: so the
difference is accel's whole fixed cost per move, the worst case for it. Beside them,
the two parts this cost is made of that run on every move: taking the model's move
lock, the restore point (references, version counters, ``mark_moved``), and the check
whether the move enters or leaves an untying accelerator's device type (a set read while
no handle of one exists; with one, the walk of the model it costs then), and, with
``--before FILE``, the restore point of an earlier ``accel/_core/transaction.py``
(``git show REV:accel/_core/transaction.py > FILE``) for comparison.

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
from accel._core.moving import _move_lock, _move_unties
from accel._core.transaction import RestorePoint

#: The lock may cost at most this much per move.
LOCK_GOAL_S = 1e-6
#: So may the untying check while no untying accelerator's handle exists (a CPU <->
#: CUDA move pays nothing: no walk of the model).
UNTYING_CHECK_GOAL_S = 1e-6


class _UntyingAccelerator:
    """An accelerator declaring ``unties_weights``: once its handle exists, the
    registry's moves look for tensors on its device type."""

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec("untying", unties_weights=True)]

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        return accel.Availability(True, auto=False)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        return torch.device("privateuseone", 0)


def _earlier_restore_point(path: str) -> type:
    spec = importlib.util.spec_from_file_location("earlier_transaction", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    restore_point: type = module.RestorePoint
    return restore_point


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="an earlier accel/_core/transaction.py")
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
    with_untying = accel.AcceleratorRegistry(entry_points=None)
    with_untying.register(_UntyingAccelerator())
    with_untying.get_accelerator("untying")  # its device type is learned
    learned = with_untying.get_accelerator("cpu")

    candidates = {
        "bare model.to('cpu')": lambda: model.to("cpu"),
        "acc.model_to_device(model)": lambda: cpu.model_to_device(model),
        "the move lock alone": lock_only,
        "the restore point alone": restore_point,
        "the untying check, none learned": lambda: _move_unties(
            cpu._hooks, cpu.spec, cpu_device, model
        ),
        "the untying check, one learned": lambda: _move_unties(
            learned._hooks, learned.spec, cpu_device, model
        ),
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
            f"the untying check with no untying handle: "
            f"{fmt_us(times['the untying check, none learned'])} per move, goal "
            f"≤ {fmt_us(UNTYING_CHECK_GOAL_S)}: "
            f"{verdict(times['the untying check, none learned'] <= UNTYING_CHECK_GOAL_S)}",
        ],
    )


if __name__ == "__main__":
    main()
