"""Large models (issue 45, point 7): what ``acc.materialize`` and ``parallelize_tied`` cost,
each beside the same work done with torch alone.

1. **Peak host memory** of ``accel.get_accelerator("cpu").materialize(model)`` on a
   GPT-2-small-shaped model built on ``meta`` (``bench_models.GPT2_SMALL``: vocabulary
   50257, width 768, 12 layers, 12 heads, embedding tied to the head, 124M parameters):
   at most 1.1x the model's final size (its distinct tensors' bytes), so no full CPU
   copy. A fresh child process per measurement: the peak resident set (``ru_maxrss``,
   its high-water mark reset through ``/proc/self/clear_refs`` after the imports and
   the build on ``meta``) minus the resident set then; ``tracemalloc`` would not see
   torch's allocations. torch's ``to_empty`` + the same init is shown for reference: it
   unties, so its final size is larger by the embedding.
2. **A tensor-parallel training step** on 2 gloo ranks (torchrun, one thread each) of
   ``examples/large_models/train_2d.py``'s ``TiedLM``, wider, with its Colwise/Rowwise
   ``PLAN``: ``parallelize_tied`` against ``parallelize_module`` with the tie restored
   by hand (``model.head.weight = model.embed.weight``), at most 1.05x. Both models in
   one launch; samples of several steps alternate after a warm-up; medians.
3. **Materialize time** against a bare ``to_empty(device="cpu")`` plus the same init
   (each module's ``reset_parameters()`` in module order), at most 1.1x: medians of
   goal 1's alternating fresh processes (materializing happens once per process, page
   faults included).

A last table says where materialize's time and memory go: its steps timed apart and
the full-size stand-ins ``accel/training/_filling.py`` draws through, in one more child
whose functions are wrapped.

Run through ``bash benchmarks/run large-models``; alone (main test environment, a few
minutes on 2 cores): ``python benchmarks/bench_large_models.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_models as models
import torch
from _harness import environment_line, fmt_ms, fmt_ratio, print_table, verdict
from torch import nn

import accel

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "examples" / "large_models"

#: Goal 1: accel's peak above the baseline, against the model's final size.
MEMORY_GOAL = 1.1
#: Goal 2: a tensor-parallel step through accel against the tie restored by hand.
TP_STEP_GOAL = 1.05
#: Goal 3: materialize against to_empty + the same init.
MATERIALIZE_TIME_GOAL = 1.1

#: The tensor-parallel model: the example's TiedLM, wider, and its batches.
TP_SHAPE = {"vocab": 4096, "width": 256, "depth": 4}
TP_BATCH, TP_LENGTH = 8, 32
RESULT = "RESULT "
MiB = 2**20


# -- goals 1 and 3: one materialization per fresh process ------------------------------


def _rss_now() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _reset_peak() -> bool:
    """Reset this process's high-water mark of resident memory (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def _reset_every_module(model: nn.Module) -> None:
    """The init accel runs by default, by hand: each module's reset_parameters()."""
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


