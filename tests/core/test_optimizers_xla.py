"""Optimizers follow the move to a real XLA device (XLA:CPU, PJRT_DEVICE=CPU).

An Adam optimizer built on the CPU, and already stepped there, is handed to
``model_to_device``; the model then trains on exactly as one whose optimizer state
was carried over by hand.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from torch import nn

import accel
from helpers.models import TiedLM

pytestmark = pytest.mark.xla

CPU_STEPS = 3
XLA_STEPS = 4
HYPER = {"lr": 0.05, "betas": (0.8, 0.95), "weight_decay": 0.01}


def _sync() -> None:
    import torch_xla

    torch_xla.sync()


def _tokens() -> torch.Tensor:
    return torch.arange(24) % 11


def _new_model() -> tuple[TiedLM, torch.optim.Adam]:
    torch.manual_seed(0)
    model = TiedLM(vocab=16, width=16)
    return model, torch.optim.Adam(model.parameters(), **HYPER)


def _step(model: TiedLM, optimizer: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    """One training step; returns the loss and keeps no reference to its graph."""
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(tokens[:-1]), tokens[1:])
    loss.backward()
    optimizer.step()
    if tokens.device.type == "xla":
        _sync()
    return float(loss.item())


def _train_on_cpu(model: TiedLM, optimizer: torch.optim.Optimizer) -> list[float]:
    tokens = _tokens()
    return [_step(model, optimizer, tokens) for _ in range(CPU_STEPS)]


def _move_by_hand(
    model: TiedLM, optimizer: torch.optim.Adam, device: torch.device
) -> torch.optim.Adam:
    """The reference: bare .to(), re-tie by hand, a new Adam carrying the old state."""
    names = {id(p): name for name, p in model.named_parameters()}  # one name per tie
    old_state = {names[id(p)]: state for p, state in optimizer.state.items()}
    model.to(device)
    assert model.head.weight is not model.embed.weight  # XLA really untied it
    model.head.weight = model.embed.weight
    carried = torch.optim.Adam(model.parameters(), **HYPER)
    by_name = dict(model.named_parameters())
    for name, state in old_state.items():
        # `step` stays a host tensor, as torch keeps it for non-capturable Adam.
        carried.state[by_name[name]] = {
            key: value if key == "step" else value.to(device) for key, value in state.items()
        }
    return carried


def _params_on_cpu(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu() for name, p in model.named_parameters()}


def _state_on_cpu(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        f"{name}.{key}": value.detach().cpu()
        for name, p in model.named_parameters()
        for key, value in optimizer.state[p].items()
    }


def test_adam_stepped_on_cpu_trains_on_like_state_carried_by_hand() -> None:
    acc = accel.get_accelerator("tpu")
    assert acc.device.type == "xla"

    model_a, opt_a = _new_model()
    model_b, opt_b = _new_model()
    cpu_losses_a = _train_on_cpu(model_a, opt_a)
    cpu_losses_b = _train_on_cpu(model_b, opt_b)
    assert cpu_losses_a == cpu_losses_b  # the same start, bit for bit
    old_embed = weakref.ref(model_a.embed.weight)

    assert acc.model_to_device(model_a, optimizer=opt_a) is model_a
    opt_b = _move_by_hand(model_b, opt_b, acc.device)

    gc.collect()
    assert old_embed() is None, "the pre-move CPU Parameter is still referenced"
    assert model_a.head.weight is model_a.embed.weight
    (group,) = opt_a.param_groups
    assert all(p is q for p, q in zip(group["params"], model_a.parameters(), strict=True))
    for parameter in model_a.parameters():
        state = opt_a.state[parameter]
        assert state["exp_avg"].device == acc.device
        assert state["exp_avg_sq"].device == acc.device
        assert state["step"].device.type == "cpu"
        assert float(state["step"]) == CPU_STEPS

    tokens_a = acc.batch_to_device(_tokens())
    tokens_b = _tokens().to(acc.device)
    losses_a, losses_b = [], []
    for _ in range(XLA_STEPS):
        losses_a.append(_step(model_a, opt_a, tokens_a))
        losses_b.append(_step(model_b, opt_b, tokens_b))
        assert model_a.head.weight is model_a.embed.weight
        assert model_b.head.weight is model_b.embed.weight
        assert opt_a.param_groups[0]["params"][0] is model_a.embed.weight

    # Both runs execute the same XLA computations on the same inputs, so the
    # numbers are identical, not merely close.
    torch.testing.assert_close(losses_a, losses_b, rtol=0, atol=0)
    torch.testing.assert_close(_params_on_cpu(model_a), _params_on_cpu(model_b), rtol=0, atol=0)
    torch.testing.assert_close(
        _state_on_cpu(model_a, opt_a), _state_on_cpu(model_b, opt_b), rtol=0, atol=0
    )
    # And it learned on the device: the loss kept going down after the move.
    assert losses_a[-1] < cpu_losses_a[-1]
    assert all(p.device == acc.device for p in model_a.parameters())


# Every other optimizer test runs on XLA too: tests/core/test_optimizers.py's `tpu_like`
# fixture has an `xla` case, which the XLA tier runs.
