"""acc.clip_grad_norm_ on the CPU and through third-party plugins: equal to torch's,
the norm as a tensor, a plugin's own clipping asked, bad arguments and results refused."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import accel
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator


def _model_with_gradients(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model(torch.randn(16, 4)).pow(2).sum().mul(10).backward()  # a norm well above 1
    return model


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("accelerator", ["cpu", "bare"])
def test_clipping_equals_torchs(accelerator: str, norm_type: float) -> None:
    acc = isolated_registry(BareAccelerator()).get_accelerator(accelerator)
    ours, theirs = _model_with_gradients(), _model_with_gradients()
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0, norm_type)
    norm = acc.clip_grad_norm_(ours.parameters(), max_norm=1.0, norm_type=norm_type)
    assert isinstance(norm, torch.Tensor) and norm.ndim == 0
    assert norm.item() > 1.0  # the control: there was something to clip
    torch.testing.assert_close(norm, expected, rtol=0, atol=0)
    for mine, reference in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert mine.grad is not None and reference.grad is not None
        torch.testing.assert_close(mine.grad, reference.grad, rtol=0, atol=0)


def test_a_single_tensor_and_parameters_without_gradients_are_clipped_like_torch() -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    weight = torch.nn.Parameter(torch.zeros(3))
    weight.grad = torch.tensor([3.0, 4.0, 0.0])
    unused = torch.nn.Parameter(torch.ones(2))  # no gradient: left out, as torch does
    norm = cpu.clip_grad_norm_([weight, unused], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    torch.testing.assert_close(weight.grad, torch.tensor([0.6, 0.8, 0.0]), rtol=1e-5, atol=1e-6)
    assert unused.grad is None
    assert cpu.clip_grad_norm_(weight, max_norm=10.0).item() == pytest.approx(1.0)


def test_infinite_max_norm_measures_without_clipping() -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    model = _model_with_gradients()
    before = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    norm = cpu.clip_grad_norm_(model.parameters(), max_norm=math.inf)
    assert norm.item() > 1.0
    after = [p.grad for p in model.parameters() if p.grad is not None]
    for old, new in zip(before, after, strict=True):
        torch.testing.assert_close(old, new, rtol=0, atol=0)


class ClippingAccelerator(BareAccelerator):
    """Clips in a way of its own: halves every gradient and reports a fixed norm."""

    def __init__(self) -> None:
        super().__init__("clipper")
        self.seen: list[dict[str, Any]] = []

    @accel.hookimpl
    def clip_grad_norm_(
        self, parameters: list[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        self.seen.append({"count": len(parameters), "max": max_norm, "type": norm_type})
        for param in parameters:
            if param.grad is not None:
                param.grad.mul_(0.5)
        return torch.tensor(42.0)


def test_a_plugins_clipping_is_asked_with_the_parameters_as_a_list() -> None:
    plugin = ClippingAccelerator()
    acc = isolated_registry(plugin).get_accelerator("clipper")
    model = _model_with_gradients()
    before = model[0].weight.grad.clone()  # type: ignore[union-attr]
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=2, norm_type="inf")  # type: ignore[arg-type]
    assert norm.item() == 42.0
    assert plugin.seen == [{"count": 4, "max": 2.0, "type": math.inf}]
    torch.testing.assert_close(model[0].weight.grad, before * 0.5)


def test_a_plugin_returning_no_tensor_is_named() -> None:
    class FloatNorm(BareAccelerator):
        @accel.hookimpl
        def clip_grad_norm_(self) -> float:
            return 1.5

    acc = isolated_registry(FloatNorm("floaty")).get_accelerator("floaty")
    with pytest.raises(accel.PluginError, match="clip_grad_norm_") as info:
        acc.clip_grad_norm_(_model_with_gradients().parameters(), 1.0)
    assert "returned float (1.5); expected a tensor" in str(info.value)
    assert "FloatNorm" in str(info.value) or "floaty" in str(info.value)


@pytest.mark.parametrize(
    ("parameters", "max_norm", "norm_type", "error", "match"),
    [
        ("weights", 1.0, 2.0, TypeError, "expects parameters .* got str"),
        ([torch.zeros(1), 3], 1.0, 2.0, TypeError, "an iterable containing int"),
        (None, 1.0, 2.0, TypeError, "got NoneType"),
        ([], -1.0, 2.0, ValueError, "must be >= 0"),
        ([], math.nan, 2.0, ValueError, "must be >= 0"),
        ([], "1", 2.0, TypeError, "max_norm=...\\) expects a number, got str"),
        ([], 1.0, 0, ValueError, "must be > 0"),
        ([], 1.0, True, TypeError, "norm_type=...\\) expects a number, got bool"),
    ],
)
def test_bad_clipping_arguments_are_refused(
    parameters: Any, max_norm: Any, norm_type: Any, error: type, match: str
) -> None:
    cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
    with pytest.raises(error, match=match):
        cpu.clip_grad_norm_(parameters, max_norm, norm_type)


def test_sharded_gradients_give_the_whole_norm_as_a_plain_tensor(tmp_path: Any) -> None:
    """FSDP2's gradients are DTensors: the norm is reduced to a plain tensor (one rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        mesh = init_device_mesh("cpu", (1,))
        full = torch.tensor([[3.0, 0.0], [0.0, 4.0]])
        param = torch.nn.Parameter(distribute_tensor(torch.zeros(2, 2), mesh, [Shard(0)]))
        param.grad = distribute_tensor(full.clone(), mesh, [Shard(0)])
        cpu = accel.AcceleratorRegistry(entry_points=None).get_accelerator("cpu")
        norm = cpu.clip_grad_norm_([param], max_norm=1.0)
        assert not isinstance(norm, DTensor)
        assert norm.item() == pytest.approx(5.0)
        assert isinstance(param.grad, DTensor)
        torch.testing.assert_close(param.grad.full_tensor(), full / 5.0, rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()
