"""The ``restore_to_device`` hook: ``acc.load(path, state)`` offers a plugin, in one call,
each distinct tensor that ``load_state_dict`` would copy to the device unchanged, and
the modules and optimizers load the copies it returns; an answer that does not fit is
a PluginError naming the plugin, raised before anything was restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import accel
from helpers.fakes import FakeAccelerator
from helpers.models import TiedLM
from helpers.registries import isolated_registry


class Uploading(FakeAccelerator):
    """A CPU-backed accelerator whose restore_to_device copies and records."""

    def __init__(self, answer: Any = None) -> None:
        super().__init__("uploading")
        self.offered: list[list[torch.Tensor]] = []
        self.returned: list[torch.Tensor] = []
        self.answer = answer

    @accel.hookimpl
    def restore_to_device(self, tensors: list[torch.Tensor]) -> Any:
        self.offered.append(list(tensors))
        if self.answer is not None:
            return self.answer
        self.returned = [tensor.clone() for tensor in tensors]
        return self.returned


class OwnLoading(torch.optim.SGD):
    """An optimizer with a load_state_dict of its own: its state is not offered."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)


def _trained(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = TiedLM()
    model.register_buffer("counts", torch.arange(4, dtype=torch.int64))
    optimizer = torch.optim.AdamW([model.embed.weight, model.body.weight], lr=0.1)
    other = OwnLoading([model.body.bias], lr=0.1, momentum=0.9)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    other.step()
    return {"model": model, "optimizer": optimizer, "other": other}


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    saved = _trained(0)
    path = tmp_path / "c.pt"
    accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu").save(saved, path)
    stored = torch.load(path, weights_only=True)
    stored["model"]["counts"] = stored["model"]["counts"].int()  # another dtype: not offered
    torch.save(stored, path)
    return path, saved


def test_each_device_bound_tensor_is_offered_once_and_its_copy_is_loaded(tmp_path: Path) -> None:
    path, saved = _checkpoint(tmp_path)
    plugin = Uploading()
    acc = isolated_registry(plugin).get_accelerator("uploading")
    fresh = _trained(1)
    remainder = acc.load(path, fresh)
    assert remainder == {}

    [offered] = plugin.offered  # one call
    # The tied weight once, body.weight and body.bias; AdamW's two moments of each of
    # its two parameters. Not: the int32 counts (cast by load_state_dict), AdamW's
    # steps, OwnLoading's momentum.
    model, optimizer = saved["model"], saved["optimizer"]
    expected = [model.embed.weight, model.body.weight, model.body.bias]
    expected += [
        optimizer.state[parameter][name]
        for parameter in (model.embed.weight, model.body.weight)
        for name in ("exp_avg", "exp_avg_sq")
    ]
    assert len(offered) == len(expected)
    for tensor, reference in zip(offered, expected, strict=True):
        assert torch.equal(tensor, reference)
    moments = fresh["optimizer"].state[fresh["model"].embed.weight]
    assert moments["exp_avg"] is plugin.returned[3]  # the copy itself, not a copy of it
    assert fresh["model"].head.weight is fresh["model"].embed.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh["model"].state_dict()[name], tensor), name
    assert fresh["model"].counts.dtype == torch.int64
    for key in ("optimizer", "other"):
        assert repr(fresh[key].state_dict()) == repr(saved[key].state_dict()), key


def test_a_model_saved_on_its_own_is_offered_too(tmp_path: Path) -> None:
    torch.manual_seed(0)
    saved = TiedLM()
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    cpu.save(saved, tmp_path / "m.pt")
    plugin = Uploading()
    fresh = TiedLM()
    acc = isolated_registry(plugin).get_accelerator("uploading")
    assert acc.load(tmp_path / "m.pt", fresh) == {}
    assert [len(call) for call in plugin.offered] == [3]
    assert torch.equal(fresh.body.weight, saved.body.weight)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ([torch.zeros(1)], "returned 1 values for 7 tensors"),
        ("uploaded", "returned str for 7 tensors"),
        ([torch.zeros(1)] * 7, "returned at index 0 a torch.float32 tensor of shape (1,)"),
    ],
    ids=["too-few", "not-a-list", "wrong-shape"],
)
def test_an_answer_that_does_not_fit_is_a_plugin_error_and_restores_nothing(
    answer: Any, problem: str, tmp_path: Path
) -> None:
    path, _ = _checkpoint(tmp_path)
    acc = isolated_registry(Uploading(answer)).get_accelerator("uploading")
    fresh = _trained(1)
    before = {name: tensor.clone() for name, tensor in fresh["model"].state_dict().items()}
    moment = fresh["optimizer"].state[fresh["model"].body.weight]["exp_avg"].clone()
    with pytest.raises(accel.PluginError, match="hook 'restore_to_device'") as raised:
        acc.load(path, fresh)
    assert problem in str(raised.value) and "Uploading" in str(raised.value)
    for name, tensor in fresh["model"].state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert torch.equal(fresh["optimizer"].state[fresh["model"].body.weight]["exp_avg"], moment)
