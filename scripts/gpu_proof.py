"""accel's ``cuda`` plugin on a real NVIDIA GPU: one summary line per check.

``bash scripts/gpu-proof`` builds the environment and runs this; alone, with accel and a
CUDA build of torch importable: ``python scripts/gpu_proof.py``. Each check prints
``PASS name: detail`` or ``FAIL name: detail``:

1. ``probe``: listing and selecting ``cuda`` in a fresh interpreter leaves CUDA
   uninitialised, and a process forked after it still uses CUDA.
2. ``conformance``: ``accel conformance cuda`` (on one GPU the two-rank NCCL promises
   are declared out: two ranks need a GPU each).
3. ``tied-model``: nanoGPT's model (``wte`` tied to ``lm_head``) to the GPU and back
   through accel, its optimizer following: the same Parameter shared, values equal.
4. ``pinned-batches``: pinned host batches through ``batch_to_device`` and
   ``device_loader`` arrive on the GPU with equal values.
5. ``nanogpt-step``: nanoGPT's step (bf16 autocast, clipping, fused AdamW) through accel
   and written by hand with plain torch: equal losses, and the time ratio accel / hand.
6. ``save-resume``: k steps, ``acc.save``, a new process loads it (``acc.load``) and goes on;
   its parameters equal an uninterrupted run's.

Exit status: 0 every check passed, 1 one failed, 2 no CUDA device (said on one line
starting ``no CUDA device:``, after accel's import and its view of ``cuda`` are checked).
``--accelerator cpu --quick`` runs the same checks on the CPU, few steps each, to try this
script without a GPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import accel
from accel.testing.conformance import Limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import nanogpt_model as nanogpt  # the benchmarks' nanoGPT, written in code

EXIT_FAILED = 1
EXIT_NO_GPU = 2
#: On one GPU the kit's two NCCL ranks would share it (NCCL refuses) or ask for a cuda:1.
ONE_GPU = Limits(distributed="one GPU: the kit's two NCCL ranks need a GPU each")
#: nanoGPT's shape as the benchmarks run it: 2 layers, 64 wide, 65 tokens, tied.
CONFIG = nanogpt.GPTConfig()
BATCH, CLIP = 8, 1.0


@dataclass(frozen=True)
class Sizes:
    #: nanogpt-step: steps an epoch, and timed rounds of an epoch a side (after a warm-up).
    steps: int
    rounds: int
    #: save-resume: steps before the save, and in all.
    resume_at: int
    resume_steps: int


#: ``--quick`` (to try the script on the CPU) runs the fewest steps that still check.
FULL, QUICK = Sizes(20, 5, 3, 8), Sizes(2, 1, 1, 2)
SIZES = FULL


def run_child(*args: str, timeout: float = 300) -> str:
    """This script in a fresh interpreter (``--child ...``); its output, or an
    AssertionError with the last line it printed."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = (done.stdout + done.stderr).strip()
    last = out.splitlines()[-1] if out else "(no output)"
    assert done.returncode == 0, f"child {args[0]} exited {done.returncode}: {last}"
    return done.stdout.strip()


# -- 1. probing -----------------------------------------------------------------------


def check_probe(name: str) -> str:
    return run_child("probe", name).splitlines()[-1]


def child_probe(name: str) -> None:
    accel.list_accelerators()
    acc = accel.get_accelerator(name)
    count = acc.device_count()
    assert acc.is_available(), f"{name} is not available after it was selected"
    assert not torch.cuda.is_initialized(), "probing initialised CUDA"  # type: ignore[no-untyped-call]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must still be able to use the GPU
        code, said = 1, ""
        try:
            bad = torch.cuda._is_in_bad_fork()
            total = (torch.arange(4, device=acc.device) * 2).sum().item()
            code = 0 if not bad and total == 12 else 1
            said = f"in bad fork: {bad}, a tensor made on {acc.device}: sum {total}"
        except BaseException as exc:
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, said.encode())
        os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    said = os.read(read, 4096).decode()
    assert os.waitstatus_to_exitcode(status) == 0, f"the forked child failed: {said}"
    print(f"{count} device(s), CUDA not initialised by probing; forked child: {said}")