def _distinct_bytes(model: nn.Module) -> int:
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _profile_hooks() -> dict[str, Any]:
    """Wrap materialize's steps (in this child process only) to time them and count
    the full-size stand-ins the default init draws through."""
    from accel.training import _filling, _materialize
    from accel.tying import TyingSnapshot, _capture

    found: dict[str, Any] = {"stand_ins": [], "steps": {}}

    def timed_as(label: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = found["steps"]
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        return wrapper

    full_stand_in = _filling._full_stand_in

    def counted_stand_in(tensor: torch.Tensor) -> torch.Tensor:
        made = full_stand_in(tensor)
        found["stand_ins"].append([list(made.shape), made.numel() * made.element_size()])
        return made

    _filling._full_stand_in = counted_stand_in
    for owner, attribute, label in [
        (_capture, "RestorePoint", "the capture (RestorePoint)"),
        (TyingSnapshot, "_of_slots", "the groups, from the capture"),
        (_materialize, "_allocated", "allocation: empty_like per tensor"),
        (TyingSnapshot, "_finished", "re-tie (TyingSnapshot._finished)"),
        (_materialize, "reset_every_module", "the init: reset_every_module (stand-ins included)"),
        (_filling, "_reset_through", "reset through a stand-in (_filling._reset_through)"),
        (TyingSnapshot, "check", "the one check (TyingSnapshot.check)"),
        (_materialize, "_check_written", "the written check (_check_written)"),
    ]:
        setattr(owner, attribute, timed_as(label, getattr(owner, attribute)))
    return found


def materialize_child(variant: str) -> None:
    """One measurement, printed as a JSON line: ``accel``, ``torch`` or ``profile``."""
    model = models.gpt2_style(models.GPT2_SMALL, device="meta")
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    found = _profile_hooks() if variant == "profile" else None
    reset = _reset_peak()
    baseline = _rss_now() if reset else max(_rss_now(), _peak_rss())
    start, cpu_start = time.perf_counter(), time.process_time()
    if variant == "torch":
        model.to_empty(device="cpu")
        _reset_every_module(model)
    else:
        model = cpu.materialize(model)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak = _peak_rss()
    result = {
        "variant": variant,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_above_baseline": peak - baseline,
        "baseline": baseline,
        "final_bytes": _distinct_bytes(model),
        "tied": model.lm_head.weight is model.wte.weight,
        "peak_reset": reset,
        "parameters": len({id(p) for p in model.parameters()}),
    }
    if found is not None:
        result.update(found)
    print(RESULT + json.dumps(result), flush=True)


def _result(command: list[str], **env: str) -> dict[str, Any]:
    """Run ``command`` (this script's children, or torchrun) and read its result line."""
    env = {**os.environ, "PYTHONPATH": _pythonpath(), **env}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1][len(RESULT) :])  # type: ignore[no-any-return]


def _child(*args: str) -> dict[str, Any]:
    return _result([sys.executable, __file__, *args])


