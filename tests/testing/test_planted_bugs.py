"""The kit catches a plugin with a planted bug, for each kind of promise.

Each plugin below is an accelerator on the CPU (or on ``meta``, where a tensor left on
the CPU shows) with one realistic mistake; the kit's promise for it must fail, naming
what went wrong, while the same promise holds for the built-in CPU. The bugs the kit
once missed are also shown to break their documented promise through accel's public
API, so that a failed check is a broken promise, not a strict kit. The distributed
bugs are installed (an entry point), since the kit's two workers find plugins so.
"""

from __future__ import annotations

import contextlib
import textwrap
import threading
import time
import types
from collections.abc import Generator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accel
from accel.testing.conformance import Outcome, run
from accel.training.device_loader import DeviceLoader, MovingLoader
from accel.training.nested import map_nested
from helpers.fakes import FakeAccelerator
from helpers.installing import write_distribution
from helpers.registries import isolated_registry


class UntiesOnTheWay(FakeAccelerator):
    """Moves parameter by parameter, giving each slot a copy of its own."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        for module in model.modules():
            for name, parameter in list(module.named_parameters(recurse=False)):
                setattr(module, name, nn.Parameter(parameter.detach().clone().to(device)))
        return model


class UntiesOnTheWayBack(FakeAccelerator):
    """Registers, next to its accelerator, a cross-cutting post-move hook that re-creates
    the head's weight when a model lands on the CPU (the bug every PrivateUse1
    backend's moves back had)."""

    def plugins(self) -> list[object]:
        return [self, _UntiesOnCpu()]


class _UntiesOnCpu:
    """Declares no accelerator, so its hooks see every move (the CPU's too)."""

    @accel.hookimpl
    def post_move_hook(self, accelerator: str, model: nn.Module) -> None:
        head = getattr(model, "head", None)
        if accelerator == "cpu" and head is not None:
            head.weight = nn.Parameter(head.weight.detach().clone())


class TiesByValue(FakeAccelerator):
    """ "Saves memory" by sharing parameters whose values are equal."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        model.to(device)
        seen: list[nn.Parameter] = []
        for module in model.modules():
            for name, parameter in list(module.named_parameters(recurse=False)):
                twin = next(
                    (p for p in seen if p.shape == parameter.shape and torch.equal(p, parameter)),
                    None,
                )
                if twin is not None and twin is not parameter:
                    setattr(module, name, twin)
                else:
                    seen.append(parameter)
        return model


class BestEffortMove(FakeAccelerator):
    """Moves each submodule on its own and skips the ones that fail: the failure never
    reaches accel, so nothing is rolled back."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        for child in model.children():
            try:
                child.to(device)
            except RuntimeError:
                continue
        return model


class TopLevelBatches(FakeAccelerator):
    """Moves a batch's top-level tensors only (on ``meta``, so the rest shows)."""

    @accel.hookimpl
    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        if isinstance(batch, dict):
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return None


class HidesBatchFailures(FakeAccelerator):
    """Hands a batch it could not move back as it was, so the step runs on the host."""

    @accel.hookimpl
    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        try:
            return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        except RuntimeError:
            return batch


class DrawsAfterSeeding(FakeAccelerator):
    """Warms the generator up after seeding, a little longer each time."""

    seeded = 0

    @accel.hookimpl(wrapper=True)
    def manual_seed(self) -> Generator[None, None, None]:
        result = yield
        self.seeded += 1
        torch.rand(self.seeded)
        return result


class OpaqueRngState(FakeAccelerator):
    """Keeps its generator state in an object of its own, which weights_only refuses."""

    @accel.hookimpl
    def rng_state(self) -> Any:
        return types.SimpleNamespace(state=torch.get_rng_state())

    @accel.hookimpl
    def set_rng_state(self, state: Any) -> bool:
        torch.set_rng_state(state.state)
        return True


class CopiesEachTensor(FakeAccelerator):
    """A state_dict hook that copies every tensor to the CPU on its own."""

    @accel.hookimpl
    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