# -- 2. the conformance kit -------------------------------------------------------------


def check_conformance(name: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "accel", "conformance", name, "--json", f"{tmp}/kit.json"]
        if name == "cuda" and torch.cuda.device_count() < 2:
            command += ["--limits", "gpu_proof:ONE_GPU"]
        # The kit imports the limits module from the current directory.
        done = subprocess.run(
            command, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=600
        )
        if not Path(f"{tmp}/kit.json").exists():
            last = (done.stdout + done.stderr).strip().splitlines() or ["(no output)"]
            raise AssertionError(f"the kit exited {done.returncode}: {last[-1]}")
        rows = json.loads(Path(f"{tmp}/kit.json").read_text())
    failed = [f"{r['promise']} ({r['reason']})" for r in rows if r["outcome"] == "failed"]
    skipped = [r["promise"] for r in rows if r["outcome"] == "skipped"]
    passed = len(rows) - len(failed) - len(skipped)
    detail = f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped"
    for outcome, promises in (("failed", failed), ("skipped", skipped)):
        if promises:
            detail += f"; {outcome}: {', '.join(promises)}"
    assert not failed, detail
    assert done.returncode == 0, f"the kit exited {done.returncode}: {detail}"
    return detail


# -- 3. a tied model there and back -----------------------------------------------------


def check_tied_model(name: str) -> str:
    acc, cpu = accel.get_accelerator(name), accel.get_accelerator("cpu")
    torch.manual_seed(0)
    model = nanogpt.GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(model, optimizer, batch(0, model))  # so that the optimizer has state
    before = {k: v.clone() for k, v in model.state_dict().items()}
    count = len(list(model.parameters()))
    for target in (acc, cpu):
        model = target.model_to_device(model, optimizer=optimizer)
        where = f"on {target.device}"
        assert model.lm_head.weight is model.transformer.wte.weight, f"untied {where}"
        assert len(list(model.parameters())) == count, f"parameter count changed {where}"
        assert all(p.device.type == target.device.type for p in model.parameters()), where
        ours = {id(p) for p in model.parameters()}
        held = [p for group in optimizer.param_groups for p in group["params"]]
        assert {id(p) for p in held} == ours, f"the optimizer holds other parameters {where}"
        moments = [optimizer.state[p]["exp_avg"] for p in held]
        assert all(m.device.type == target.device.type for m in moments), f"state {where}"
        for key, value in model.state_dict().items():
            assert torch.equal(value.cpu(), before[key]), f"{key} changed {where}"
    return f"to {acc.device} and back: the tie kept, {count} parameters, equal, optimizer followed"


# -- 4. pinned batches ------------------------------------------------------------------


def check_pinned_batches(name: str) -> str:
    acc = accel.get_accelerator(name)
    pin = torch.cuda.is_available()  # pinning needs CUDA (also on --accelerator cpu)
    batches = [{"x": torch.randn(BATCH, 16), "y": [torch.arange(BATCH) + i]} for i in range(4)]
    if pin:
        batches = [{"x": b["x"].pin_memory(), "y": [b["y"][0].pin_memory()]} for b in batches]
    moved = [acc.batch_to_device(batches[0]), *acc.device_loader(batches)]
    for host, there in zip([batches[0], *batches], moved, strict=True):
        for a, b in ((host["x"], there["x"]), (host["y"][0], there["y"][0])):
            assert b.device == acc.device, f"a batch arrived on {b.device}, not {acc.device}"
            assert torch.equal(a, b.cpu()), "a batch's values changed on the way"
    state = "pinned" if pin else "pageable (no CUDA to pin with)"
    return f"{len(moved)} {state} batches (batch_to_device, device_loader) on {acc.device}, equal"


# -- 5. nanoGPT's step: accel against plain torch --------------------------------------


