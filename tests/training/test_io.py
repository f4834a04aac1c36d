"""memory_stats, device_loader, state_dict and save on the handle: the CPU, a plugin
that implements the hooks, and one that leaves them to accel's fallbacks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from accel.training.batch import BatchMover
from accel.training.memory import MEMORY_KEYS
from helpers.models import TiedLM
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator, RecordingAccelerator

# -- memory_stats -----------------------------------------------------------------


def test_cpu_memory_stats_report_the_process_and_the_machine() -> None:
    stats = isolated_registry().get_accelerator("cpu").memory_stats()
    assert tuple(stats) == MEMORY_KEYS
    allocated, peak, total = (stats[key] for key in MEMORY_KEYS)  # type: ignore[literal-required]
    assert isinstance(allocated, int) and isinstance(peak, int) and isinstance(total, int)
    assert 10 * 2**20 < allocated <= peak < total  # torch alone is tens of MiB


def test_a_third_party_accelerator_reports_unknown_memory_unless_its_plugin_says() -> None:
    registry = isolated_registry(BareAccelerator(), RecordingAccelerator())
    assert registry.get_accelerator("bare").memory_stats() == dict.fromkeys(MEMORY_KEYS)
    assert registry.get_accelerator("rec").memory_stats() == {
        "allocated_bytes": 1,
        "peak_allocated_bytes": 2,
        "total_bytes": None,
    }


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        ([1, 2, 3], "returned list"),
        ({"allocated_bytes": 1}, "returned keys"),
        ({"allocated_bytes": -1, "peak_allocated_bytes": 0, "total_bytes": 0}, "int >= 0 or None"),
        ({"allocated_bytes": 1.5, "peak_allocated_bytes": 0, "total_bytes": 0}, "int >= 0"),
    ],
)
def test_memory_stats_of_the_wrong_shape_name_the_plugin(returned: object, match: str) -> None:
    class Sloppy(BareAccelerator):
        @accel.hookimpl
        def memory_stats(self) -> object:
            return returned

    registry = isolated_registry()
    registry.register(Sloppy("npu"), name="sloppy-npu")
    with pytest.raises(accel.PluginError, match=match) as info:
        registry.get_accelerator("npu").memory_stats()
    assert "plugin 'sloppy-npu'" in str(info.value)


# -- device_loader ----------------------------------------------------------------


def _batches(count: int = 3) -> list[dict[str, Any]]:
    return [{"x": torch.full((2,), float(i)), "i": i} for i in range(count)]


def test_cpu_device_loader_hands_out_the_batches_untouched_epoch_after_epoch() -> None:
    batches = _batches()
    loader = isolated_registry().get_accelerator("cpu").device_loader(batches)
    assert len(loader) == 3
    for _ in range(2):
        assert [id(b) for b in loader] == [id(b) for b in batches]


def test_device_loader_wraps_a_dataloader() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(10.0).unsqueeze(1))
    data = torch.utils.data.DataLoader(dataset, batch_size=4)
    for name in ("cpu", "bare"):
        loader = isolated_registry(BareAccelerator()).get_accelerator(name).device_loader(data)
        assert len(loader) == 3 and loader.loader is data
        assert torch.equal(torch.cat([x for (x,) in loader]), dataset.tensors[0])


def test_the_fallback_device_loader_moves_each_batch_through_the_batch_hooks() -> None:
    class MovingBare(BareAccelerator):
        def __init__(self) -> None:
            super().__init__("bare")
            self.moved: list[int] = []

        @accel.hookimpl
        def batch_to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
            self.moved.append(batch["i"])
            return {**batch, "moved": True}

    plugin = MovingBare()
    loader = isolated_registry(plugin).get_accelerator("bare").device_loader(_batches())
    iterator = iter(loader)
    first = next(iterator)
    assert first["moved"] and plugin.moved == [0]  # moved as taken, not all up front
    assert [b["i"] for b in iterator] == [1, 2] and plugin.moved == [0, 1, 2]


def test_a_device_loader_hook_gets_move_batch_itself_unless_a_plugin_moves_batches() -> None:
    class KeepsMove(BareAccelerator):
        def __init__(self) -> None:
            super().__init__("keeps")
            self.moves: list[Any] = []

        @accel.hookimpl
        def device_loader(self, loader: Any, move: Any) -> Any:
            self.moves.append(move)
            return [move(batch) for batch in loader]

    class TagsBatches:
        @accel.hookimpl
        def batch_to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
            return {**batch, "tagged": True}

    plugin = KeepsMove()
    registry = isolated_registry(plugin)
    plain = list(registry.get_accelerator("keeps").device_loader(_batches(1)))
    registry.register(TagsBatches())
    tagged = list(registry.get_accelerator("keeps").device_loader(_batches(1)))
    # No plugin moves batches: the hook may recognise accel's own mover (the TPU's
    # loader skips it for batches torch_xla already moved whole).
    assert isinstance(plugin.moves[0], BatchMover) and plugin.moves[0].device.type == "cpu"
    assert "tagged" not in plain[0] and torch.equal(plain[0]["x"], torch.zeros(2))
    assert not isinstance(plugin.moves[1], BatchMover) and tagged[0]["tagged"] is True


def test_a_plugins_device_loader_decides_how_batches_travel() -> None:
    plugin = RecordingAccelerator()
    batches = _batches(2)
    loader = isolated_registry(plugin).get_accelerator("rec").device_loader(batches)
    assert [tag for tag, _ in loader] == ["seen", "seen"]
    assert plugin.calls == [("device_loader", {"loader": batches})]


def test_device_loader_rejects_what_is_not_a_loader_and_len_needs_a_sized_loader() -> None:
    acc = isolated_registry().get_accelerator("cpu")
    for bad in (42, "batches", None):
        with pytest.raises(TypeError, match=r"expects an iterable of batches"):
            acc.device_loader(bad)  # type: ignore[arg-type]
    endless = acc.device_loader(iter(_batches()))
    with pytest.raises(TypeError, match=r"\(list_iterator\) has no len\(\)"):
        len(endless)


def test_a_plugins_device_loader_must_return_an_iterable() -> None:
    class Sloppy(BareAccelerator):
        @accel.hookimpl
        def device_loader(self) -> int:
            return 3

    registry = isolated_registry()
    registry.register(Sloppy("npu"), name="sloppy-npu")
    with pytest.raises(accel.PluginError, match=r"returned int, not an iterable.*'sloppy-npu'"):
        registry.get_accelerator("npu").device_loader(_batches())


@pytest.mark.parametrize("name", ["cpu", "bare"])
def test_a_loader_that_raises_midway_raises_in_the_loop_after_the_good_batches(name: str) -> None:
    def failing() -> Iterator[dict[str, Any]]:
        yield from _batches(2)
        raise OSError("shard 3 is unreadable")

    class Loader:
        def __iter__(self) -> Iterator[dict[str, Any]]:
            return failing()

    loader = isolated_registry(BareAccelerator()).get_accelerator(name).device_loader(Loader())
    seen: list[int] = []

    def consume() -> None:
        for batch in loader:
            seen.append(batch["i"])

    with pytest.raises(OSError, match=r"shard 3 is unreadable"):
        consume()
    assert seen == [0, 1]


# -- state_dict and save ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["cpu", "bare", "rec"])
def test_state_dict_keeps_a_tied_weight_one_cpu_tensor(name: str) -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(BareAccelerator(), plugin).get_accelerator(name)
    model = TiedLM()
    state = acc.state_dict(model)
    assert list(state) == list(model.state_dict())
    assert state["embed.weight"] is state["head.weight"]
    assert all(t.device.type == "cpu" and not t.requires_grad for t in state.values())
    assert torch.equal(state["body.weight"], model.body.weight)
    if name == "rec":
        assert plugin.hooks_called() == ["state_dict"]


def test_save_then_load_into_a_fresh_model_keeps_ties_and_values(tmp_path: Path) -> None:
    acc = isolated_registry().get_accelerator("cpu")
    model = TiedLM()
    path = tmp_path / "model.pt"
    acc.save(acc.state_dict(model), path)
    loaded = torch.load(path)
    assert loaded["embed.weight"] is loaded["head.weight"]  # stored once
    fresh = TiedLM()
    fresh.load_state_dict(loaded)
    assert fresh.head.weight is fresh.embed.weight
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value)


def test_save_moves_nested_tensors_once_and_keeps_other_values(tmp_path: Path) -> None:
    acc = isolated_registry().get_accelerator("cpu")
    shared = torch.ones(3, requires_grad=True)
    acc.save({"step": 7, "pair": (shared, shared), "name": "run-1"}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt")
    assert loaded["step"] == 7 and loaded["name"] == "run-1"
    assert isinstance(loaded["pair"], tuple) and loaded["pair"][0] is loaded["pair"][1]
    assert not loaded["pair"][0].requires_grad


def test_only_the_main_process_of_a_distributed_job_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc = isolated_registry().get_accelerator("cpu")
    told: list[list[object]] = []  # what rank 0 broadcast: None, the file is complete
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(
        torch.distributed, "broadcast_object_list", lambda objects, src: told.append(objects)
    )
    # Every rank's generators are gathered first: here both ranks hold the same.
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(
        torch.distributed,
        "all_gather_object",
        lambda gathered, obj, group=None: gathered.__setitem__(slice(None), [obj] * 2),
    )
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    acc.save({"x": torch.ones(1)}, tmp_path / "rank1.pt")
    assert not (tmp_path / "rank1.pt").exists()
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    acc.save({"x": torch.ones(1)}, tmp_path / "rank0.pt")
    assert torch.equal(torch.load(tmp_path / "rank0.pt")["x"], torch.ones(1))
    assert told == [[None], [None]]  # every rank waited for rank 0's word


def test_a_plugins_save_hook_decides_the_writing(tmp_path: Path) -> None:
    plugin = RecordingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("rec")
    acc.save({"x": torch.ones(1)}, tmp_path / "x.pt")
    # The step is marked first, so that lazy tensors cross to the CPU as data.
    assert plugin.hooks_called() == ["mark_step", "save"]
    assert not (tmp_path / "x.pt").exists()


def test_state_dict_and_save_reject_bad_input(tmp_path: Path) -> None:
    acc = isolated_registry().get_accelerator("cpu")
    with pytest.raises(TypeError, match=r"state_dict expects a torch.nn.Module, got dict"):
        acc.state_dict({"w": torch.ones(1)})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"save expects a file path .* got int"):
        acc.save({}, 3)  # type: ignore[arg-type]