class ZeroingRestore(FakeAccelerator):
    """A restore_to_device hook that allocates the device tensors but copies nothing."""

    @accel.hookimpl
    def restore_to_device(
        self, tensors: list[torch.Tensor], device: torch.device
    ) -> list[torch.Tensor]:
        return [torch.zeros_like(tensor, device=device) for tensor in tensors]


class RestoresReversed(FakeAccelerator):
    """Uploads a checkpoint's tensors as a stack, and hands them back last first."""

    @accel.hookimpl
    def restore_to_device(
        self, tensors: list[torch.Tensor], device: torch.device
    ) -> list[torch.Tensor]:
        return [tensor.to(device) for tensor in reversed(tensors)]


class StepsNothing(FakeAccelerator):
    """An optimizer_step hook that forgets to step."""

    @accel.hookimpl
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> str:
        return "stepped"


class MeasuresButDoesNotClip(FakeAccelerator):
    @accel.hookimpl
    def clip_grad_norm_(self, parameters: list[torch.Tensor], norm_type: float) -> torch.Tensor:
        grads = [p.grad for p in parameters if p.grad is not None]
        return torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]), norm_type
        )


class FullPrecisionAutocast(FakeAccelerator):
    @accel.hookimpl
    def autocast(self) -> Any:
        return nullcontext()


class PeakBelowUse(FakeAccelerator):
    """Reports the peak since the last step as the peak since the start."""

    @accel.hookimpl
    def memory_stats(self) -> accel.MemoryStats:
        return accel.MemoryStats(allocated_bytes=100, peak_allocated_bytes=10, total_bytes=None)


class DropsTheLastBatch(FakeAccelerator):
    @accel.hookimpl
    def device_loader(self, loader: Any, move: Any) -> Any:
        return (move(batch) for batch in list(loader)[:-1])


class TrustsAWrappedLoader(FakeAccelerator):
    """Takes a loader that is already a DeviceLoader for batches on the device, and hands
    out those of the loader inside it, still on the host (on ``meta``, so that shows)."""

    @accel.hookimpl
    def device_loader(self, loader: Any, move: Any) -> Any:
        if isinstance(loader, DeviceLoader):
            return loader.loader
        return MovingLoader(loader, move)


class CountsNoDevice(FakeAccelerator):
    def __init__(self) -> None:
        super().__init__("buggy", count=0)


class ProbesByDrawing(FakeAccelerator):
    """Tells whether the device works by drawing a random tensor on it, which moves the
    host's generator on every listing and every "auto"."""

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        torch.rand(1)
        return accel.Availability(True)


class MovesBatchesItself(FakeAccelerator):
    """Moves each batch itself in its loader ("faster"), never through move: another
    plugin's batch hooks are bypassed."""

    @accel.hookimpl
    def device_loader(self, loader: Any, device: torch.device) -> Any:
        return [tuple(t.to(device) for t in batch) for batch in loader]


class CopiesEveryBatch(FakeAccelerator):
    """Copies every tensor "to be safe", those already on the device too."""

    @accel.hookimpl
    def batch_to_device(self, batch: Any, device: torch.device) -> Any:
        return map_nested(batch, lambda t: t.to(device, copy=True))


class NoBackend(FakeAccelerator):
    @accel.hookimpl
    def distributed_backend(self) -> str:
        return ""


class BusyOnceOpened(FakeAccelerator):
    """Says its device is busy once this process has opened it: selected, then listed
    as unavailable."""

    opened = False

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        if self.opened:
            return accel.Availability(False, reason="device busy")
        return accel.Availability(True)

    @accel.hookimpl
    def get_device(self) -> torch.device:
        self.opened = True
        return torch.device("cpu")


class CastsToBfloat16(FakeAccelerator):
    """ "Saves memory" by moving a model in bfloat16."""

    @accel.hookimpl
    def model_to_device(self, model: nn.Module, device: torch.device) -> nn.Module:
        return model.to(device=device, dtype=torch.bfloat16)