def _pythonpath() -> str:
    parts = [str(HERE), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


LABELS = {"accel": "acc.materialize(model)", "torch": "to_empty(device='cpu') + reset_parameters"}


def _mib(*sizes: float) -> list[str]:
    return [f"{size / MiB:,.1f} MiB" for size in sizes]


def _time_row(
    label: str, samples: list[float], ratio: float, cpu: float, cpu_ratio: float
) -> tuple[str, ...]:
    """Median wall time, its spread and ratio, then median CPU time and its ratio."""
    spread = f"{fmt_ms(min(samples))} - {fmt_ms(max(samples))}"
    median = fmt_ms(statistics.median(samples))
    return (label, median, spread, fmt_ratio(ratio), fmt_ms(cpu), fmt_ratio(cpu_ratio))


def materialize_tables(repeats: int) -> tuple[float, float]:
    runs: dict[str, list[dict[str, Any]]] = {"accel": [], "torch": []}
    for repeat in range(repeats):
        order = ("accel", "torch") if repeat % 2 == 0 else ("torch", "accel")
        for variant in order:
            runs[variant].append(_child("--materialize-child", variant))
    profile = _child("--materialize-child", "profile")

    def median(variant: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[variant])

    first = {v: runs[v][0] for v in runs}  # sizes and ties: the same in every run
    peaks = {v: median(v, "peak_above_baseline") for v in runs}
    ratios = {v: peaks[v] / first[v]["final_bytes"] for v in runs}
    embedding = models.GPT2_SMALL.vocab * models.GPT2_SMALL.width * 4
    extra = (first["torch"]["final_bytes"] - first["accel"]["final_bytes"]) / MiB
    print_table(
        f"Peak host memory of materializing GPT-2 small on the CPU (fresh process each, "
        f"median of {repeats})",
        ["how", "tied after", "final size", "peak above baseline", "peak / final size"],
        [
            (LABELS[v], first[v]["tied"], *_mib(first[v]["final_bytes"], peaks[v]), fmt_ratio(r))
            for v, r in ratios.items()
        ],
        [
            f"goal: accel's peak ≤ {MEMORY_GOAL}× the model's final size: "
            f"{fmt_ratio(ratios['accel'])}, {verdict(ratios['accel'] <= MEMORY_GOAL)}",
            f"to_empty unties the model: its final size is larger by the embedding "
            f"({extra:,.1f} MiB; vocab × width × 4 bytes = {embedding / MiB:,.1f} MiB), "
            f"{first['torch']['parameters']} Parameters against accel's "
            f"{first['accel']['parameters']}",
            f"accel's peak against to_empty's, in bytes: {peaks['accel'] / peaks['torch']:.2f}×",
            f"baseline (after the imports and the build on meta): "
            f"{first['accel']['baseline'] / MiB:,.0f} MiB resident; peak reset through "
            f"/proc/self/clear_refs: {first['accel']['peak_reset']}",
        ],
    )
    seconds = {v: [run["seconds"] for run in runs[v]] for v in runs}
    times = {v: median(v, "seconds") for v in runs}
    cpu = {v: median(v, "cpu_seconds") for v in runs}
    time_ratio, cpu_ratio = times["accel"] / times["torch"], cpu["accel"] / cpu["torch"]
    print_table(
        f"Materialize time, GPT-2 small on the CPU (fresh process each, median of "
        f"{repeats}, alternating)",
        ["how", "wall, median", "fastest - slowest", "ratio", "CPU time, median", "ratio"],
        [
            _time_row(LABELS[v], seconds[v], t / times["torch"], cpu[v], cpu[v] / cpu["torch"])
            for v, t in times.items()
        ],
        [
            f"goal ≤ {MATERIALIZE_TIME_GOAL}× (wall): {fmt_ratio(time_ratio)}, "
            f"{verdict(time_ratio <= MATERIALIZE_TIME_GOAL)}; in CPU time (the process's, "
            f"which other processes on the machine inflate less): {fmt_ratio(cpu_ratio)}, "
            f"{verdict(cpu_ratio <= MATERIALIZE_TIME_GOAL)}",
            f"torch draws the head's {embedding // 4 / 1e6:.1f}M values into its own "
            f"(untied) weight; accel draws nothing for it, the head being the last "
            f"module that writes (the stand-ins drawn are counted below)",
        ],
    )
    stand_ins = profile["stand_ins"]
    rows = [(label, fmt_ms(s)) for label, s in profile["steps"].items()]
    rows.append(("materialize, whole (this run)", fmt_ms(profile["seconds"])))
    print_table(
        "Where acc.materialize's time and memory go (one run, its steps wrapped)",
        ["step", "time"],
        rows,
        [
            f"stand-ins drawn at full size: {len(stand_ins)} "
            + ", ".join(f"{shape} ({size / MiB:,.1f} MiB)" for shape, size in stand_ins),
            f"peak above baseline in this run: {profile['peak_above_baseline'] / MiB:,.1f} MiB; "
            f"final size {profile['final_bytes'] / MiB:,.1f} MiB; the difference, "
            f"{(profile['peak_above_baseline'] - profile['final_bytes']) / MiB:,.1f} MiB, "
            f"against the stand-ins' {sum(size for _, size in stand_ins) / MiB:,.1f} MiB",
        ],
    )
    return ratios["accel"], time_ratio


# -- goal 2: a tensor-parallel step, two gloo ranks -------------------------------------


def tp_worker(steps: int, repeats: int, warmup: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    import accel.distributed

    sys.path.insert(0, str(EXAMPLE))
    from train_2d import PLAN, TiedLM

    torch.set_num_threads(1)
    context = accel.distributed.init_process_group("cpu")
    mesh = init_device_mesh("cpu", (context.world_size,))

    def build() -> TiedLM:
        torch.manual_seed(0)
        return TiedLM(**TP_SHAPE)

    through_accel = accel.distributed.parallelize_tied(build(), PLAN, mesh=mesh)
    by_hand = parallelize_module(build(), mesh, PLAN)
    by_hand.head.weight = by_hand.embed.weight  # the tie restored by hand
    again = parallelize_module(build(), mesh, PLAN)  # the same again: the noise floor
    again.head.weight = again.embed.weight
    variants = {"accel": through_accel, "by hand": by_hand, "by hand, again": again}
    for model in variants.values():
        assert model.head.weight is model.embed.weight
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in variants.items()}
    generator = torch.Generator().manual_seed(1234)
    total = warmup + steps * repeats
    tokens = [
        torch.randint(0, TP_SHAPE["vocab"], (TP_BATCH, TP_LENGTH + 1), generator=generator)
        for _ in range(total)
    ]
    taken = dict.fromkeys(variants, 0)
    losses: dict[str, list[float]] = {k: [] for k in variants}

    def step(name: str) -> None:
        model, optimizer = variants[name], optimizers[name]
        batch = tokens[taken[name]]
        taken[name] += 1
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses[name].append(loss.item())

    for _ in range(warmup):
        for name in variants:
            step(name)
    samples: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}  # both ranks' CPU time
    names = list(variants)
    for repeat in range(repeats):
        for name in names[repeat % 3 :] + names[: repeat % 3]:  # each first in turn
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(steps):
                step(name)
            spent = torch.tensor([time.process_time() - cpu_start])
            dist.all_reduce(spent)
            samples[name].append((time.perf_counter() - start) / steps)
            cpu[name].append(spent.item() / steps)
    for model in variants.values():
        assert model.head.weight is model.embed.weight
    if context.rank == 0:
        gap = max(abs(a - b) for a, b in zip(losses["accel"], losses["by hand"], strict=True))
        parameters = sum(p.numel() for p in through_accel.parameters())  # global shapes
        report = {"samples": samples, "cpu": cpu, "loss_gap": gap, "parameters": parameters}
        print(RESULT + json.dumps(report), flush=True)
    accel.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tp_table(steps: int, repeats: int, warmup: int) -> float:
    env = {"OMP_NUM_THREADS": "1"}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    launch = "-m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port"
    worker = f"--tp-worker --steps={steps} --tp-repeats={repeats} --warmup={warmup}"
    command = [sys.executable, *launch.split(), str(_free_port()), __file__, *worker.split()]
    report = _result(command, **env)
    medians = {k: statistics.median(v) for k, v in report["samples"].items()}
    cpu = {k: statistics.median(v) for k, v in report["cpu"].items()}
    ratio, cpu_ratio = medians["accel"] / medians["by hand"], cpu["accel"] / cpu["by hand"]
    cpu_ratios = [c / cpu["by hand"] for c in cpu.values()]
    shape = ", ".join(f"{k} {v}" for k, v in TP_SHAPE.items())
    print_table(
        f"A tensor-parallel training step, 2 gloo ranks (TiedLM: {shape}; batch "
        f"{TP_BATCH}×{TP_LENGTH}; AdamW; median of {repeats} samples of {steps} steps, "
        f"alternating, after {warmup} warm-up steps each)",
        ["parallelized", "wall per step", "fastest - slowest", "ratio", "CPU per step", "ratio"],
        [
            _time_row(name, report["samples"][name], t / medians["by hand"], cpu[name], c)
            for (name, t), c in zip(medians.items(), cpu_ratios, strict=True)
        ],
        [
            "accel: parallelize_tied(model, PLAN); by hand: parallelize_module(model, mesh, "
            "PLAN) then model.head.weight = model.embed.weight",
            "by hand, again: a second model made by hand, timed like the others; its ratio "
            "is the noise of this machine. CPU per step: both ranks' CPU time together",
            f"goal ≤ {TP_STEP_GOAL}× (wall): {fmt_ratio(ratio)}, {verdict(ratio <= TP_STEP_GOAL)}"
            f"; in CPU time: {fmt_ratio(cpu_ratio)}, {verdict(cpu_ratio <= TP_STEP_GOAL)}",
            f"the two trained the same: largest loss difference over every step "
            f"{report['loss_gap']:.1e}; {report['parameters']:,} parameters (half of each "
            f"sharded one on each rank)",
        ],
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--materialize-child", choices=("accel", "torch", "profile"))
    parser.add_argument("--tp-worker", action="store_true")
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes per variant")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed TP sample")
    parser.add_argument("--tp-repeats", type=int, default=11, help="timed TP samples per variant")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if args.materialize_child:
        return materialize_child(args.materialize_child)
    if args.tp_worker:
        return tp_worker(args.steps, args.tp_repeats, args.warmup)
    print(environment_line(torch=torch.__version__, accel=accel.__version__))
    memory_ratio, time_ratio = materialize_tables(args.repeats)
    tp_ratio = tp_table(args.steps, args.tp_repeats, args.warmup)
    goals = [
        (f"materialize's peak memory ≤ {MEMORY_GOAL}× the final size", memory_ratio, MEMORY_GOAL),
        (f"a TP step ≤ {TP_STEP_GOAL}× the tie restored by hand", tp_ratio, TP_STEP_GOAL),
        (
            f"materialize ≤ {MATERIALIZE_TIME_GOAL}× to_empty + init",
            time_ratio,
            MATERIALIZE_TIME_GOAL,
        ),
    ]
    print_table(
        "Large-model goals (issue 45, point 7)",
        ["goal", "ratio", "verdict"],
        [(goal, fmt_ratio(ratio), verdict(ratio <= bound)) for goal, ratio, bound in goals],
    )
    return None


if __name__ == "__main__":
    main()
