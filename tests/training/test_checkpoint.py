"""acc.save, acc.load, rng_state/set_rng_state, preemption_guard and keep-last-N on the
CPU: the write is atomic (a full disk, a read-only or missing directory leave the
previous checkpoint as it was, no temporary file, an OSError naming the path), load
restores in place with weights_only, and the generators come back exactly."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from torch import nn

import accel
from accel.training.checkpoint._atomic import is_temporary
from accel.training.checkpoint._preemption import PreemptionGuard
from accel.training.checkpoint._retention import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
)
from helpers.models import TiedLM


def _training_state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**seed)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    scheduler.step()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


# -- save: what is stored -------------------------------------------------------------


def test_save_stores_modules_optimizers_schedulers_and_scalers_as_state_dicts(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    state = _training_state(1)
    acc.save({**state, "step": 7, "note": "plain"}, tmp_path / "c.pt")
    stored = torch.load(tmp_path / "c.pt", weights_only=True)
    assert stored["step"] == 7 and stored["note"] == "plain"
    assert stored["model"]["embed.weight"] is stored["model"]["head.weight"]  # a tie, once
    assert stored["optimizer"]["state"][0]["exp_avg"].shape == (16, 8)
    assert stored["scheduler"]["last_epoch"] == 1
    assert stored["scaler"]["scale"] == 2.0


def test_save_stores_an_object_that_contains_itself_as_torch_save_does(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    loop: dict[str, Any] = {"x": torch.ones(2)}
    loop["self"] = loop
    acc.save(loop, tmp_path / "loop.pt")
    loaded = acc.load(tmp_path / "loop.pt")
    assert loaded["self"] is loaded and torch.equal(loaded["x"], torch.ones(2))


def test_save_writes_a_file_whose_mode_follows_the_umask(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    previous = os.umask(0o027)
    try:
        acc.save({"x": torch.ones(1)}, tmp_path / "c.pt")
    finally:
        os.umask(previous)
    assert (tmp_path / "c.pt").stat().st_mode & 0o777 == 0o640
    assert _files(tmp_path) == ["c.pt"]


def test_save_replaces_the_old_checkpoint_and_clears_a_dead_processs_temporary(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    host = os.uname().nodename
    stale = tmp_path / f".c.pt.{host}.{child.pid}.accel-tmp"
    stale.write_bytes(b"torn")
    someone_elses = tmp_path / f".c.pt.other-host.{child.pid}.accel-tmp"
    someone_elses.write_bytes(b"maybe still writing")
    acc.save({"v": 1}, tmp_path / "c.pt")
    acc.save({"v": 2}, tmp_path / "c.pt")
    assert acc.load(tmp_path / "c.pt") == {"v": 2}
    assert _files(tmp_path) == [someone_elses.name, "c.pt"]  # another host's: not ours to judge


# -- save: failures leave the previous checkpoint -------------------------------------


def _assert_failed_cleanly(info: pytest.ExceptionInfo[OSError], path: Path, old: bytes) -> None:
    assert str(path) in str(info.value) and info.value.filename == str(path)
    assert "the previous file at that path, if any, is unchanged" in str(info.value)
    assert path.read_bytes() == old
    assert not [p for p in path.parent.iterdir() if is_temporary(p)]


def test_a_file_size_limit_hit_mid_write_leaves_the_old_checkpoint(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    path = tmp_path / "c.pt"
    acc.save({"small": torch.zeros(16)}, path)
    old = path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
    try:
        with pytest.raises(OSError, match="save could not write the checkpoint") as info:
            acc.save({"big": torch.zeros(2**20)}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert info.value.errno == errno.EFBIG
    assert "ulimit -f" in str(info.value)
    _assert_failed_cleanly(info, path, old)


@contextlib.contextmanager
def _tmpfs(directory: Path, options: str) -> Iterator[Path]:
    directory.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here, so no small file system to fill")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): {done.stderr}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_full_disk_leaves_the_old_checkpoint(acc: accel.Accelerator, tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "small", "size=1m") as small:
        path = small / "c.pt"
        acc.save({"small": torch.zeros(16)}, path)
        old = path.read_bytes()
        with pytest.raises(OSError, match="save could not write the checkpoint") as info:
            acc.save({"big": torch.zeros(2**20)}, path)  # 4 MiB onto 1 MiB
        assert info.value.errno == errno.ENOSPC
        _assert_failed_cleanly(info, path, old)


def test_a_read_only_directory_leaves_the_old_checkpoint(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    with _tmpfs(tmp_path / "ro", "size=1m") as directory:
        path = directory / "c.pt"
        acc.save({"old": torch.zeros(16)}, path)
        old = path.read_bytes()
        # Read-only at the mount: root cannot write through it (it can through chmod).
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        with pytest.raises(OSError, match="save could not write the checkpoint") as info:
            acc.save({"new": torch.ones(16)}, path)
        assert info.value.errno == errno.EROFS
        _assert_failed_cleanly(info, path, old)


def test_a_missing_directory_is_a_file_not_found_error_naming_the_path(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    path = tmp_path / "not-yet" / "c.pt"
    with pytest.raises(FileNotFoundError, match="create the directory first") as info:
        acc.save({"x": 1}, path)
    assert info.value.filename == str(path)
    assert not (tmp_path / "not-yet").exists()


# -- load --------------------------------------------------------------------------------


def test_load_restores_every_object_in_place_and_returns_the_rest(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    saved = _training_state(1)
    acc.save({**saved, "step": 3}, tmp_path / "c.pt")
    fresh = _training_state(2)
    model = fresh["model"]
    assert not torch.equal(model.embed.weight, saved["model"].embed.weight)
    remainder = acc.load(tmp_path / "c.pt", fresh)
    assert remainder == {"step": 3}
    assert fresh["model"] is model and model.head.weight is model.embed.weight
    for name, tensor in saved["model"].state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    for key in ("optimizer", "scheduler", "scaler"):
        assert repr(fresh[key].state_dict()) == repr(saved[key].state_dict()), key


def test_load_without_state_returns_the_stored_object(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    acc.save([1, {"t": torch.arange(3)}], tmp_path / "c.pt")
    first, second = acc.load(tmp_path / "c.pt")
    assert first == 1 and torch.equal(second["t"], torch.arange(3))


def test_a_missing_key_or_a_wrong_shape_changes_nothing(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    acc.save({"model": TiedLM()}, tmp_path / "c.pt")
    model = TiedLM()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(KeyError, match="has no entry 'optimizer' to restore"):
        acc.load(
            tmp_path / "c.pt", {"model": model, "optimizer": torch.optim.SGD([model.body.weight])}
        )
    with pytest.raises(ValueError, match=r"parameter 'embed.weight' of entry 'model'.*\(16, 8\)"):
        acc.load(tmp_path / "c.pt", {"model": TiedLM(vocab=20)})
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])


def test_a_missing_plain_value_key_is_a_key_error_naming_it_and_changes_nothing(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    acc.save({"model": TiedLM()}, tmp_path / "c.pt")
    model = TiedLM()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(KeyError, match=r"has no entry 'epoch', 'rng' to restore; it has 'model'"):
        acc.load(tmp_path / "c.pt", {"model": model, "epoch": 0, "rng": None})
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])


class _Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_hostile_pickle_is_refused_without_running_it(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    torch.save({"model": _Hostile(marker)}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError, match="nothing in it was run"):
        acc.load(tmp_path / "evil.pt", {"model": nn.Linear(1, 1)})
    assert not marker.exists()


def test_a_file_that_is_no_checkpoint_is_a_value_error(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    acc.save({"x": torch.zeros(1000)}, tmp_path / "c.pt")
    torn = tmp_path / "torn.pt"
    torn.write_bytes((tmp_path / "c.pt").read_bytes()[: 64 * 1024 // 16])
    (tmp_path / "text.pt").write_text("hello")
    for path in (torn, tmp_path / "text.pt"):
        with pytest.raises(ValueError, match="is not a checkpoint torch can read"):
            acc.load(path)
    with pytest.raises(FileNotFoundError, match="there is no checkpoint file at"):
        acc.load(tmp_path / "absent.pt")


# -- generators ---------------------------------------------------------------------------


def _draws() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(numpy.random.rand()), torch.rand(3)


def test_rng_state_round_trips_through_a_checkpoint(acc: accel.Accelerator, tmp_path: Path) -> None:
    random.seed(1)
    numpy.random.seed(1)
    torch.manual_seed(1)
    acc.save({"rng": acc.rng_state()}, tmp_path / "c.pt")
    expected = _draws()
    _draws()
    acc.set_rng_state(acc.load(tmp_path / "c.pt")["rng"])
    again = _draws()
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


def test_saving_leaves_every_generator_as_it_found_it(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    state = acc.rng_state()
    expected = _draws()
    acc.set_rng_state(state)
    acc.save({**_training_state(3), "rng": acc.rng_state()}, tmp_path / "c.pt")
    # _training_state seeds torch: the save itself must not have moved python or numpy
    assert _draws()[:2] == expected[:2]


def test_a_device_state_from_another_device_type_is_refused(acc: accel.Accelerator) -> None:
    state = acc.rng_state()
    with pytest.raises(ValueError, match="the device generator state is from 'cuda'"):
        acc.set_rng_state({**state, "device": {"type": "cuda", "states": []}})
    with pytest.raises(TypeError, match=r"expects the dict acc.rng_state\(\) returned"):
        acc.set_rng_state([1, 2])  # type: ignore[arg-type]


# -- keep-last-N ---------------------------------------------------------------------------


def test_prune_keeps_the_newest_and_latest_finds_it(acc: accel.Accelerator, tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none-yet") is None
    for step in (1, 10, 2, 100):
        acc.save({"step": step}, checkpoint_path(tmp_path, step))
    (tmp_path / ".step-000000200.pt.host.1.accel-tmp").write_bytes(b"torn")  # never a checkpoint
    assert [p.name for p in list_checkpoints(tmp_path)][-1] == "step-000000100.pt"
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in deleted] == ["step-000000001.pt", "step-000000002.pt"]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and acc.load(latest) == {"step": 100}
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        prune_checkpoints(tmp_path, keep=0)


# -- preemption_guard -------------------------------------------------------------------


def test_the_guard_notes_sigterm_and_sigusr1_and_restores_the_handlers(
    acc: accel.Accelerator,
) -> None:
    before = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGUSR1)}
    for number in before:
        with acc.preemption_guard() as guard:
            assert not guard.requested
            os.kill(os.getpid(), number)  # delivered before the next bytecode
            assert guard.requested and guard.received == number
        assert {n: signal.getsignal(n) for n in before} == before


def test_the_guard_must_be_entered_in_the_main_thread(acc: accel.Accelerator) -> None:
    raised: list[BaseException] = []

    def enter() -> None:
        try:
            with acc.preemption_guard():
                pass
        except RuntimeError as exc:
            raised.append(exc)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(raised) == 1 and "must be entered in the main thread" in str(raised[0])
    assert isinstance(acc.preemption_guard(), PreemptionGuard)


def test_a_signal_in_a_nested_guard_reaches_the_enclosing_guard(acc: accel.Accelerator) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with acc.preemption_guard() as outer:
        with acc.preemption_guard() as inner:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert inner.requested and outer.received == signal.SIGUSR1
        assert outer.requested
    assert signal.getsignal(signal.SIGUSR1) == before


def test_an_inner_guard_passes_on_a_signal_the_outer_one_does_not_watch(
    acc: accel.Accelerator,
) -> None:
    with acc.preemption_guard(signals=(signal.SIGTERM,)) as outer:
        with acc.preemption_guard(signals=(signal.SIGUSR2,)) as inner:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert inner.requested and outer.received == signal.SIGUSR2  # the inner's handler
        assert outer.requested
    with acc.preemption_guard(signals=(signal.SIGTERM,)) as outer:
        with acc.preemption_guard(signals=(signal.SIGUSR2,)) as inner:
            inner.received = signal.SIGUSR2  # noted, as by a handler outer never ran
            outer.received = None
        assert outer.requested and outer.received == signal.SIGUSR2  # passed on at exit
