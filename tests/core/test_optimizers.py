"""Optimizers follow the move: ``model_to_device(model, optimizer=...)``.

Two ways to run the TPU plugin's hooks without torch_xla:

* ``meta``: the ``meta_tpu`` fixture moves to the ``meta`` device, which builds a
  new Parameter per slot (unties) exactly like a move to XLA, but has no values.
* ``cpu``: the same hooks moving to the CPU in torch's overwrite mode, where every
  conversion also builds new Parameters (so ties come apart and are re-tied) while
  the values stay readable and comparable.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import accel
from helpers.fakes import CpuTpuPlugin, MetaTpuPlugin
from helpers.models import OwnTieWeights, ThreeWayTie, TiedLM, UntiesOnPurpose
from helpers.registries import isolated_registry

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]

OPTIMIZERS: dict[str, OptimizerFactory] = {
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, betas=(0.8, 0.9)),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=0.1),
}


class FailingPostMove:
    """A cross-cutting plugin whose post_move_hook raises, after the move itself."""

    @accel.hookimpl
    def post_move_hook(self) -> None:
        raise RuntimeError("post_move_hook failed on purpose")


class Unmovable(torch.Tensor):
    """A tensor that refuses to move: a state entry that makes retargeting fail."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.to:
            raise RuntimeError("this state tensor cannot be moved")
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture
def cpu_tpu(overwrite_mode: None) -> accel.Accelerator:
    registry = isolated_registry(CpuTpuPlugin(), builtins=False)
    return registry.get_accelerator("tpu")