class StepsByItself(FakeAccelerator):
    """Steps with ``optimizer.step()`` and nothing else: no closure, no scaler."""

    @accel.hookimpl
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        optimizer.step()
        return True


class _FreesGradients:
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        for parameter in self.model.parameters():
            parameter.grad = None


class FreesGradientsUnderNoSync(FakeAccelerator):
    """Frees each micro-step's gradients "to save memory", so none accumulate."""

    @accel.hookimpl
    def no_sync(self, model: nn.Module, enabled: bool) -> Any:
        return _FreesGradients(model) if enabled else nullcontext()


class ScalerWithoutOptions(FakeAccelerator):
    """Builds the scaler with torch's defaults, whatever the user passed."""

    @accel.hookimpl
    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(device.type)


class AutocastIgnoresDtype(FakeAccelerator):
    """Autocasts to the device's favourite type, whatever was asked for."""

    @accel.hookimpl
    def autocast(self, device: torch.device) -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16)


class UnregisteredCompileBackend(FakeAccelerator):
    """Names a compile backend its extension never registered."""

    @accel.hookimpl
    def compile_backend(self) -> str:
        return "npu_backend"


class KeepsItsOwnGenerator(FakeAccelerator):
    """A device with a generator of its own, which its tensors (on the CPU) never draw
    from: seeded, stored and put back by its hooks, as the hookspecs say."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator()

    @accel.hookimpl
    def manual_seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @accel.hookimpl
    def rng_state(self) -> Any:
        return {"type": "buggy", "states": [self.generator.get_state()]}

    @accel.hookimpl
    def set_rng_state(self, state: Any) -> bool:
        if not (isinstance(state, dict) and state.get("type") == "buggy"):
            raise ValueError(f"not a buggy generator state: {state!r}")
        self.generator.set_state(state["states"][0])
        return True


class AcceptsAnyRngState(FakeAccelerator):
    """Takes whatever state it is given, another device type's too, without a word."""

    @accel.hookimpl
    def set_rng_state(self, state: Any) -> bool:
        return True


class SeedsNotItsGenerator(KeepsItsOwnGenerator):
    """Leaves seeding to torch.manual_seed, which never sees its generator."""

    @accel.hookimpl
    def manual_seed(self, seed: int) -> None:
        pass


class RestoresNotItsGenerator(KeepsItsOwnGenerator):
    """Answers set_rng_state without putting its generator back."""

    @accel.hookimpl
    def set_rng_state(self, state: Any) -> bool:
        return True


class WritesLater(FakeAccelerator):
    """Returns from save before the file is written (in a thread of its own)."""

    @accel.hookimpl
    def save(self, obj: Any, path: Any) -> bool:
        def write() -> None:
            time.sleep(0.5)
            with contextlib.suppress(Exception):  # the kit's directory may be gone by then
                torch.save(obj, path)

        threading.Thread(target=write, daemon=True).start()
        return True


class WritesInPlace(FakeAccelerator):
    """Writes with torch.save straight to the path: a failed write leaves it torn."""

    @accel.hookimpl
    def save(self, obj: Any, path: Any) -> bool:
        torch.save(obj, path)
        return True


class LoadsWithPickle(FakeAccelerator):
    """Loads with weights_only=False "to read every old checkpoint"."""

    @accel.hookimpl
    def load(self, path: Any) -> Any:
        return torch.load(path, map_location="cpu", weights_only=False)


class SynchronizeRaises(FakeAccelerator):
    @accel.hookimpl
    def synchronize(self) -> bool:
        raise RuntimeError("Backend doesn't support synchronizing events")


class MarkStepRaises(FakeAccelerator):
    """Flushes a lazy runtime that this build of the backend does not have."""

    @accel.hookimpl
    def mark_step(self) -> None:
        raise NotImplementedError("lazy mode is not enabled in this build")


