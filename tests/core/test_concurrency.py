"""Many threads selecting accelerators and moving things on one registry at once."""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import accel
from accel.tying import count_unique_parameters
from helpers.fakes import FakeAccelerator, MetaTpuPlugin, MoveRecorder
from helpers.models import TiedLM
from helpers.registries import isolated_registry

THREADS = 16
ITERATIONS = 12
JOIN_TIMEOUT_S = 60.0

Pair = collections.namedtuple("Pair", ["left", "right"])


@dataclasses.dataclass
class Record:
    features: torch.Tensor
    meta: dict[str, Any]


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads far more often than usual, so interleavings actually happen."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _build_registry() -> accel.AcceleratorRegistry:
    """Built-ins, with `tpu` replaced by the meta-moving TPU plugin."""
    registry = isolated_registry()
    registry.register(MetaTpuPlugin(), name="meta-tpu", override=True)
    return registry


NAMES = ["cpu", " CPU ", "auto", "xla", "tpu", "tpu:0", "gpu", "cpu:1", "cpuu", "nonesuch"]


def _outcome(registry: accel.AcceleratorRegistry, name: str) -> tuple[str, ...]:
    """What selecting ``name`` gives, as comparable values."""
    try:
        acc = registry.get_accelerator(name)
    except accel.AcceleratorNotFoundError as exc:
        return ("not-found", exc.requested, str(exc.suggestion))
    except accel.AcceleratorUnavailableError as exc:
        return ("unavailable", exc.accelerator)
    return ("ok", acc.name, str(acc.device))


def _batch(seed: int) -> dict[str, Any]:
    shared = torch.full((2,), float(seed))
    return {
        "ids": [torch.arange(3) + seed, (torch.ones(2) * seed, "tag")],
        "pair": Pair(shared, shared),
        "record": Record(torch.zeros(1, 2) + seed, {"n": seed, "t": torch.tensor(seed)}),
    }


def _check_batch(moved: dict[str, Any], seed: int, device: torch.device) -> None:
    assert type(moved) is dict
    ids = moved["ids"]
    assert type(ids) is list and type(ids[1]) is tuple and ids[1][1] == "tag"
    assert type(moved["pair"]) is Pair
    assert moved["pair"].left is moved["pair"].right  # moved once, still one object
    assert type(moved["record"]) is Record
    assert moved["record"].meta["n"] == seed
    tensors = [ids[0], ids[1][0], moved["pair"].left, moved["record"].features]
    tensors.append(moved["record"].meta["t"])
    assert all(t.device == device for t in tensors)
    if device.type == "cpu":
        assert torch.equal(ids[0], torch.arange(3) + seed)
        assert torch.equal(moved["pair"].left, torch.full((2,), float(seed)))
        assert int(moved["record"].meta["t"]) == seed
    else:
        assert ids[0].shape == (3,) and moved["record"].features.shape == (1, 2)


