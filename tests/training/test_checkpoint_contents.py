"""What a checkpoint holds: what acc.save accepts acc.load reads back (or save refuses
it before writing), modules and optimizers anywhere in the object are stored as state
dicts, compiled models round-trip, and a load that does not fit changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import accel
from helpers.models import TiedLM


def _stepped(model: nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()
    return optimizer


# -- what save stores, load reads back --------------------------------------------------


def test_a_module_or_optimizer_saved_on_its_own_loads_back_in_place(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = _stepped(model)
    acc.save(model, tmp_path / "m.pt")
    acc.save(optimizer, tmp_path / "o.pt")
    stored = acc.load(tmp_path / "m.pt")  # the state dict, a tie stored once
    assert stored["embed.weight"] is stored["head.weight"]
    assert torch.equal(stored["body.weight"], model.body.weight)

    fresh = TiedLM()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    assert acc.load(tmp_path / "m.pt", fresh) == {}
    assert acc.load(tmp_path / "o.pt", fresh_optimizer) == {}
    assert fresh.head.weight is fresh.embed.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    assert repr(fresh_optimizer.state_dict()) == repr(optimizer.state_dict())


def test_objects_with_state_in_nested_dicts_and_lists_are_stored_as_state_dicts(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    model = TiedLM()
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1), _stepped(model)]
    acc.save({"models": {"a": model}, "optimizers": optimizers, "step": 3}, tmp_path / "n.pt")
    stored = acc.load(tmp_path / "n.pt")
    assert stored["step"] == 3
    assert stored["models"]["a"]["embed.weight"] is stored["models"]["a"]["head.weight"]
    assert stored["optimizers"][0]["param_groups"][0]["lr"] == 0.1
    assert stored["optimizers"][1]["state"][0]["exp_avg"].shape == (16, 8)


class _Point(NamedTuple):
    x: int


@pytest.mark.parametrize(
    ("value", "where", "kind"),
    [
        ({"a": {"b": [1, _Point(1)]}}, r"obj\['a'\]\['b'\]\[1\]", "_Point"),
        ({"fn": len}, r"obj\['fn'\]", "builtin_function_or_method"),
        ({"x": __import__("numpy").float64(1.0)}, r"obj\['x'\]", "numpy.float64"),
        (object(), "the object itself", "builtins.object"),
        ({"k": {_Point(1): 1}}, r"obj\['k'\]\[_Point\(x=1\)\] \(the key itself\)", "_Point"),
    ],
)
def test_what_load_could_not_read_is_refused_before_anything_is_written(
    acc: accel.Accelerator, tmp_path: Path, value: Any, where: str, kind: str
) -> None:
    path = tmp_path / "c.pt"
    acc.save({"step": 1}, path)
    with pytest.raises(TypeError, match=rf"save\(obj, path\): {where} is a \S*{kind}"):
        acc.save(value, path)
    assert acc.load(path) == {"step": 1}  # the previous checkpoint, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_a_type_allowed_with_add_safe_globals_is_saved(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    with torch.serialization.safe_globals([_Point]):
        acc.save({"p": _Point(2)}, tmp_path / "c.pt")
        assert acc.load(tmp_path / "c.pt") == {"p": _Point(2)}


def test_a_state_dict_saved_in_a_dict_keeps_its_metadata_beside_a_module(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    model = nn.BatchNorm1d(2)
    acc.save({"raw": model.state_dict(), "model": model}, tmp_path / "c.pt")
    stored = acc.load(tmp_path / "c.pt")
    assert stored["raw"]._metadata == model.state_dict()._metadata  # the BN version


# -- compiled models -------------------------------------------------------------------


def test_a_compiled_models_checkpoint_loads_into_a_compiled_model(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    source = nn.Linear(3, 3)
    acc.save({"model": acc.compile(source)}, tmp_path / "c.pt")
    target = nn.Linear(3, 3)
    compiled = acc.compile(target)
    assert acc.load(tmp_path / "c.pt", {"model": compiled}) == {}
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    acc.load(tmp_path / "c.pt", {"model": nn.Linear(3, 3)})  # and into a plain one
    with pytest.raises(ValueError, match=r"parameter 'weight' of entry 'model'.*\(3, 3\)"):
        acc.load(tmp_path / "c.pt", {"model": acc.compile(nn.Linear(3, 4))})


# -- a load that does not fit changes nothing ------------------------------------------


def _two_groups(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)


@pytest.mark.parametrize(
    ("make_optimizer", "message"),
    [
        (_two_groups, r"entry 'opt' of .* holds 1 parameter group\(s\), but the SGD of "),
        (
            lambda m: torch.optim.SGD([m.weight], lr=0.1),
            r"parameter group 0 of entry 'opt' .* has 2 parameter\(s\), but that group .* has 1",
        ),
    ],
)
def test_an_optimizer_that_does_not_fit_leaves_the_model_unrestored(
    acc: accel.Accelerator, tmp_path: Path, make_optimizer: Any, message: str
) -> None:
    saved = nn.Linear(3, 3)
    acc.save({"model": saved, "opt": torch.optim.SGD(saved.parameters(), lr=0.1)}, tmp_path / "c")
    model = nn.Linear(3, 3)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        acc.load(tmp_path / "c", {"model": model, "opt": make_optimizer(model)})
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_optimizer_state_of_another_shape_is_refused_before_restoring(
    acc: accel.Accelerator, tmp_path: Path
) -> None:
    saved = TiedLM()
    acc.save({"model": saved, "opt": _stepped(saved)}, tmp_path / "c.pt")
    model = TiedLM(vocab=20)  # same parameter count, other shapes
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"optimizer state 'exp_avg' of parameter 0 in entry"):
        acc.load(tmp_path / "c.pt", {"opt": optimizer})
    assert optimizer.state_dict()["state"] == {}
    with pytest.raises(ValueError, match="is not an optimizer's state dict"):
        acc.load(tmp_path / "c.pt", {"model": optimizer})