CASES = [
    (BusyOnceOpened(), "selection.by_name", "is not available: device busy"),
    (ProbesByDrawing(), "selection.is_available_pure", "changed the host generator's state"),
    (CastsToBfloat16(), "moves.values_and_dtypes", "is torch.bfloat16, was torch.float32"),
    (UntiesOnTheWay(), "moves.ties_kept_to_device", "no longer one Parameter"),
    (UntiesOnTheWayBack(), "moves.ties_kept_back_to_cpu", "back to the CPU: head.weight"),
    (TiesByValue(), "moves.no_tie_created", "a tie was created"),
    (BestEffortMove(), "moves.rollback", "did not raise"),
    (TopLevelBatches(device="meta"), "batches.every_tensor_moved", "['nested'][0]: left on cpu"),
    (HidesBatchFailures(), "batches.failure_named", "a tensor that cannot move was moved"),
    (DrawsAfterSeeding(), "generators.manual_seed_host", "the same seed gave other draws"),
    (OpaqueRngState(), "generators.rng_state_weights_only", "does not load with weights_only"),
    (CopiesEachTensor(), "checkpoints.state_dict", "stores the tie twice"),
    (ZeroingRestore(), "checkpoints.save_and_load", "changed value"),
    (RestoresReversed(), "checkpoints.restore_order", "after load: 0.weight holds the values of"),
    (StepsNothing(), "step.optimizer_step", "after one step"),
    (StepsByItself(), "step.optimizer_step_closure", "never called the closure"),
    (StepsByItself(), "step.grad_scaler", "scaled step"),
    (FreesGradientsUnderNoSync(), "step.accumulation_and_no_sync", "accumulated step"),
    (ScalerWithoutOptions(), "step.grad_scaler_options", "scale 65536.0 and growth interval 2000"),
    (
        AutocastIgnoresDtype(),
        "step.autocast_dtype",
        "dtype=torch.float16) computed in torch.bfloat16",
    ),
    (UnregisteredCompileBackend(), "step.compile", "npu_backend"),
    (DrawsAfterSeeding(), "generators.manual_seed_device", "other draws on the device"),
    (SeedsNotItsGenerator(), "generators.manual_seed_device_state", "does not seed the device"),
    (RestoresNotItsGenerator(), "generators.rng_state_round_trip", "does not put the device"),
    (
        AcceptsAnyRngState(),
        "generators.set_rng_state_refuses_other_type",
        "accepted a 'cuda' generator state on 'cpu'",
    ),
    (WritesLater(), "checkpoints.save_asynchronously", "FileNotFoundError"),
    (WritesInPlace(), "checkpoints.failed_save", "changed the previous checkpoint"),
    (LoadsWithPickle(), "checkpoints.load_runs_no_code", "ran code from it"),
    (SynchronizeRaises(), "runtime.synchronize", "doesn't support synchronizing events"),
    (MarkStepRaises(), "runtime.mark_step", "lazy mode is not enabled"),
    (MeasuresButDoesNotClip(), "step.clip_grad_norm_", "after clipping to norm 1"),
    (FullPrecisionAutocast(), "step.autocast", "autocast computed in torch.float32"),
    (PeakBelowUse(), "runtime.memory_stats", "peak 10 is below the 100 bytes in use"),
    (DropsTheLastBatch(), "batches.device_loader", "epoch 0: 3 batches of 4"),
    (
        TrustsAWrappedLoader(device="meta"),
        "batches.device_loader_wrapped_twice",
        "wrapped twice: epoch 0, batch 0[0]: left on cpu",
    ),
    (MovesBatchesItself(), "batches.device_loader_uses_move", "only [] passed through move"),
    (CopiesEveryBatch(), "batches.on_device_unchanged", "batch['inputs']: batch_to_device gave"),
    (CountsNoDevice(), "devices.count_and_index", "device_count() is 0"),
    (NoBackend(), "devices.distributed_backend", "distributed_backend is ''"),
]