def batch(step: int, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The same tokens for every run: drawn from a generator seeded by the step."""
    generator = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(
        0, CONFIG.vocab_size, (BATCH, CONFIG.block_size + 1), generator=generator
    )
    device = next(model.parameters()).device
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def train_step(model: Any, optimizer: torch.optim.Optimizer, xy: tuple[Any, Any]) -> Any:
    _, loss = model(*xy)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def nanogpt_epochs(name: str) -> dict[str, Callable[[], list[torch.Tensor]]]:
    """An epoch of each side (its losses), each on its own copy of one model."""
    acc = accel.get_accelerator(name)
    torch.manual_seed(0)
    initial = nanogpt.GPT(CONFIG)
    host = [batch(step, initial) for step in range(SIZES.steps)]
    if torch.cuda.is_available():
        host = [(x.pin_memory(), y.pin_memory()) for x, y in host]

    def optimizer_of(model: Any) -> torch.optim.AdamW:
        return model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), acc.device.type)  # type: ignore[no-any-return]

    model_a = acc.model_to_device(copy.deepcopy(initial))
    optimizer_a = optimizer_of(model_a)

    def with_accel() -> list[torch.Tensor]:
        losses = []
        for x, y in acc.device_loader(host):
            with acc.autocast(torch.bfloat16):
                _, loss = model_a(x, y)
            loss.backward()
            acc.clip_grad_norm_(model_a.parameters(), CLIP)
            acc.optimizer_step(optimizer_a)
            optimizer_a.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        return losses

    model_h = copy.deepcopy(initial).to(acc.device)  # CUDA keeps the tie: no re-tying
    optimizer_h = optimizer_of(model_h)

    def by_hand() -> list[torch.Tensor]:
        losses = []
        for x, y in host:
            x, y = x.to(acc.device, non_blocking=True), y.to(acc.device, non_blocking=True)
            with torch.autocast(acc.device.type, dtype=torch.bfloat16):
                _, loss = model_h(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model_h.parameters(), CLIP)
            optimizer_h.step()
            optimizer_h.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        return losses

    return {"accel": with_accel, "hand": by_hand}


def check_nanogpt_step(name: str) -> str:
    acc = accel.get_accelerator(name)
    epochs = nanogpt_epochs(name)
    losses: dict[str, list[float]] = {"accel": [], "hand": []}
    seconds: dict[str, list[float]] = {"accel": [], "hand": []}
    for round_ in range(-1, SIZES.rounds):  # round -1 warms up (CUDA, autotuning, allocator)
        for side in ("accel", "hand") if round_ % 2 else ("hand", "accel"):
            acc.synchronize()
            started = time.perf_counter()
            epoch = epochs[side]()
            acc.synchronize()
            if round_ >= 0:
                seconds[side].append(time.perf_counter() - started)
            losses[side] += [float(loss) for loss in epoch]
    difference = max(abs(a - h) for a, h in zip(losses["accel"], losses["hand"], strict=True))
    # Both sides do the same arithmetic; bf16 and atomics in the GPU's kernels may differ.
    assert difference <= 1e-2, f"the losses differ by up to {difference:.2e}"
    ratio = statistics.median(a / h for a, h in zip(seconds["accel"], seconds["hand"], strict=True))
    per_step = statistics.median(seconds["accel"]) / SIZES.steps * 1e3
    return (
        f"{(SIZES.rounds + 1) * SIZES.steps} steps a side, losses {losses['accel'][0]:.4f} -> "
        f"{losses['accel'][-1]:.4f}, differing by at most {difference:.1e}; accel "
        f"{per_step:.2f} ms/step, time ratio accel/hand {ratio:.3f}"
    )


# -- 6. save and resume in a new process ------------------------------------------------


def check_save_resume(name: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        run_child("train", name, tmp, "whole", str(SIZES.resume_steps))
        run_child("train", name, tmp, "first", str(SIZES.resume_at))
        run_child("train", name, tmp, "rest", str(SIZES.resume_steps))
        whole = torch.load(f"{tmp}/whole.pt", weights_only=True)
        resumed = torch.load(f"{tmp}/rest.pt", weights_only=True)
    assert whole.keys() == resumed.keys(), "the resumed model has other parameters"
    exact = all(torch.equal(whole[k], resumed[k]) for k in whole)
    for key in whole:  # GPU kernels may round differently run to run (atomics)
        torch.testing.assert_close(resumed[key], whole[key], msg=lambda m, k=key: f"{k}: {m}")
    equal = "bit-exact" if exact else "equal within float32 tolerance, not bit-exact"
    done, rest = SIZES.resume_at, SIZES.resume_steps - SIZES.resume_at
    return f"{done} steps, saved, {rest} more in a new process: {equal}"


def child_train(name: str, workdir: str, label: str, stop: str) -> None:
    """Train from step 0 (or from ``first.pt`` as ``rest``) up to ``stop``; save the
    checkpoint (``first``) or the final parameters (``whole``, ``rest``)."""
    acc = accel.get_accelerator(name)
    acc.manual_seed(0)
    model = acc.model_to_device(nanogpt.GPT(CONFIG))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), acc.device.type)
    state = {"model": model, "optimizer": optimizer, "step": 0, "rng": acc.rng_state()}
    start = 0
    if label == "rest":
        remainder = acc.load(f"{workdir}/first.pt", state)
        acc.set_rng_state(remainder["rng"])
        start = remainder["step"]
    for step in range(start, int(stop)):
        train_step(model, optimizer, batch(step, model))
    if label == "first":
        state.update(step=int(stop), rng=acc.rng_state())
        acc.save(state, f"{workdir}/first.pt")
    else:
        torch.save(acc.state_dict(model), f"{workdir}/{label}.pt")


# -- the run ----------------------------------------------------------------------------

CHECKS: dict[str, Callable[[str], str]] = {
    "probe": check_probe,
    "conformance": check_conformance,
    "tied-model": check_tied_model,
    "pinned-batches": check_pinned_batches,
    "nanogpt-step": check_nanogpt_step,
    "save-resume": check_save_resume,
}
CHILDREN: dict[str, Callable[..., None]] = {"probe": child_probe, "train": child_train}


def no_gpu_reason() -> str | None:
    """Why this process has no CUDA device to check, or ``None``; also what accel says
    of ``cuda``, which must agree with torch."""
    row = next(info for info in accel.list_accelerators() if info.name == "cuda")
    if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        found = f"torch {torch.__version__} is a build without CUDA"
    elif torch.cuda.device_count() == 0:
        found = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
    else:
        assert row.available, f"torch sees a GPU, but accel says cuda is unavailable: {row.reason}"
        return None
    assert not row.available, f"{found}, yet accel lists cuda as available"
    return (
        f"{found}; accel agrees (cuda unavailable: {row.reason}). Run this on a machine "
        f"with an NVIDIA GPU and a CUDA build of torch (ACCEL_GPU_PYTHON, see "
        f"docs/contributing.md)"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        CHILDREN[argv[1]](*argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cuda", help="cpu: try the script without a GPU")
    parser.add_argument("--check", action="append", choices=CHECKS, help="only this check")
    parser.add_argument("--quick", action="store_true", help="the fewest steps that check")
    args = parser.parse_args(argv)
    global SIZES
    SIZES = QUICK if args.quick else FULL
    print(
        f"gpu-proof: accel {accel.__version__} from {Path(accel.__file__).parent}, torch "
        f"{torch.__version__}, Python {sys.version.split()[0]}",
        flush=True,
    )
    if args.accelerator == "cuda":
        try:
            reason = no_gpu_reason()
        except Exception as exc:  # accel and torch disagree, or accel cannot list
            print(f"FAIL probe: {type(exc).__name__}: {exc}")
            return EXIT_FAILED
        if reason is not None:
            print(f"no CUDA device: {reason}")
            return EXIT_NO_GPU
        print(f"gpu-proof: {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}")
    failed = 0
    for name in args.check or CHECKS:
        started = time.perf_counter()
        try:
            detail, verdict = CHECKS[name](args.accelerator), "PASS"
        except Exception as exc:  # one failing check must not hide the others
            detail, verdict = f"{type(exc).__name__}: {str(exc).strip()}", "FAIL"
            failed += 1
        took = time.perf_counter() - started
        print(f"{verdict} {name}: {detail} ({took:.1f} s)".replace("\n", " "), flush=True)
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
