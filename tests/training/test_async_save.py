"""acc.save(obj, path, asynchronous=True) on the CPU and on a device the host reads only
through copies: the file holds the state as it was when save returned, one save is in
flight, a failed write is raised at wait(), the next save or wait_for_saves() and
nothing is pruned for it, retention sees a checkpoint only once it is durable, the
preemption guard and the exit wait for the write.

Where a write must still be running, it is held on an event the test sets; nothing
here depends on how fast the machine is.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.training.checkpoint import PendingSave, _async_save, _save
from accel.training.checkpoint import _atomic as atomic
from accel.training.checkpoint._atomic import is_temporary
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
)
from helpers import async_saves
from helpers.async_saves import HeldWrites, OffHostTensor
from helpers.fakes import FakeAccelerator
from helpers.models import TiedLM
from helpers.registries import isolated_registry

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture(autouse=True)
def no_save_left_pending() -> Iterator[None]:
    yield
    try:
        _async_save.wait_for_saves()
    except OSError:
        pass  # a test that made a save fail on purpose and did not wait for it


def _training_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    scheduler.step()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def _values(state: dict[str, Any]) -> dict[str, Any]:
    """Copies of everything the checkpoint of ``state`` holds, to compare it with."""
    model, optimizer = state["model"], state["optimizer"]
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": {
            index: {k: v.clone() for k, v in entries.items()}
            for index, entries in optimizer.state_dict()["state"].items()
        },
        "last_epoch": state["scheduler"].last_epoch,
    }


def _change_everything_in_place(state: dict[str, Any]) -> None:
    with torch.no_grad():
        for parameter in state["model"].parameters():
            parameter.add_(1.0)
        for entries in state["optimizer"].state.values():
            for value in entries.values():
                value.add_(1.0)
    state["scheduler"].step()


def _assert_holds(path: Path, expected: dict[str, Any]) -> None:
    stored = torch.load(path, weights_only=True)
    assert stored["model"].keys() == expected["model"].keys()
    for name, value in expected["model"].items():
        assert torch.equal(stored["model"][name], value), name
    assert stored["model"]["embed.weight"] is stored["model"]["head.weight"]  # stored once
    for index, entries in expected["optimizer"].items():
        for name, value in entries.items():
            assert torch.equal(stored["optimizer"]["state"][index][name], value), (index, name)
    assert stored["scheduler"]["last_epoch"] == expected["last_epoch"]


# -- the snapshot ----------------------------------------------------------------------


def test_a_change_after_save_returns_never_reaches_the_file(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _training_state()
    expected = _values(state)
    held = HeldWrites(monkeypatch)
    pending = acc.save({**state, "step": 1}, tmp_path / "c.pt", asynchronous=True)
    held.wait_started()  # the write is under way, in another thread
    assert not pending.done() and held.threads != [threading.current_thread().name]
    _change_everything_in_place(state)
    held.release()
    pending.wait()
    assert pending.done()
    _assert_holds(tmp_path / "c.pt", expected)
    assert not torch.equal(state["model"].embed.weight, expected["model"]["embed.weight"])


def test_tensors_on_a_device_the_host_cannot_read_are_copied_before_save_returns(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weight = OffHostTensor(torch.arange(6.0).reshape(2, 3))
    moment = OffHostTensor(torch.full((2, 3), 0.5))
    held = HeldWrites(monkeypatch)
    async_saves.COPIES.clear()
    pending = acc.save(
        {"weights": {"embed": weight, "head": weight}, "moments": [moment]},
        tmp_path / "c.pt",
        asynchronous=True,
    )
    assert len(async_saves.COPIES) == 2  # each tensor crossed once, before save returned
    weight.add_(100.0)
    moment.mul_(0.0)
    held.release()
    pending.wait()
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    assert torch.equal(stored["weights"]["embed"], torch.arange(6.0).reshape(2, 3))
    assert stored["weights"]["embed"] is stored["weights"]["head"]
    assert torch.equal(stored["moments"][0], torch.full((2, 3), 0.5))


def test_meta_tensors_fail_at_the_call_as_a_synchronous_save_does(tmp_path: Path) -> None:
    acc = isolated_registry(FakeAccelerator("npu", device="meta")).get_accelerator("npu")
    model = acc.model_to_device(TiedLM())
    assert model.embed.weight.is_meta
    with pytest.raises(NotImplementedError) as synchronous:
        acc.save({"model": model}, tmp_path / "sync.pt")
    with pytest.raises(NotImplementedError) as asynchronous:
        acc.save({"model": model}, tmp_path / "async.pt", asynchronous=True)
    assert str(asynchronous.value) == str(synchronous.value)
    assert _async_save.pending_paths() == frozenset()
    acc.wait_for_saves()  # nothing was left pending
    assert list(tmp_path.iterdir()) == []  # no file, no temporary


def test_views_of_one_storage_stay_views_of_one_copy(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    whole = torch.arange(10.0)
    pending = acc.save({"whole": whole, "head": whole[:4], "tail": whole[6:]}, tmp_path / "v.pt",
                       asynchronous=True)  # fmt: skip
    whole.zero_()
    pending.wait()
    stored = torch.load(tmp_path / "v.pt", weights_only=True)
    assert torch.equal(stored["tail"], torch.arange(6.0, 10.0))
    stored["whole"][7] = -1.0  # the views share the loaded storage, as torch.save keeps
    assert stored["tail"][1] == -1.0 and stored["head"].untyped_storage().nbytes() == 40


def test_the_next_snapshot_reuses_the_memory_of_the_last_written_one(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[int] = []
    real_write = _save.atomic_save

    def recording_writer(obj: Any, path: Path) -> None:
        written.append(obj["x"].data_ptr())
        real_write(obj, path)

    monkeypatch.setattr(_save, "atomic_save", recording_writer)
    x = torch.arange(2**16, dtype=torch.float32)
    acc.save({"x": x}, tmp_path / "a.pt", asynchronous=True).wait()
    x.add_(1.0)
    acc.save({"x": x}, tmp_path / "b.pt", asynchronous=True).wait()
    assert written[0] == written[1] != x.data_ptr()  # the same host buffer, not x's
    assert torch.equal(torch.load(tmp_path / "a.pt")["x"], torch.arange(2**16.0))
    assert torch.equal(torch.load(tmp_path / "b.pt")["x"], torch.arange(2**16.0) + 1)


# -- one at a time -----------------------------------------------------------------------


def test_the_next_save_waits_for_the_previous_one_and_snapshots_after_it(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[str, str]] = []
    first_may_finish, first_started = threading.Event(), threading.Event()
    real_write, real_snapshot = _save.atomic_save, _save.take_snapshot

    def slow_writer(obj: Any, path: Path) -> None:
        log.append(("write starts", path.name))
        if path.name == "a.pt":
            first_started.set()
            assert first_may_finish.wait(async_saves.HOLD_TIMEOUT_S)
        real_write(obj, path)
        log.append(("write ends", path.name))

    def snapshot(stored: Any, *args: Any) -> Any:
        log.append(("snapshot", stored["name"]))
        return real_snapshot(stored, *args)

    monkeypatch.setattr(_save, "atomic_save", slow_writer)
    monkeypatch.setattr(_save, "take_snapshot", snapshot)
    first = acc.save({"name": "a.pt", "x": torch.ones(3)}, tmp_path / "a.pt", asynchronous=True)
    assert first_started.wait(async_saves.HOLD_TIMEOUT_S)
    second: list[Any] = []
    caller = threading.Thread(
        target=lambda: second.append(
            acc.save({"name": "b.pt", "x": torch.zeros(3)}, tmp_path / "b.pt", asynchronous=True)
        )
    )
    caller.start()
    caller.join(0.5)
    assert caller.is_alive() and not second  # blocked behind the first write
    assert ("snapshot", "b.pt") not in log
    first_may_finish.set()
    caller.join(async_saves.HOLD_TIMEOUT_S)
    second[0].wait()
    assert first.done()
    assert log == [
        ("snapshot", "a.pt"),
        ("write starts", "a.pt"),
        ("write ends", "a.pt"),
        ("snapshot", "b.pt"),  # one snapshot in memory at a time
        ("write starts", "b.pt"),
        ("write ends", "b.pt"),
    ]


def test_a_synchronous_save_to_the_same_path_lands_after_the_pending_one(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldWrites(monkeypatch)
    acc.save({"v": torch.tensor(1)}, tmp_path / "c.pt", asynchronous=True)
    held.wait_started()
    later = threading.Thread(target=lambda: acc.save({"v": torch.tensor(2)}, tmp_path / "c.pt"))
    later.start()
    later.join(0.5)
    assert later.is_alive()  # waits for the asynchronous one
    held.release()
    later.join(async_saves.HOLD_TIMEOUT_S)
    assert acc.load(tmp_path / "c.pt")["v"] == 2


def test_a_synchronous_save_waits_for_an_asynchronous_one_still_taking_its_snapshot(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both modes hold the one slot from the start: a synchronous save of another thread
    # cannot slip in while the older save prepares, and then be overwritten by it.
    in_snapshot, snapshot_may_end = threading.Event(), threading.Event()
    real_snapshot = _save.take_snapshot

    def held_snapshot(stored: Any, *args: Any) -> Any:
        in_snapshot.set()
        assert snapshot_may_end.wait(async_saves.HOLD_TIMEOUT_S)
        return real_snapshot(stored, *args)

    monkeypatch.setattr(_save, "take_snapshot", held_snapshot)
    path = tmp_path / "last.pt"
    older: list[PendingSave] = []
    first = threading.Thread(
        target=lambda: older.append(acc.save({"v": torch.tensor(1)}, path, asynchronous=True))
    )
    first.start()
    assert in_snapshot.wait(async_saves.HOLD_TIMEOUT_S)
    later = threading.Thread(target=lambda: acc.save({"v": torch.tensor(2)}, path))
    later.start()
    later.join(0.5)
    assert later.is_alive()  # behind the save being prepared, not beside it
    snapshot_may_end.set()
    first.join(async_saves.HOLD_TIMEOUT_S)
    later.join(async_saves.HOLD_TIMEOUT_S)
    older[0].wait()
    assert not later.is_alive() and acc.load(path)["v"] == 2  # the later save landed last


# -- failures ------------------------------------------------------------------------------


@contextmanager
def _file_size_limit(size: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.parametrize("raised_at", ["wait", "next save", "wait_for_saves"])
def test_a_full_disk_during_the_write_is_raised_once_and_prunes_nothing(
    acc: accel.Accelerator, tmp_path: Path, raised_at: str
) -> None:
    for step in (1, 2):
        acc.save({"small": torch.zeros(16)}, checkpoint_path(tmp_path, step))
    old = checkpoint_path(tmp_path, 2).read_bytes()
    path = checkpoint_path(tmp_path, 3)
    with _file_size_limit(256 * 1024):
        pending = acc.save({"big": torch.zeros(2**20)}, path, asynchronous=True)
        assert prune_checkpoints(tmp_path, keep=2) == []  # step 3 is not complete
        where = {
            "wait": pending.wait,
            "next save": lambda: acc.save({"next": 1}, tmp_path / "next.pt", asynchronous=True),
            "wait_for_saves": acc.wait_for_saves,
        }[raised_at]
        with pytest.raises(OSError, match="save could not write the checkpoint") as info:
            where()
    assert info.value.errno == errno.EFBIG and info.value.filename == str(path)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert sys.version_info < (3, 11) or "which failed in the background" in notes
    assert not (tmp_path / "next.pt").exists()  # the next save was not started
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step-000000001.pt",
        "step-000000002.pt",
    ]
    assert prune_checkpoints(tmp_path, keep=2) == []
    assert checkpoint_path(tmp_path, 2).read_bytes() == old
    assert not [p for p in tmp_path.iterdir() if is_temporary(p)]
    acc.wait_for_saves()  # raised once: told, it is not raised again
    acc.save({"after": 1}, tmp_path / "after.pt", asynchronous=True).wait()
    with pytest.raises(OSError, match="save could not write the checkpoint"):
        pending.wait()  # but the save itself still says it failed


def test_asynchronous_must_be_a_bool(acc: accel.Accelerator, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="asynchronous must be True or False, got str"):
        acc.save({"x": 1}, tmp_path / "c.pt", asynchronous="yes")  # type: ignore[call-overload]
    assert not (tmp_path / "c.pt").exists()


# -- retention and the preemption guard ----------------------------------------------------


def test_retention_sees_a_checkpoint_only_once_its_write_is_durable(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2):
        acc.save({"step": step}, checkpoint_path(tmp_path, step))
    renamed, may_sync = threading.Event(), threading.Event()
    real_fsync = atomic.fsync_directory

    def held_fsync(directory: Path) -> None:
        renamed.set()  # the file has its name; the rename is not durable yet
        assert may_sync.wait(async_saves.HOLD_TIMEOUT_S)
        real_fsync(directory)

    held = HeldWrites(monkeypatch)
    pending = acc.save({"step": 3}, checkpoint_path(tmp_path, 3), asynchronous=True)
    held.wait_started()
    temporaries = [p for p in tmp_path.iterdir() if is_temporary(p)]
    assert len(temporaries) == 1  # its random name, never taken for a checkpoint
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    assert prune_checkpoints(tmp_path, keep=2) == []
    monkeypatch.setattr(atomic, "fsync_directory", held_fsync)
    held.release()
    assert renamed.wait(async_saves.HOLD_TIMEOUT_S)
    assert checkpoint_path(tmp_path, 3).exists()
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    # keep=1 while step 3 is being written: the last complete one stays, and step 3 too.
    assert prune_checkpoints(tmp_path, keep=1) == [checkpoint_path(tmp_path, 1)]
    may_sync.set()
    pending.wait()
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "step-000000002.pt",
        "step-000000003.pt",
    ]
    assert prune_checkpoints(tmp_path, keep=1) == [checkpoint_path(tmp_path, 2)]


def test_the_preemption_guard_exits_only_once_the_pending_save_is_complete(
    acc: accel.Accelerator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldWrites(monkeypatch)
    with acc.preemption_guard():
        pending = acc.save({"x": torch.ones(4)}, tmp_path / "c.pt", asynchronous=True)
        held.wait_started()
        # Let the write go a moment after the guard starts to exit; it must wait for it.
        threading.Timer(0.2, held.release).start()
    assert pending.done()
    assert torch.equal(acc.load(tmp_path / "c.pt")["x"], torch.ones(4))


# -- the exit --------------------------------------------------------------------------------


def _script(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "async_exit.py"), mode, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_a_process_that_exits_with_a_save_pending_finishes_it(tmp_path: Path) -> None:
    done = _script(tmp_path, "finish")
    assert done.returncode == 0, done.stderr
    assert "pending at exit: True" in done.stdout
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    assert torch.equal(stored["x"], torch.arange(2**16, dtype=torch.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_a_save_that_fails_at_exit_says_so_on_stderr(tmp_path: Path) -> None:
    done = _script(tmp_path, "fail")
    assert done.returncode == 0, done.stderr
    assert "pending at exit: True" in done.stdout
    assert f"accel: the asynchronous save of {str(tmp_path / 'c.pt')!r} failed" in done.stderr
    assert "nothing waited for it before the process exited" in done.stderr
    assert torch.equal(torch.load(tmp_path / "c.pt", weights_only=True)["x"], torch.zeros(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