@pytest.fixture(params=["meta", "cpu", pytest.param("xla", marks=pytest.mark.xla)])
def tpu_like(request: pytest.FixtureRequest) -> accel.Accelerator:
    """The TPU hooks moving to `meta`, or to the CPU in overwrite mode (main tier), or
    the real TPU plugin on XLA:CPU (XLA tier)."""
    if request.param == "xla":
        return accel.get_accelerator("tpu")
    name = "meta_tpu" if request.param == "meta" else "cpu_tpu"
    acc: accel.Accelerator = request.getfixturevalue(name)
    return acc


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    """A few optimizer steps on the CPU, so every optimizer has per-parameter state."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        total = torch.zeros(())
        for parameter in model.parameters():
            target = torch.randn(parameter.shape, generator=generator)
            total = total + ((parameter - target) ** 2).sum()
        total.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def _state_snapshot(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    """Per-parameter state by id(parameter): the dict object, and each value and a copy."""
    return {
        id(parameter): {
            "dict": values,
            "items": {
                key: (value, value.detach().clone() if isinstance(value, torch.Tensor) else value)
                for key, value in values.items()
            },
        }
        for parameter, values in optimizer.state.items()
    }


def _assert_unchanged(
    optimizer: torch.optim.Optimizer,
    groups_before: list[list[nn.Parameter]],
    hyper_before: list[dict[str, Any]],
    state_object: Any,
    state_before: dict[int, dict[str, Any]],
) -> None:
    """The optimizer is exactly as captured: same objects, same values."""
    assert len(optimizer.param_groups) == len(groups_before)
    for group, params in zip(optimizer.param_groups, groups_before, strict=True):
        assert len(group["params"]) == len(params)
        assert all(p is q for p, q in zip(group["params"], params, strict=True))
    assert _hyperparameters(optimizer) == hyper_before
    assert optimizer.state is state_object
    assert {id(p) for p in optimizer.state} == set(state_before)
    for parameter, values in optimizer.state.items():
        before = state_before[id(parameter)]
        assert values is before["dict"]
        assert set(values) == set(before["items"])
        for key, value in values.items():
            original, copy = before["items"][key]
            assert value is original
            if isinstance(value, torch.Tensor):
                assert value.device == copy.device
                torch.testing.assert_close(value, copy, rtol=0, atol=0)
            else:
                assert value == copy


def _unique(params: Any) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for parameter in params:
        seen.setdefault(id(parameter), parameter)
    return list(seen.values())


# -- the remap ------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_param_groups_and_state_follow_the_moved_parameters(
    tpu_like: accel.Accelerator, kind: str
) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = OPTIMIZERS[kind](model.parameters())
    _train(model, optimizer)
    old_params = list(model.parameters())
    params_list = optimizer.param_groups[0]["params"]
    hyper_before = _hyperparameters(optimizer)
    defaults_before = dict(optimizer.defaults)
    state_before = {
        name: {key: value.detach().clone() for key, value in optimizer.state[p].items()}
        for name, p in model.named_parameters()
    }
    assert all(state_before.values()), "every parameter has state before the move"

    moved = tpu_like.model_to_device(model, optimizer=optimizer)

    assert moved is model
    assert model.head.weight is model.embed.weight
    new_params = list(model.parameters())
    assert len(new_params) == len(old_params) == 3  # the tied weight counts once
    assert all(new is not old for new, old in zip(new_params, old_params, strict=True))
    (group,) = optimizer.param_groups
    # Updated in place: optimizers such as LBFGS keep a reference to this list.
    assert group["params"] is params_list
    # Same order as before, each the Parameter now in the model: the tied one once.
    assert len(group["params"]) == len(new_params)
    assert all(p is q for p, q in zip(group["params"], new_params, strict=True))
    assert sum(p is model.head.weight for p in group["params"]) == 1
    assert not any(p is old for p in group["params"] for old in old_params)
    assert _hyperparameters(optimizer) == hyper_before
    assert optimizer.defaults == defaults_before
    # State re-keyed: exactly the moved parameters, none of the old ones.
    assert {id(p) for p in optimizer.state} == {id(p) for p in new_params}
    device = tpu_like.device
    for name, parameter in model.named_parameters():
        state = optimizer.state[parameter]
        assert set(state) == set(state_before[name])
        for key, value in state.items():
            before = state_before[name][key]
            if key == "step":
                # Non-capturable, non-fused: torch keeps `step` on the host
                # (Optimizer.load_state_dict does the same), untouched.
                assert value.device.type == "cpu"
                assert value.dtype == before.dtype
            else:
                assert value.device.type == device.type
            assert value.shape == before.shape
            if device.type == "cpu":
                torch.testing.assert_close(value, before, rtol=0, atol=0)


@pytest.mark.parametrize("model_class", [ThreeWayTie, OwnTieWeights])
def test_every_tie_shape_is_one_entry_in_the_optimizer(
    tpu_like: accel.Accelerator, model_class: type[nn.Module]
) -> None:
    model = model_class()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    _train(model, optimizer)
    tpu_like.model_to_device(model, optimizer=optimizer)
    params = optimizer.param_groups[0]["params"]
    assert len({id(p) for p in params}) == len(params)
    assert all(p is q for p, q in zip(params, model.parameters(), strict=True))
    assert {id(p) for p in optimizer.state} == {id(p) for p in model.parameters()}
    for state in optimizer.state.values():
        assert state["exp_avg"].device == tpu_like.device
        assert state["step"].device.type == "cpu"


@pytest.mark.parametrize("flag", ["fused", "capturable"])
def test_fused_or_capturable_step_moves_with_the_parameter(
    meta_tpu: accel.Accelerator, flag: str
) -> None:
    model = TiedLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, **{flag: True})
    # Filled by hand: a capturable Adam refuses to step on the CPU.
    for parameter in model.parameters():
        optimizer.state[parameter] = {
            "step": torch.tensor(3.0, dtype=torch.float32),
            "exp_avg": torch.ones_like(parameter),
            "exp_avg_sq": torch.ones_like(parameter),
        }
    meta_tpu.model_to_device(model, optimizer=optimizer)
    for parameter in model.parameters():
        step = optimizer.state[parameter]["step"]
        # As Optimizer.load_state_dict does for fused/capturable groups.
        assert step.device == parameter.device == torch.device("meta")
        assert step.dtype == torch.float32


def test_several_optimizers_and_a_parameter_not_in_the_model(
    tpu_like: accel.Accelerator,
) -> None:
    model = TiedLM()
    extra = nn.Parameter(torch.ones(3))
    body = torch.optim.SGD(model.body.parameters(), lr=0.1, momentum=0.9)
    tied = torch.optim.Adam(
        [{"params": [model.embed.weight], "lr": 0.01}, {"params": [extra], "lr": 0.5}]
    )
    _train(model, body)
    _train(model, tied)
    _train(nn.ParameterList([extra]), tied)
    extra_state = tied.state[extra]
    extra_values = dict(extra_state)

    # A generator: any iterable of optimizers is accepted.
    tpu_like.model_to_device(model, optimizer=(o for o in (body, tied)))

    assert len(body.param_groups[0]["params"]) == 2
    assert body.param_groups[0]["params"][0] is model.body.weight
    assert body.param_groups[0]["params"][1] is model.body.bias
    assert {id(p) for p in body.state} == {id(model.body.weight), id(model.body.bias)}
    assert tied.param_groups[0]["params"][0] is model.embed.weight is model.head.weight
    assert tied.param_groups[0]["lr"] == 0.01
    # The parameter the model does not own: same object, same state, same tensors.
    assert tied.param_groups[1]["params"][0] is extra
    assert tied.param_groups[1]["lr"] == 0.5
    assert tied.state[extra] is extra_state
    assert all(tied.state[extra][k] is v for k, v in extra_values.items())
    assert extra.device.type == "cpu"
    assert extra_state["exp_avg"].device.type == "cpu"
    assert {id(p) for p in tied.state} == {id(model.embed.weight), id(extra)}
    for optimizer in (body, tied):
        for parameter, state in optimizer.state.items():
            if parameter is extra:
                continue
            assert all(v.device == tpu_like.device for k, v in state.items() if k != "step"), state


def test_training_continues_as_if_the_state_had_been_carried_by_hand(
    cpu_tpu: accel.Accelerator,
) -> None:
    """On CPU in overwrite mode the moved model trains on to the same numbers."""
    torch.manual_seed(0)
    model = TiedLM()
    reference = TiedLM()
    reference.load_state_dict(model.state_dict())
    reference.head.weight = reference.embed.weight
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.05)
    _train(model, optimizer)
    _train(reference, reference_optimizer)

    cpu_tpu.model_to_device(model, optimizer=optimizer)
    _train(model, optimizer, steps=3)
    _train(reference, reference_optimizer, steps=3)

    assert model.head.weight is model.embed.weight
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(
                optimizer.state[p][key], reference_optimizer.state[q][key], rtol=0, atol=0
            )


def test_lbfgs_steps_the_moved_parameters(cpu_tpu: accel.Accelerator) -> None:
    torch.manual_seed(0)
    model = TiedLM()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    cpu_tpu.model_to_device(model, optimizer=optimizer)
    tokens = torch.arange(8)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(tokens).square().mean()
        loss.backward()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step(closure)
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True)), (
        "LBFGS did not change the moved model"
    )


# -- nothing stale is kept ---------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_no_stale_parameter_is_referenced_after_the_move(
    tpu_like: accel.Accelerator, kind: str
) -> None:
    model = TiedLM()
    optimizer = OPTIMIZERS[kind](model.parameters())
    _train(model, optimizer)
    old = [weakref.ref(p) for p in model.parameters()]
    old_grads_or_state = [
        weakref.ref(v) for s in optimizer.state.values() for v in s.values() if v.dim() > 0
    ]
    assert all(ref() is not None for ref in old)

    tpu_like.model_to_device(model, optimizer=optimizer)
    gc.collect()

    assert all(ref() is None for ref in old), "a pre-move Parameter is still referenced"
    if tpu_like.device.type in ("meta", "xla"):
        # State tensors were copied to the device; the CPU originals are gone too.
        assert all(ref() is None for ref in old_grads_or_state)
    assert all(p.device == tpu_like.device for p in optimizer.param_groups[0]["params"])


def test_old_parameters_die_after_several_moves(cpu_tpu: accel.Accelerator) -> None:
    model = TiedLM()
    optimizer = torch.optim.Adam(model.parameters())
    _train(model, optimizer)
    refs = []
    for _ in range(3):
        refs.extend(weakref.ref(p) for p in model.parameters())
        cpu_tpu.model_to_device(model, optimizer=optimizer)
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert len(optimizer.state) == 3


# -- a failed move leaves every optimizer as it was -------------------------------------


def _capture(
    optimizers: list[torch.optim.Optimizer],
) -> list[tuple[Any, ...]]:
    return [
        (
            [list(g["params"]) for g in o.param_groups],
            _hyperparameters(o),
            o.state,
            _state_snapshot(o),
        )
        for o in optimizers
    ]


def _check_all_unchanged(
    optimizers: list[torch.optim.Optimizer], captured: list[tuple[Any, ...]]
) -> None:
    for optimizer, saved in zip(optimizers, captured, strict=True):
        _assert_unchanged(optimizer, *saved)


def test_a_move_that_unties_leaves_every_optimizer_as_it_was(
    tpu_like: accel.Accelerator,
) -> None:
    model = UntiesOnPurpose()
    params = list(model.parameters())
    first = torch.optim.Adam(model.parameters(), lr=0.01)
    second = torch.optim.SGD([model.body.weight], lr=0.1, momentum=0.5)
    _train(model, first)
    _train(model, second)
    captured = _capture([first, second])

    with pytest.raises(accel.WeightTyingError):
        tpu_like.model_to_device(model, optimizer=[first, second])

    _check_all_unchanged([first, second], captured)
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert model.head.weight is model.embed.weight
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_cross_cutting_plugin_failing_leaves_every_optimizer_as_it_was(
    overwrite_mode: None, device: str
) -> None:
    registry = isolated_registry(
        MetaTpuPlugin() if device == "meta" else CpuTpuPlugin(), FailingPostMove(), builtins=False
    )
    acc = registry.get_accelerator("tpu")
    model = TiedLM()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train(model, optimizer)
    captured = _capture([optimizer])

    with pytest.raises(RuntimeError, match="on purpose"):
        acc.model_to_device(model, optimizer=optimizer)

    _check_all_unchanged([optimizer], captured)
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    # The optimizer still trains the model it was built for.
    _train(model, optimizer, steps=1)


def test_a_retarget_failing_in_the_last_optimizer_changes_none(
    tpu_like: accel.Accelerator,
) -> None:
    model = TiedLM()
    params = list(model.parameters())
    first = torch.optim.Adam(model.parameters(), lr=0.01)
    second = torch.optim.Adam(model.parameters(), lr=0.02)
    _train(model, first)
    _train(model, second)
    second.state[model.body.weight]["odd"] = torch.zeros(2).as_subclass(Unmovable)
    captured = _capture([first, second])

    with pytest.raises(RuntimeError, match="cannot be moved"):
        tpu_like.model_to_device(model, optimizer=[first, second])

    _check_all_unchanged([first, second], captured)
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert all(p.device.type == "cpu" for p in model.parameters())


# -- the optimizer= argument ------------------------------------------------------


@pytest.mark.parametrize(
    "make_bad",
    [
        pytest.param(lambda model, opt: "adam", id="str"),
        pytest.param(lambda model, opt: [opt, 3], id="list-with-int"),
        pytest.param(lambda model, opt: model.parameters(), id="parameters"),
        pytest.param(lambda model, opt: {"opt": opt}, id="dict"),
        pytest.param(lambda model, opt: 5, id="int"),
        pytest.param(lambda model, opt: model, id="module"),
        pytest.param(lambda model, opt: nn.Sequential(model), id="iterable-module"),
    ],
)
def test_an_invalid_optimizer_argument_is_a_clear_type_error(
    meta_tpu: accel.Accelerator, make_bad: Callable[[nn.Module, Any], Any]
) -> None:
    model = TiedLM()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    _train(model, optimizer)
    captured = _capture([optimizer])

    with pytest.raises(TypeError, match=r"optimizer.*torch\.optim\.Optimizer"):
        meta_tpu.model_to_device(model, optimizer=make_bad(model, optimizer))

    _check_all_unchanged([optimizer], captured)
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_no_optimizer_and_an_empty_list_are_accepted(meta_tpu: accel.Accelerator) -> None:
    model = meta_tpu.model_to_device(TiedLM(), optimizer=[])
    assert model.embed.weight.device.type == "meta"
    model = meta_tpu.model_to_device(TiedLM(), optimizer=None)
    assert model.head.weight is model.embed.weight


# -- CPU to CPU: nothing changes ------------------------------------------------------


def test_cpu_to_cpu_with_an_optimizer_changes_nothing_observable(
    registry: accel.AcceleratorRegistry,
) -> None:
    acc = registry.get_accelerator("cpu")
    torch.manual_seed(0)
    model = TiedLM()
    twin = TiedLM()
    twin.load_state_dict(model.state_dict())
    twin.head.weight = twin.embed.weight
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=0.05)
    _train(model, optimizer)
    _train(twin, twin_optimizer)
    params = list(model.parameters())
    hyper = _hyperparameters(optimizer)
    state_object = optimizer.state
    state_before = _state_snapshot(optimizer)
    saved = optimizer.state_dict()

    assert acc.model_to_device(model, optimizer=optimizer) is model

    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert all(p is q for p, q in zip(optimizer.param_groups[0]["params"], params, strict=True))
    assert _hyperparameters(optimizer) == hyper
    assert optimizer.state is state_object
    assert {id(p) for p in optimizer.state} == set(state_before)
    for parameter, state in optimizer.state.items():
        for key, value in state.items():
            original, copy = state_before[id(parameter)]["items"][key]
            assert value is original  # not even copied
            torch.testing.assert_close(value, copy, rtol=0, atol=0)
    after = optimizer.state_dict()
    assert after["param_groups"] == saved["param_groups"]
    assert after["state"].keys() == saved["state"].keys()
    # It trains on exactly like the optimizer nobody moved.
    _train(model, optimizer, steps=2)
    _train(twin, twin_optimizer, steps=2)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


# -- an optimizer that holds none of the model's parameters ---------------------------


def test_an_optimizer_built_before_an_earlier_move_is_refused(
    meta_tpu: accel.Accelerator,
) -> None:
    model = TiedLM()
    stale = torch.optim.SGD(model.parameters(), lr=0.1)
    meta_tpu.model_to_device(model)  # the optimizer was not passed: its parameters are gone
    params = list(model.parameters())

    with pytest.raises(ValueError, match="holds none of the parameters") as info:
        meta_tpu.model_to_device(model, optimizer=stale)

    message = str(info.value)
    assert message.startswith(
        "optimizer= holds none of the parameters of the model being moved (TiedLM, 3 parameters)"
    )
    assert "the SGD optimizer holds 3 parameters (shapes (16, 8), (8, 8), (8,); on cpu)" in message
    assert "pass it to every move" in message
    # Refused before anything moved.
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert all(p.device.type == "cpu" for p in stale.param_groups[0]["params"])


def test_several_optimizers_holding_none_are_each_named(
    registry: accel.AcceleratorRegistry,
) -> None:
    model = TiedLM()
    other = nn.Linear(2, 2)
    wrong = [torch.optim.SGD(other.parameters(), lr=0.1), torch.optim.Adam([other.weight])]
    with pytest.raises(ValueError, match="holds none of the parameters") as info:
        registry.get_accelerator("cpu").model_to_device(model, optimizer=wrong)
    assert (
        "optimizer 0 (SGD) holds 2 parameters (shapes (2, 2), (2,); on cpu); "
        "optimizer 1 (Adam) holds 1 parameter (shapes (2, 2); on cpu)."
    ) in str(info.value)


def test_an_optimizer_of_another_model_passed_beside_the_right_one_is_left_alone(
    registry: accel.AcceleratorRegistry,
) -> None:
    # accelerate's prepare(model_a, model_b, opt_a, opt_b) moves each model with both.
    model, other = TiedLM(), nn.Linear(2, 2)
    own, others = (
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.optim.SGD(other.parameters(), lr=0.1),
    )
    registry.get_accelerator("cpu").model_to_device(model, optimizer=[own, others])
    assert own.param_groups[0]["params"][0] is model.embed.weight
    assert others.param_groups[0]["params"] == [other.weight, other.bias]