def _outcome(plugin: FakeAccelerator, promise: str) -> Outcome:
    plugins = plugin.plugins() if isinstance(plugin, UntiesOnTheWayBack) else [plugin]
    registry = isolated_registry(*plugins)
    (outcome,) = run("buggy", registry=registry, promises=[promise])
    return outcome


@pytest.mark.parametrize(
    ("plugin", "promise", "says"), CASES, ids=[type(case[0]).__name__ for case in CASES]
)
def test_the_kit_catches_a_planted_bug(plugin: FakeAccelerator, promise: str, says: str) -> None:
    plugin.spec = accel.AcceleratorSpec("buggy")
    outcome = _outcome(plugin, promise)
    assert outcome.outcome == "failed", outcome
    assert says in outcome.reason


@pytest.mark.parametrize("promise", sorted({case[1] for case in CASES}))
def test_each_promise_a_bug_breaks_holds_on_the_cpu(promise: str) -> None:
    (outcome,) = run("cpu", registry=isolated_registry(), promises=[promise])
    assert outcome == Outcome(promise, "passed")


def test_a_device_generator_kept_as_the_hooks_say_passes_what_its_bugs_fail() -> None:
    plugin = KeepsItsOwnGenerator()
    plugin.spec = accel.AcceleratorSpec("buggy")
    outcomes = run("buggy", registry=isolated_registry(plugin), promises=["generators"])
    assert [o for o in outcomes if o.outcome != "passed"] == []


# -- the bugs the kit once missed, each shown to break its promise without the kit ------


def _handle(plugin: FakeAccelerator) -> accel.Accelerator:
    plugin.spec = accel.AcceleratorSpec("buggy")
    return isolated_registry(plugin).get_accelerator("buggy")


#: What the crafted checkpoint's code recorded when it ran.
RAN: list[str] = []


def _record(what: str) -> None:
    RAN.append(what)


class _RecordsItRan:
    def __reduce__(self) -> Any:
        return _record, ("ran",)


def test_loads_with_pickle_runs_a_crafted_checkpoints_code(tmp_path: Path) -> None:
    torch.save({"payload": _RecordsItRan()}, tmp_path / "crafted.pt")
    with pytest.raises(Exception, match="weights_only"):
        _handle(FakeAccelerator()).load(tmp_path / "crafted.pt")
    assert RAN == []
    _handle(LoadsWithPickle()).load(tmp_path / "crafted.pt")
    assert RAN == ["ran"]  # hookspecs.load: "a checkpoint never runs code"


def test_autocast_ignoring_the_dtype_computes_in_another_one() -> None:
    with _handle(AutocastIgnoresDtype()).autocast(dtype=torch.float16):
        assert nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.bfloat16


def test_a_scaler_without_the_options_has_torchs_defaults() -> None:
    scaler = _handle(ScalerWithoutOptions()).grad_scaler(
        torch.float16, init_scale=1024.0, growth_interval=7
    )
    assert scaler is not None
    assert (scaler.get_scale(), scaler.get_growth_interval()) == (65536.0, 2000)


def test_a_device_generator_never_seeded_shows_only_in_the_device_entry() -> None:
    acc = _handle(SeedsNotItsGenerator())
    acc.manual_seed(1)
    draws, state = torch.rand(3), acc.rng_state()["device"]["states"][0]
    acc.manual_seed(2)
    acc.manual_seed(1)
    assert torch.equal(torch.rand(3), draws)  # the draws alone cannot see it
    acc.manual_seed(2)  # hookspecs.manual_seed: "seed the ... generators of its devices"
    assert torch.equal(acc.rng_state()["device"]["states"][0], state)


def test_a_device_generator_never_put_back_shows_only_in_the_device_entry() -> None:
    acc = _handle(RestoresNotItsGenerator())
    acc.manual_seed(1)
    state = acc.rng_state()
    draws = torch.rand(3)
    acc.manual_seed(2)
    acc.set_rng_state(state)
    assert torch.equal(torch.rand(3), draws)  # the draws alone cannot see it
    # hookspecs.set_rng_state: "put back the device generator state rng_state returned"
    assert not torch.equal(acc.rng_state()["device"]["states"][0], state["device"]["states"][0])