def _check_model_move(acc: accel.Accelerator, seed: int) -> None:
    torch.manual_seed(seed)
    model = TiedLM(vocab=6, width=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    moved = acc.model_to_device(model, optimizer=optimizer)
    assert moved is model
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == 3
    assert all(p.device == acc.device for p in model.parameters())
    params = optimizer.param_groups[0]["params"]
    assert all(p is q for p, q in zip(params, model.parameters(), strict=True))


def _run_threads(workers: list[Callable[[], None]]) -> list[str]:
    """Start every worker behind one barrier; return the tracebacks of failures."""
    errors: list[str] = []
    barrier = threading.Barrier(len(workers), timeout=JOIN_TIMEOUT_S)

    def run(work: Callable[[], None]) -> None:
        try:
            barrier.wait()
            work()
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {JOIN_TIMEOUT_S}s: {stuck}"
    return errors


def test_many_threads_select_and_move_on_one_registry(busy_switching: None) -> None:
    reference = _build_registry()
    expected = {name: _outcome(reference, name) for name in NAMES}
    # What the contract says, whatever the machine: so the reference is right too.
    assert expected["cpu"] == expected[" CPU "] == ("ok", "cpu", "cpu")
    assert expected["xla"] == expected["tpu"] == expected["tpu:0"] == ("ok", "tpu", "meta")
    assert expected["cpuu"] == ("not-found", "cpuu", "cpu")
    assert expected["nonesuch"][0] == "not-found"
    assert expected["cpu:1"] == ("unavailable", "cpu")
    assert expected["auto"][0] == "ok"

    registry = _build_registry()
    recorder = MoveRecorder()
    toggles = 0
    results: list[tuple[str, tuple[str, ...]]] = []

    def selector_and_mover(index: int) -> Callable[[], None]:
        def work() -> None:
            for iteration in range(ITERATIONS):
                name = NAMES[(index + iteration) % len(NAMES)]
                results.append((name, _outcome(registry, name)))
                seed = index * 100 + iteration
                cpu = registry.get_accelerator("cpu")
                tpu = registry.get_accelerator("xla")
                _check_batch(cpu.batch_to_device(_batch(seed)), seed, cpu.device)
                _check_batch(tpu.batch_to_device(_batch(seed)), seed, tpu.device)
                if iteration % 3 == 0:
                    _check_model_move(tpu if index % 2 else cpu, seed)

        return work

    def toggler() -> None:
        nonlocal toggles
        for _ in range(ITERATIONS * 4):
            registry.register(recorder, name="recorder")
            registry.unregister(recorder)
            toggles += 1

    workers = [selector_and_mover(i) for i in range(THREADS - 1)] + [toggler]
    errors = _run_threads(workers)

    assert not errors, "\n".join(errors)
    assert toggles == ITERATIONS * 4
    assert len(results) == (THREADS - 1) * ITERATIONS
    for name, outcome in results:
        assert outcome == expected[name], name
    # Every move the recorder saw while registered was a real one.
    assert all(move in {("cpu", "cpu"), ("tpu", "meta")} for move in recorder.moves)

    # One consistent state: what a fresh registry with the same plugins has.
    assert registry.names() == reference.names()
    assert registry.list_accelerators() == reference.list_accelerators()
    assert registry.plugin_failures() == []
    # The cross-cutting plugin is gone for good: no stale hook caller still reaches it.
    seen = len(recorder.moves)
    registry.get_accelerator("cpu").model_to_device(TiedLM())
    registry.get_accelerator("tpu").model_to_device(TiedLM())
    assert len(recorder.moves) == seen
    # And registering it again makes it see each move exactly once.
    registry.register(recorder, name="recorder")
    registry.get_accelerator("tpu").model_to_device(TiedLM())
    assert recorder.moves[seen:] == [("tpu", "meta")]
    assert registry.list_accelerators() == reference.list_accelerators()


def test_first_use_from_many_threads_loads_the_registry_once(busy_switching: None) -> None:
    registry = isolated_registry()
    reference = isolated_registry()
    seen: list[tuple[str, tuple[str, ...], int]] = []

    def work() -> None:
        acc = registry.get_accelerator("cpu")
        names = tuple(registry.names())
        seen.append((acc.name, names, len(registry.list_accelerators())))

    errors = _run_threads([work] * THREADS)

    assert not errors, "\n".join(errors)
    expected = ("cpu", tuple(reference.names()), len(reference.list_accelerators()))
    assert seen == [expected] * THREADS
    assert registry.list_accelerators() == reference.list_accelerators()


def test_threads_registering_plugins_of_their_own(busy_switching: None) -> None:
    """Each thread registers and unregisters its own accelerator while others select."""
    registry = isolated_registry()
    reference = isolated_registry()

    def own_plugin(index: int) -> Callable[[], None]:
        def work() -> None:
            for iteration in range(ITERATIONS):
                plugin = FakeAccelerator(f"fake{index}", aliases=(f"alias{index}",))
                registry.register(plugin)
                acc = registry.get_accelerator(f"ALIAS{index}")
                assert acc.name == f"fake{index}"
                moved = acc.batch_to_device(_batch(iteration))
                _check_batch(moved, iteration, torch.device("cpu"))
                assert "batch_to_device" in plugin.calls
                registry.unregister(plugin)
                with pytest.raises(accel.AcceleratorNotFoundError):
                    registry.get_accelerator(f"fake{index}")
                assert registry.get_accelerator("cpu").name == "cpu"

        return work

    errors = _run_threads([own_plugin(i) for i in range(THREADS // 2)])

    assert not errors, "\n".join(errors)
    assert registry.names() == reference.names()
    assert registry.list_accelerators() == reference.list_accelerators()


class BlockingFake(FakeAccelerator):
    """Its is_available waits, once, until the test lets it go on."""

    def __init__(self) -> None:
        super().__init__("fake")
        self.entered = threading.Event()
        self.release = threading.Event()
        self.block = False

    @accel.hookimpl
    def is_available(self) -> accel.Availability:
        if self.block:
            self.block = False
            self.entered.set()
            assert self.release.wait(JOIN_TIMEOUT_S)
        return accel.Availability(True)


def test_unregistering_during_a_selection_gives_a_result_or_a_clear_error() -> None:
    fake = BlockingFake()
    registry = isolated_registry(fake)
    fake.block = True
    outcome: list[object] = []

    def select() -> None:
        try:
            outcome.append(registry.get_accelerator("fake"))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=select, daemon=True)
    thread.start()
    try:
        assert fake.entered.wait(JOIN_TIMEOUT_S)
        registry.unregister(fake)  # while the selection is inside the plugin's hook
    finally:
        fake.release.set()
    thread.join(JOIN_TIMEOUT_S)
    assert not thread.is_alive()

    (result,) = outcome
    if isinstance(result, accel.Accelerator):
        assert result.name == "fake"
    else:
        assert isinstance(result, accel.AcceleratorNotFoundError), repr(result)
    assert "fake" not in registry.names()


def test_a_handle_whose_plugin_was_unregistered_raises_a_clear_error() -> None:
    fake = FakeAccelerator("fake")
    registry = isolated_registry(fake)
    acc = registry.get_accelerator("fake")
    registry.unregister(fake)  # e.g. by another thread, while this one holds the handle

    with pytest.raises(accel.AcceleratorError, match="fake"):
        acc.batch_to_device(torch.ones(1))


def test_a_handle_never_reaches_a_plugin_registered_after_it() -> None:
    registry = isolated_registry()
    cpu = registry.get_accelerator("cpu")
    late = FakeAccelerator("late", available=False)
    registry.register(late)  # e.g. by another thread, while the handle is in use

    assert cpu.is_available()  # the late plugin's "no" never answers for the CPU
    cpu.model_to_device(torch.nn.Linear(2, 2))
    assert late.calls == []  # nor do its move hooks run


# -- one model, many threads: moves of one model serialise, of different models do not --

#: The stress test's time box: as many rounds as fit, at least one.
STRESS_SECONDS = 4.0
STRESS_ROUNDS = 40


def _tie_damage(model: TiedLM, device: torch.device) -> str | None:
    """What is wrong with a TiedLM after its moves, or None."""
    head, embed = model.head.weight, model.embed.weight
    if head is None or embed is None or head is not embed:
        where = [None if t is None else str(t.device) for t in (head, embed)]
        return f"head.weight is {'None' if head is None else 'not embed.weight'} ({where})"
    if count_unique_parameters(model) != 3:
        return f"{count_unique_parameters(model)} unique parameters, not 3"
    off = [name for name, p in model.named_parameters() if p.device != device]
    return f"not on {device}: {off}" if off else None


def one_model_from_many_threads(acc: accel.Accelerator) -> tuple[list[str], int]:
    """Rounds of THREADS threads all moving one fresh tied model; what went wrong."""
    problems: list[str] = []
    rounds = 0
    deadline = time.monotonic() + STRESS_SECONDS
    while rounds < STRESS_ROUNDS and time.monotonic() < deadline:
        model = TiedLM(vocab=6, width=4)
        errors = _run_threads([lambda m=model: acc.model_to_device(m)] * THREADS)
        damage = _tie_damage(model, acc.device)
        if errors or damage:
            raised = [error.strip().splitlines()[-1] for error in errors]
            problems.append(f"round {rounds}: {damage}; {len(errors)} raised {raised[:1]}")
        rounds += 1
    return problems, rounds


def test_one_tied_model_moved_from_many_threads_stays_whole(
    meta_tpu: accel.Accelerator, busy_switching: None
) -> None:
    problems, rounds = one_model_from_many_threads(meta_tpu)
    assert rounds >= 1
    assert problems == [], f"{len(problems)} of {rounds} rounds broke the model: {problems[:3]}"


@pytest.mark.xla
def test_one_tied_model_moved_from_many_threads_on_xla(
    registry: accel.AcceleratorRegistry, busy_switching: None
) -> None:
    problems, rounds = one_model_from_many_threads(registry.get_accelerator("tpu"))
    assert rounds >= 1
    assert problems == [], f"{len(problems)} of {rounds} rounds broke the model: {problems[:3]}"


def test_the_move_lock_goes_with_its_model(registry: accel.AcceleratorRegistry) -> None:
    import gc

    from accel._core import moving

    model = TiedLM()
    registry.get_accelerator("cpu").model_to_device(model)
    assert id(model) in moving._MOVE_LOCKS
    key = id(model)
    del model
    gc.collect()
    assert key not in moving._MOVE_LOCKS


def test_a_model_collected_inside_the_move_locks_guard_does_not_deadlock() -> None:
    """A model freed by the cyclic collector has its lock entry dropped by a weakref
    callback, and a collection can start at any allocation: inside the guard of
    another model's first move too, on the same thread (this once hung a test run)."""
    from accel._core import moving

    doomed = TiedLM()
    moving._move_lock(doomed)
    key = id(doomed)
    reference = moving._MOVE_LOCKS[key][0]
    done = threading.Event()

    def collected_inside_the_guard() -> None:
        with moving._MOVE_LOCKS_GUARD:
            moving._forget_lock(key, reference)  # what the collection would call
        done.set()

    thread = threading.Thread(target=collected_inside_the_guard, daemon=True)
    thread.start()
    assert done.wait(JOIN_TIMEOUT_S), "the weakref callback deadlocked on the guard"
    assert key not in moving._MOVE_LOCKS


class MoveOverlap:
    """A cross-cutting plugin that makes every move wait a little inside its hook and
    records, per model, how many moves of it were in flight at once."""

    def __init__(self, arrivals: int = 1) -> None:
        self._lock = threading.Lock()
        self.in_flight: dict[int, int] = collections.Counter()
        self.most: dict[int, int] = collections.Counter()
        #: Moves that must all be inside the hook before any may leave it.
        self.barrier = threading.Barrier(arrivals, timeout=5.0) if arrivals > 1 else None

    @accel.hookimpl
    def pre_move_hook(self, model: torch.nn.Module) -> None:
        with self._lock:
            self.in_flight[id(model)] += 1
            self.most[id(model)] = max(self.most[id(model)], self.in_flight[id(model)])
        if self.barrier is not None:
            self.barrier.wait()
        time.sleep(0.002)

    @accel.hookimpl
    def post_move_hook(self, model: torch.nn.Module) -> None:
        with self._lock:
            self.in_flight[id(model)] -= 1


def test_moves_of_one_model_never_overlap(registry: accel.AcceleratorRegistry) -> None:
    overlap = MoveOverlap()
    registry.register(overlap)
    cpu = registry.get_accelerator("cpu")
    model = TiedLM()
    errors = _run_threads([lambda: cpu.model_to_device(model)] * 8)
    assert not errors, "\n".join(errors)
    assert overlap.most[id(model)] == 1  # each move waited for the one before it


def test_moves_of_different_models_run_at_the_same_time(
    registry: accel.AcceleratorRegistry,
) -> None:
    # Both moves must be inside the hook at once to get past its barrier: a lock
    # shared by all models would make the first wait for the second forever.
    overlap = MoveOverlap(arrivals=2)
    registry.register(overlap)
    cpu = registry.get_accelerator("cpu")
    models = [TiedLM(), TiedLM()]
    errors = _run_threads([lambda m=m: cpu.model_to_device(m) for m in models])
    assert not errors, "\n".join(errors)
    assert all(overlap.most[id(m)] == 1 for m in models)


def test_a_moved_model_still_copies_and_pickles(meta_tpu: accel.Accelerator) -> None:
    import copy
    import pickle

    model = TiedLM()
    accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu").model_to_device(model)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.head.weight is clone.embed.weight
        assert not any("lock" in name.lower() for name in vars(clone))


class _Snoop:
    """An accelerator plugin that notes every call it gets for another accelerator."""

    def __init__(self, strays: list[str]) -> None:
        self.strays = strays

    @accel.hookimpl
    def register_accelerators(self) -> list[accel.AcceleratorSpec]:
        return [accel.AcceleratorSpec(name="snoop", priority=50)]

    @accel.hookimpl
    def is_available(self, accelerator: str) -> accel.Availability:
        if accelerator != "snoop":
            self.strays.append(accelerator)
        return accel.Availability(False, reason="a snoop")


def test_a_plugin_registered_while_another_accelerator_reads_its_hooks_never_answers_for_it(
    busy_switching: None,
) -> None:
    """One thread registers and unregisters a plugin as fast as it can while others
    select the CPU: each selection reads the CPU's implementations of a hook at one
    moment, so the churned plugin is never among them (it would say the CPU is not
    available)."""
    registry = isolated_registry()
    strays: list[str] = []
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            plugin = _Snoop(strays)
            registry.register(plugin)
            registry.unregister(plugin)

    def select() -> None:
        deadline = time.monotonic() + STRESS_SECONDS / 2
        while time.monotonic() < deadline and not strays:
            assert registry.get_accelerator("cpu").is_available()
        stop.set()

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        errors = _run_threads([select] * 3)
    finally:
        stop.set()
        churner.join(JOIN_TIMEOUT_S)
    assert not strays, f"the churned plugin answered for {sorted(set(strays))}"
    assert not errors, "\n".join(errors)
