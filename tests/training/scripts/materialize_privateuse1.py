"""acc.materialize onto a real PrivateUse1 backend (tests/helpers/python_device.py),
through accel's accelerator of a device without a plugin, selected by the device's
name. A process of its own: renaming PrivateUse1 lasts for the process.

Usage: ``materialize_privateuse1.py NAME DIRECTORY``; prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from helpers.python_device import install

name, directory = sys.argv[1], Path(sys.argv[2])
install(name)

import accel  # noqa: E402  (after the backend is registered)
from helpers.models import RotaryTiedLM, ThreeWayTie, TiedLM  # noqa: E402


def on_meta(build: Any) -> nn.Module:
    with torch.device("meta"):
        return build()  # type: ignore[no-any-return]


def slots(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),
    }


def shape(model: nn.Module) -> dict[str, Any]:
    return {
        "devices": sorted({t.device.type for t in slots(model).values()}),
        "tied": model.head.weight is model.embed.weight,
        "parameters": len(list(model.parameters())),
    }


def equal(model: nn.Module, reference: nn.Module) -> bool:
    ours, theirs = model.state_dict(), reference.state_dict()
    return ours.keys() == theirs.keys() and all(
        torch.equal(ours[key].cpu(), theirs[key].cpu()) for key in ours
    )


def small_normal(model: nn.Module) -> None:
    for parameter in model.parameters():
        nn.init.normal_(parameter, std=0.02)


acc = accel.get_accelerator(name)
row = next(r for r in accel.list_accelerators() if r.name == name)
result: dict[str, Any] = {"accelerator": {"provider": row.provider, "device": str(acc.device)}}

untied = on_meta(TiedLM)
untied.to_empty(device=acc.device)
result["to_empty"] = {k: v for k, v in shape(untied).items() if k != "devices"}

model = on_meta(TiedLM)
torch.manual_seed(5)
acc.materialize(model)
torch.manual_seed(5)
with torch.device(acc.device):
    on_the_device = TiedLM()
torch.manual_seed(5)
on_cpu = TiedLM()
tokens = torch.tensor([[1, 2, 3, 4]])
result["default"] = {
    **shape(model),
    "equal_to_eager_on_the_device": equal(model, on_the_device),
    "equal_to_eager_on_cpu": equal(model, on_cpu),
    "same_output_as_eager_on_cpu": bool(
        torch.equal(model(tokens.to(acc.device)).cpu(), on_cpu(tokens))
    ),
}

three = on_meta(ThreeWayTie)
acc.materialize(three)
result["three_way"] = {
    "devices": sorted({t.device.type for t in slots(three).values()}),
    "slots_of_the_shared_weight": sum(t is three.shared.weight for t in slots(three).values()),
    "parameters": len(list(three.parameters())),
}

model = on_meta(TiedLM)
torch.manual_seed(7)
acc.materialize(model, init=small_normal)
eager = TiedLM()
torch.manual_seed(7)
small_normal(eager)
result["init"] = {**shape(model), "equal_to_eager_plus_init": equal(model, eager)}

torch.manual_seed(9)
source = TiedLM()
accel.get_accelerator("cpu").save({"model": source}, directory / "source.pt")
model = on_meta(TiedLM)
acc.materialize(model, load=directory / "source.pt")
result["load"] = {**shape(model), "equal_to_source": equal(model, source)}

model = on_meta(RotaryTiedLM)
before = slots(model)
try:
    acc.materialize(model)
except accel.AcceleratorValueError as error:
    result["unwritten"] = {"error": type(error).__name__, "message": str(error)}
now = slots(model)
result["unwritten"]["restored"] = {
    "same_tensors": now.keys() == before.keys() and all(now[k] is before[k] for k in now),
    "devices": sorted({t.device.type for t in now.values()}),
}
print(json.dumps(result))