# -- distributed: installed, since the kit's two workers find the plugin so ------------

_INSTALLED = """
from contextlib import nullcontext

import accel
from accel.training.checkpoint import atomic_save
from helpers.fakes import FakeAccelerator


class BackendNeverImported(FakeAccelerator):
    # Names a vendor backend (hccl) this machine lacks: no such library, one device.
    @accel.hookimpl
    def distributed_backend(self):
        return "hccl"


class ReducesAgain(FakeAccelerator):
    # "Reduces the gradients first", as a runtime that reduces in the step must; under
    # DDP backward has reduced them already, so this sums them a second time.
    @accel.hookimpl
    def clip_grad_norm_(self, parameters, max_norm, norm_type):
        import torch

        for parameter in parameters:
            if parameter.grad is not None:
                torch.distributed.all_reduce(parameter.grad)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)


class WritesOnEveryRank(FakeAccelerator):
    # Writes the file on every process: ranks overwrite one another's checkpoint.
    @accel.hookimpl
    def save(self, obj, path):
        atomic_save(obj, path)
        return True


class TellsTheOthersAnyway(FakeAccelerator):
    # Writes on rank 0 and lets the others go in a finally: a failed write raises on
    # rank 0 alone, and the others carry on as if the file were there.
    @accel.hookimpl
    def save(self, obj, path):
        import torch.distributed as dist

        if not dist.is_initialized():
            atomic_save(obj, path)
            return True
        try:
            if dist.get_rank() == 0:
                atomic_save(obj, path)
        finally:
            dist.barrier()
        return True


class SkipsTheSyncAnyway(FakeAccelerator):
    # Skips the gradient sync also on the micro-step that must sync (enabled=False).
    @accel.hookimpl
    def no_sync(self, model, enabled):
        return model.no_sync() if hasattr(model, "no_sync") else nullcontext()


PLUGIN = {name}("buggy")
"""

DISTRIBUTED_CASES = [
    ("BackendNeverImported", "distributed.all_reduce", "rank 1 failed starting the group"),
    ("BackendNeverImported", "distributed.ddp_step", "rank 1 failed starting the group"),
    ("SkipsTheSyncAnyway", "distributed.no_sync", "(the sync was skipped?)"),
    ("ReducesAgain", "distributed.clip_grad_norm_", "were they reduced again"),
    # Whichever rank reads last, one of them finds rank 1's file (a loaded machine can
    # delay rank 1's write past rank 0's).
    ("WritesOnEveryRank", "distributed.save_on_main_process", "read back the file rank 1 saved"),
    (
        "TellsTheOthersAnyway",
        "distributed.failed_save_raises_everywhere",
        "rank 1: save returned as if the file were written",
    ),
]


@pytest.fixture
def installed_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install the named planted plugin as a distribution (on sys.path, which the kit's
    workers get as PYTHONPATH); give the registry for the parent."""

    def install(name: str) -> accel.AcceleratorRegistry:
        module = f"accel_planted_{name.lower()}"
        write_distribution(
            tmp_path,
            f"accel-planted-{name.lower()}",
            group="accel",
            entry_points={"buggy": f"{module}:PLUGIN"},
            modules={module: textwrap.dedent(_INSTALLED).format(name=name)},
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        plugin = __import__(module).PLUGIN
        return isolated_registry(plugin)

    return install


@pytest.mark.parametrize("name", sorted({case[0] for case in DISTRIBUTED_CASES}))
def test_the_kit_catches_a_planted_distributed_bug(name: str, installed_bug: Any) -> None:
    outcomes = {
        o.promise: o for o in run("buggy", registry=installed_bug(name), promises=["distributed"])
    }
    for _, promise, says in (case for case in DISTRIBUTED_CASES if case[0] == name):
        assert outcomes[promise].outcome == "failed", outcomes[promise]
        assert says in outcomes[promise].reason, outcomes[promise]
