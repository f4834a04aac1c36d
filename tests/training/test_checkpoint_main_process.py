"""The main process writes, the others wait for its word: in every mode a save goes
through the ``save`` hook on the process that writes, and a failure heard from rank 0
reads the same (its errno, the path) whichever save it was.

The two ranks of a job are played in one process: torch.distributed's calls are
replaced, rank 0's word is what the test says it was."""

from __future__ import annotations

import errno
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.training.checkpoint import _async_save, _save, writing_in_background
from accel.training.checkpoint._atomic import atomic_save
from accel.training.checkpoint._main_process import written_by_main
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator

SAVE_GROUP = object()


class PassesSaveThrough:
    """A cross-cutting plugin that wraps ``save`` and changes nothing."""

    @accel.hookimpl(wrapper=True)
    def save(self) -> Generator[None, Any, Any]:
        return (yield)


class WritingAccelerator(BareAccelerator):
    """Answers ``save`` by writing the file, noting where and with what it was called."""

    def __init__(self) -> None:
        super().__init__("writer")
        self.saves: list[dict[str, Any]] = []

    @accel.hookimpl
    def save(self, obj: Any, path: Any) -> bool:
        self.saves.append(
            {
                "in_a_thread": threading.current_thread() is not threading.main_thread(),
                "devices": {tensor.device.type for tensor in obj.values()},
                "value": obj["x"].clone(),
            }
        )
        atomic_save(obj, path)
        return True


@pytest.fixture(autouse=True)
def no_save_left_pending() -> Iterator[None]:
    yield
    try:
        _async_save.wait_for_saves()
    except OSError:
        pass  # a test that made a save fail on purpose and did not wait for it


def play_rank(monkeypatch: pytest.MonkeyPatch, rank: int, word: Any = None) -> list[Any]:
    """Make this process rank ``rank`` of two; rank 0's word is ``word``. Returns the
    groups each broadcast went over (``None``: the default group)."""
    dist = torch.distributed
    groups: list[Any] = []

    def broadcast_object_list(objects: list[Any], src: int, group: Any = None) -> None:
        assert src == 0
        groups.append(group)
        if rank != 0:
            objects[0] = word

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    monkeypatch.setattr(
        dist,
        "all_gather_object",
        lambda gathered, obj, group=None: gathered.__setitem__(slice(None), [obj] * 2),
    )
    monkeypatch.setattr(_save, "save_group", lambda: SAVE_GROUP)
    return groups


def save_and_wait(acc: accel.Accelerator, obj: Any, path: Path, asynchronous: bool) -> None:
    pending = acc.save(obj, path, asynchronous=asynchronous)
    if pending is not None:
        pending.wait()


def test_a_lone_asynchronous_save_goes_through_the_save_hook(tmp_path: Path) -> None:
    plugin = WritingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("writer")
    x = torch.ones(2)
    pending = acc.save({"x": x}, tmp_path / "c.pt", asynchronous=True)
    x.add_(1)  # after save returned: never in the file
    pending.wait()
    assert plugin.saves == [
        {"in_a_thread": True, "devices": {"cpu"}, "value": plugin.saves[0]["value"]}
    ]
    assert torch.equal(torch.load(tmp_path / "c.pt")["x"], torch.ones(2))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_in_a_job_rank_0_writes_through_the_save_hook_in_every_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asynchronous: bool
) -> None:
    plugin = WritingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("writer")
    play_rank(monkeypatch, 0)
    save_and_wait(acc, {"x": torch.ones(2)}, tmp_path / "c.pt", asynchronous)
    assert [save["in_a_thread"] for save in plugin.saves] == [asynchronous]
    assert torch.equal(torch.load(tmp_path / "c.pt")["x"], torch.ones(2))


def test_in_a_job_an_asynchronous_save_tells_the_other_ranks_over_the_save_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc = isolated_registry().get_accelerator("cpu")  # accel's own write
    groups = play_rank(monkeypatch, 0)
    acc.save({"x": torch.ones(2)}, tmp_path / "c.pt", asynchronous=True).wait()
    assert groups == [SAVE_GROUP]  # never the loop's communicator, from a thread
    assert torch.equal(torch.load(tmp_path / "c.pt")["x"], torch.ones(2))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_other_ranks_call_no_save_hook_and_return_on_rank_0s_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asynchronous: bool
) -> None:
    plugin = WritingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("writer")
    play_rank(monkeypatch, 1)
    save_and_wait(acc, {"x": torch.ones(2)}, tmp_path / "c.pt", asynchronous)
    # Synchronously the hook decides (it wrote here: it was told this is a lone write);
    # asynchronously rank 1 takes no snapshot and calls no hook.
    assert len(plugin.saves) == (0 if asynchronous else 1)


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize(
    ("code", "expected"), [(errno.ENOSPC, errno.ENOSPC), (None, errno.EIO)], ids=["ENOSPC", "none"]
)
def test_rank_0s_failure_is_an_os_error_with_its_errno_on_every_rank(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    asynchronous: bool,
    code: int | None,
    expected: int,
) -> None:
    acc = isolated_registry().get_accelerator("cpu")
    play_rank(monkeypatch, 1, word=(code, "OSError: no space left on device"))
    path = tmp_path / "c.pt"
    with pytest.raises(OSError, match="the main process \\(rank 0\\) could not write") as info:
        save_and_wait(acc, {"x": torch.ones(2)}, path, asynchronous)
    assert info.value.errno == expected
    assert info.value.filename == str(path)
    assert "no space left on device" in str(info.value)


def test_the_main_process_raises_its_own_failure_after_telling_the_others(
    tmp_path: Path,
) -> None:
    told: list[Any] = []

    def tell(word: Any) -> Any:
        told.append(word)
        return word

    def write() -> None:
        raise KeyboardInterrupt  # not even an Exception: the others still hear of it

    with pytest.raises(KeyboardInterrupt):
        written_by_main(write, tmp_path / "c.pt", main=True, tell=tell)
    assert told == [(None, "KeyboardInterrupt: ")]


def test_only_accels_background_writer_is_writing_in_background(tmp_path: Path) -> None:
    seen: dict[str, bool] = {"main": writing_in_background()}

    def look(name: str) -> None:
        seen[name] = writing_in_background()

    loop = threading.Thread(target=look, args=("another thread",))  # a loop's, say
    loop.start()
    loop.join()
    with _async_save.one_save_at_a_time():
        pending = _async_save.start_background(tmp_path / "c.pt", look, "the writer")
    pending.wait()
    assert seen == {"main": False, "another thread": False, "the writer": True}


def test_a_pass_through_wrapper_leaves_the_background_write_collective_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The wrapper answers "save", so accel's fallback writes in rank 0's thread: it
    # must only write there, never broadcast on the default group nobody else joins.
    acc = isolated_registry(PassesSaveThrough()).get_accelerator("cpu")
    groups = play_rank(monkeypatch, 0)
    acc.save({"x": torch.ones(2)}, tmp_path / "c.pt", asynchronous=True).wait()
    assert groups == [SAVE_GROUP]
    assert torch.equal(torch.load(tmp_path / "c.pt")["x"], torch.ones(2))
